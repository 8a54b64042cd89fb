"""spaces/llama70b_plan.py: Llama 3.1 70B on v5p-256, one slice or two over DCN, over stage /
fsdp / context / tensor sizes, microbatches, remat with offload, ZeRO-1, gradient accumulation
and vocab tiling; its points build whole configs that the static checks judge, and `--dry-run`
states the size and how many points the static checks remove."""
import os
import re

import fiddle as fdl
import pytest

from paxsearch.search.driver.dryrun import static_message
from paxsearch.search.planning.targets import parse_target
from paxsearch.search.study.space import load_space
from paxsearch.trainer import presets, remat, validate
from paxsearch.trainer.config import from_dict, mesh_shape, to_dict

from ...search_util import REPO, cli

SPACE = os.path.join(REPO, "spaces", "llama70b_plan.py")


@pytest.fixture(scope="module")
def space():
    return load_space(SPACE)


def test_the_decisions_and_the_size(space):
    assert [d.name for d in space.decisions] == ["mesh", "dcn", "microbatches", "schedule", "vocab_tiles",
                                                 "grad_accum_steps", "remat", "zero1"]
    assert space.settings.target == "tpu:v5p-256,slices=auto"
    assert parse_target("tpu:v5p-256").num_devices == 128
    assert space.raw_size() == 47 * 4 * 3 * 2 * 2 * 3 * 5 * 2
    assert 0 < space.size() < space.raw_size()


def test_a_pipelined_two_slice_point_builds_the_whole_config(space):
    point = {"mesh": "4x8x2x2", "dcn": "data", "microbatches": 16, "schedule": "circular", "vocab_tiles": 8,
             "grad_accum_steps": 2, "remat": "offload_input_qkv", "zero1": True}
    cfg = fdl.build(space.config(point))
    assert cfg.model == presets.replace("llama3.1-70b", attention="flash", vocab_tiles=8)
    assert cfg.mesh.ici == mesh_shape(stage=4, fsdp=8, context=2, tensor=2)
    assert cfg.mesh.dcn == mesh_shape(data=2)
    assert (cfg.pipeline.microbatches, cfg.pipeline.repeats, cfg.pipeline.schedule) == (16, 2, "circular")
    assert (cfg.global_batch, cfg.grad_accum_steps, cfg.optimizer.zero1) == (512, 2, True)
    assert remat.parse_custom(cfg.remat) == {**dict.fromkeys(remat.TENSORS, "recompute"),
                                             **dict.fromkeys(("decoder_input", "query_proj", "key_proj",
                                                              "value_proj"), "offload")}
    assert from_dict(to_dict(cfg)) == cfg
    validate.check(cfg, 256, "tpu")  # two slices of 128 chips
    target = parse_target(space.settings.target)
    assert static_message(space, point, target, 1) is None


def test_the_constraint_and_the_static_checks(space):
    target = parse_target(space.settings.target)
    base = {"mesh": "8x16x1x1", "dcn": "stage", "microbatches": 8, "schedule": "gpipe", "vocab_tiles": 1,
            "grad_accum_steps": 1, "remat": "full", "zero1": False}
    # 16 stages over two slices: 8 microbatches are too few; circular repeats need 80 % 32 layers
    assert "microbatches" in static_message(space, base, target, 1)
    assert "n_layers=80" in static_message(space, {**base, "microbatches": 16, "schedule": "circular"}, target, 1)
    # the constraint: ZeRO-1 only with the DCN data axis, one point per mesh without a pipeline
    assert space.excluded({**base, "zero1": True}) and not space.excluded({**base, "zero1": True, "dcn": "data",
                                                                            "mesh": "8x16x1x1"})
    flat = {**base, "mesh": "1x128x1x1", "dcn": "none"}
    assert not space.excluded(flat) and space.excluded({**flat, "microbatches": 16})


def test_cli_dry_run_states_the_size_and_the_points_removed(tmp_path):
    out = cli("run", SPACE, "--dry-run", "--run-dir", tmp_path / "run", timeout=600).stdout
    size = load_space(SPACE).size()
    assert f"size: {size} point(s) (67680 before the constraint)" in out
    assert "plan-only: tpu:v5p-256,slices=auto" in out and "dcn: one of none, data, fsdp, stage" in out
    m = re.search(rf"100 sampled point\(s\): (\d+) pass the static checks, (\d+) invalid; .* of the {size:,} "
                  r"points pass \(95% interval\): the static checks remove about ([\d,]+) of them", out)
    assert m, out[-2000:]
    ok, bad, removed = int(m.group(1)), int(m.group(2)), int(m.group(3).replace(",", ""))
    assert ok + bad == 100 and 0 < bad < 100 and removed == round(size * bad / 100)
    invalid = [line for line in out.splitlines() if line.startswith("  invalid")]
    assert len(invalid) == bad and all(line.endswith(")") and "  (" in line for line in invalid)

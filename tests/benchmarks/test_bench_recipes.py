"""benchmarks/bench_recipes.py without a compile: each recipe's generated one-point space builds
exactly the recipe's nearest config (published.recipe_config), and the report reads a stored
plan (fits, peak / HBM, the compiled breakdown, ratio, plan seconds) or an OOM."""
from __future__ import annotations

import dataclasses

import pytest

from paxsearch.benchmarks import bench_recipes, published
from paxsearch.search.study import configio
from paxsearch.search.study.space import load_space
from paxsearch.trainer import flops

GiB = 2 ** 30


@pytest.mark.parametrize("r", published.RECIPES, ids=lambda r: r.name)
def test_generated_space_is_the_recipes_nearest_config(r, tmp_path):
    path = tmp_path / "space.py"
    path.write_text(bench_recipes.space_text(r, 600))
    space = load_space(str(path))
    assert space.size() == 1 and space.settings.target == r.target
    (point,) = list(space.points())
    cfg = configio.build(space.config(point))
    want = published.recipe_config(r)
    for field in ("model", "remat", "flags", "global_batch", "per_device_batch"):
        assert getattr(cfg, field) == getattr(want, field), field
    assert cfg.mesh.ici == want.mesh.ici and cfg.mesh.rules == want.mesh.rules


def test_report_reads_a_plan_and_an_oom():
    r = published.RECIPES_BY_NAME["v6e-256 Llama3.1-8B"]
    big = published.RECIPES_BY_NAME["v6e-256 Llama3.1-70B"]
    mem = {"argument_bytes": 1 * GiB, "temp_bytes": 20 * GiB, "output_bytes": GiB, "alias_bytes": GiB}
    planned = {"plan": {"predicted_mfu": published.recipe_converted_mfu(r) * 1.1, "fits": True, "peak_bytes": 22 * GiB,
                        "hbm_bytes": 31.25 * GiB, **mem}, "failure_kind": None, "wall_s": 321.0}
    oom = {"plan": None, "failure_kind": "predicted_oom", "failure_message": "predicted OOM: 40 GiB", "wall_s": 99.0}
    text = bench_recipes.report([(r, ""), (big, "")], {r.name: planned, big.name: oom})
    assert "| yes | 22.00 / 31.25 | 1.00 / 20.00 / 1.00 / 1.00 |" in text and "| 1.10 | 321 | planned |" in text
    assert "| **no** |" in text and "predicted_oom: predicted OOM: 40 GiB" in text
    # the analytic state: float32 parameters, gradients and both AdamW moments over the slice
    assert bench_recipes.state_bytes_per_chip(r) == 16 * flops.param_count(published.recipe_model(r)) / 256
    assert f"| {bench_recipes.state_bytes_per_chip(r) / GiB:.2f} |" in text


def test_a_variant_keeps_its_own_name_and_remat():
    r = published.RECIPES_BY_NAME["v6e-256 Llama3.1-8B"]
    named = bench_recipes._Named(r, "full")
    assert named.name == "v6e-256 Llama3.1-8B full" and named.target == r.target
    with pytest.raises(SystemExit, match="name it with --tag"):
        bench_recipes.main(["--set", "remat=full", "--report"])
    assert dataclasses.is_dataclass(published.recipe_config(r))

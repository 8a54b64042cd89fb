"""spaces/memory_knobs_plan.py: every memory knob is a decision, its values land in the
built config (stored and exported whole), and the static checks judge them per platform."""
import os

import fiddle as fdl
import pytest

from paxsearch.search.study.space import load_space
from paxsearch.trainer import validate
from paxsearch.trainer.config import from_dict, to_dict
from paxsearch.trainer.errors import UnsupportedOnPlatform

from ...search_util import REPO

SPACE = os.path.join(REPO, "spaces", "memory_knobs_plan.py")


@pytest.fixture(scope="module")
def space():
    return load_space(SPACE)


def test_every_knob_is_a_decision_and_lands_in_the_config(space):
    names = {d.name for d in space.decisions}
    assert {"grad_accum_steps", "vocab_tiles", "zero1", "offload_state", "offload_params", "remat_qkv",
            "remat_mlp", "remat_decoder_input"} <= names
    point = {**next(space.points()), "mesh": "2x8x1", "grad_accum_steps": 4, "vocab_tiles": 4, "zero1": True,
             "offload_state": False, "offload_params": True, "remat_qkv": "offload", "remat_mlp": "device",
             "remat_decoder_input": "recompute"}
    cfg = fdl.build(space.config(point))
    assert (cfg.grad_accum_steps, cfg.model.vocab_tiles, cfg.optimizer.zero1, cfg.offload_params) == (4, 4, True, True)
    assert cfg.remat == "custom:query_proj=offload,key_proj=offload,value_proj=offload,mlp1=device,mlp2=device"
    assert from_dict(to_dict(cfg)) == cfg  # stored and exported whole
    validate.check(cfg, 16, "tpu")
    with pytest.raises(UnsupportedOnPlatform):
        validate.check(cfg, 16, "cpu")


def test_the_constraint_leaves_out_zero1_without_data(space):
    assert not any(p["zero1"] and (p["mesh"].startswith("1x") or p["offload_state"]) for p in space.points())
    assert space.size() < space.raw_size()

"""The typed plan (store/plan.py): a plan read back from its stored form equals it; stored
plans of older studies (no compiler, no plan_method, keys of another release) still read and
store back key for key. Pure: no JAX."""
from __future__ import annotations

import json

import pytest

from paxsearch.store import compiler
from paxsearch.store.outcome import TrialOutcome
from paxsearch.store.plan import ANALYTIC, CACHE, COMPILED, FIELDS, Plan

NEW = {"jax": "0.10.2", "jaxlib": "0.10.2", "libtpu": "0.0.52"}

# a compiled TPU plan as a study of this release stores it (every key of compilation.plan_point's)
COMPILED_STORED = {
    "target": "tpu:v5e-16", "num_slices": 1, "plan_only": True, "peak_bytes": 14 * 2**30,
    "argument_bytes": 2**30, "output_bytes": 2**30, "temp_bytes": 12 * 2**30, "alias_bytes": 2**30,
    "generated_code_bytes": 4096, "xla_flops_per_step": 1.5e13,
    "flops_source": "optimized HLO, loop trip counts applied",
    "model_flops_per_step": 2.1e14, "param_count": 1_000_000_000, "compile_seconds": 12.5, "global_batch": 64,
    "tokens_per_step": 131072, "num_devices": 16, "device_kind": "TPU v5 lite", "platform": "tpu",
    "mesh_shape": {"data": 1, "stage": 1, "fsdp": 16, "context": 1, "tensor": 1}, "pipeline_bubble": 0.0,
    "hbm_bytes": 16 * 2**30, "fits": True, "ici_mesh": [1, 1, 16, 1, 1], "dcn_mesh": [1, 1, 1, 1, 1],
    "mesh_axes": ["data", "stage", "fsdp", "context", "tensor"], "xla_bytes_accessed_per_step": 3.2e11,
    "peak_flops_per_device": 1.97e14, "predicted": True, "predicted_step_time": 0.71, "predicted_mfu": 0.42,
    "predicted_tokens_per_sec": 184600.0, "roofline": {"predicted": True, "step_time_s": 0.71, "comm_s": 0.1},
    "hlo_source": "as_text", "plan_method": "hlo_passes", "compiler": NEW,
}


def test_every_field_is_a_stored_key_and_the_compiled_plan_round_trips():
    plan = Plan.from_stored(COMPILED_STORED)
    assert set(COMPILED_STORED) <= set(FIELDS) and not plan.extra
    assert plan.peak_bytes == 14 * 2**30 and plan.fits and plan.predicted_mfu == 0.42 and plan.compiler == NEW
    assert plan.ici_mesh == (1, 1, 16, 1, 1) and plan.plan_method == "hlo_passes"
    stored = plan.to_stored()
    assert stored == COMPILED_STORED and list(stored) == list(COMPILED_STORED)  # same keys, values, order
    assert json.dumps(stored) == json.dumps(COMPILED_STORED)  # byte for byte as JSON
    assert Plan.from_stored(stored) == plan


def test_a_new_plan_stored_and_read_back_is_equal():
    plan = Plan.make(target="cpu:8", peak_bytes=10, hbm_bytes=None, fits=True, predicted_step_time=None,
                     ici_mesh=(8, 1, 1, 1, 1), roofline={"predicted": True, "error": "no HLO"},
                     plan_method=ANALYTIC, compiler=compiler.NOT_COMPILED)
    stored = plan.to_stored()
    assert stored["ici_mesh"] == [8, 1, 1, 1, 1] and stored["compiler"] is None and stored["hbm_bytes"] is None
    assert Plan.from_stored(json.loads(json.dumps(stored))) == plan
    # stored Nones stay stored; fields never given are not stored
    assert "predicted_mfu" not in stored and stored["predicted_step_time"] is None


def test_an_old_stored_plan_reads_and_stores_back_what_it_had():
    old = {"peak_bytes": 123, "predicted_mfu": 0.4, "mesh_shape": {"data": 1, "fsdp": 8, "tensor": 1},
           "fits": True, "some_key_of_another_release": [1, 2]}
    plan = Plan.from_stored(old)
    assert plan.compiler == compiler.UNKNOWN and plan.plan_method is None and plan.target is None
    assert compiler.of_plan(plan) == compiler.UNKNOWN
    assert plan.extra == {"some_key_of_another_release": [1, 2]}
    assert plan.to_stored() == old  # no compiler, no plan_method added
    assert Plan.from_stored(None) is None


def test_changed_copies_keep_the_stored_order():
    plan = Plan.from_stored({"peak_bytes": 5, "plan_method": COMPILED, "screen": "x"})
    cached = plan.with_defaults(compiler=NEW, peak_bytes=7).with_(target="tpu:v5e-16", plan_method=CACHE)
    assert list(cached.to_stored()) == ["compiler", "peak_bytes", "plan_method", "screen", "target"]
    assert cached.peak_bytes == 5 and cached.plan_method == CACHE  # defaults never replace
    bare = cached.without("plan_method", "screen")
    assert bare.to_stored() == {"compiler": NEW, "peak_bytes": 5, "target": "tpu:v5e-16"} and bare.screen is None
    with pytest.raises(TypeError):
        Plan.make(no_such_field=1)


def test_the_outcome_stores_its_plan_at_the_boundary():
    outcome = TrialOutcome(plan=Plan.from_stored(COMPILED_STORED), memory_budget={"bytes": 15 * 2**30})
    attrs = outcome.to_user_attrs()
    assert attrs["plan"] == COMPILED_STORED and attrs["memory_bytes"] == 14 * 2**30
    assert attrs["constraint"] == [float(-(2**30))]
    assert TrialOutcome.from_user_attrs(attrs).plan == outcome.plan
    assert TrialOutcome.from_wire(json.loads(json.dumps(outcome.to_wire()))).plan == outcome.plan

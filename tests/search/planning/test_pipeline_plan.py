"""A pipelined config compiles ahead of time for a TPU topology in plan mode (no TPUs): the
stage axis inside a slice (ICI) and across slices (DCN), with fsdp and tensor beside it.
Needs libtpu (the `tpu` extra)."""
import os

from paxsearch.trainer.flagsets import DEVICE_COUNT_FLAG, with_device_count  # noqa: E402  (imports no JAX)

os.environ["JAX_PLATFORMS"] = "cpu"
if DEVICE_COUNT_FLAG not in os.environ.get("XLA_FLAGS", ""):  # conftest sets 8
    os.environ["XLA_FLAGS"] = with_device_count(os.environ.get("XLA_FLAGS"), 8)

import pytest

from paxsearch.search.planning import targets as T
from paxsearch.search.planning.compilation import plan_point
from paxsearch.trainer.config import MeshConfig, ModelConfig, PipelineConfig, TrainConfig, mesh_shape

from ...search_util import needs_libtpu

TINY = ModelConfig(vocab_size=4096, d_model=256, n_layers=4, n_heads=8, head_dim=32, d_ff=1024, seq_len=256,
                   dtype="bfloat16", param_dtype="float32")


@needs_libtpu
@pytest.mark.slow
@pytest.mark.parametrize("target,ici,dcn", [
    ("tpu:v5e-8", mesh_shape(stage=2, fsdp=2, tensor=2), mesh_shape()),
    ("tpu:v5e-4,slices=2", mesh_shape(fsdp=2, tensor=2), mesh_shape(stage=2)),
], ids=["stage-in-slice", "stage-over-dcn"])
def test_pipelined_step_plans_on_a_tpu_topology(target, ici, dcn):
    cfg = TrainConfig(model=TINY, mesh=MeshConfig(ici=ici, dcn=dcn), per_device_batch=4, remat="full",
                      pipeline=PipelineConfig(microbatches=4, repeats=2, schedule="circular"))
    t = T.parse_target(target)
    assert t.plan_only
    program, planned = plan_point(cfg, t)
    plan = planned.to_stored()
    assert plan["mesh_shape"]["stage"] == 2 and plan["fits"] and plan["peak_bytes"] > 0
    assert plan["pipeline_bubble"] == pytest.approx(1 / 9)  # (S-1)/(M R + S - 1)
    assert plan["predicted_step_time"] > 0 and 0 < plan["predicted_mfu"] <= 1
    # the layers' parameters are split over the stage axis
    spec = program.state_shardings["params"]["pipeline"]["layers"]["query"]["kernel"].spec
    assert spec[0] == "stage"

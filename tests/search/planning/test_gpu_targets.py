"""Planning NVIDIA GPU nodes without a GPU (gpu:h100x8, gpu:h200x8): target parsing, the target
description XLA compiles from, the one line and the analytic plan where XLA cannot compile for the
node here, and (slow, with the CUDA plugin: the gpu-plan extra) a real deviceless compile."""
import os

from paxsearch.trainer.flagsets import DEVICE_COUNT_FLAG, with_device_count  # noqa: E402  (imports no JAX)

os.environ["JAX_PLATFORMS"] = "cpu"
if DEVICE_COUNT_FLAG not in os.environ.get("XLA_FLAGS", ""):  # conftest sets 8
    os.environ["XLA_FLAGS"] = with_device_count(os.environ.get("XLA_FLAGS"), 8)

import pytest

from paxsearch.search.planning import gpu_topology as G
from paxsearch.search.planning import targets as T
from paxsearch.search.planning.analytic import analytic_plan, state_bytes
from paxsearch.search.planning.compilation import plan_point
from paxsearch.trainer import flops, hardware
from paxsearch.trainer.config import EvalConfig, MeshConfig, ModelConfig, TrainConfig

from ...search_util import needs_cuda_plugin

SMALL = ModelConfig(vocab_size=4096, d_model=256, n_layers=2, n_heads=4, head_dim=64, d_ff=1024, seq_len=256,
                    dtype="bfloat16", param_dtype="float32", attention="flash")


def _cfg(model=SMALL, batch=16):
    return TrainConfig(model=model, mesh=MeshConfig(ici=(1, 8, 1)), per_device_batch=None, global_batch=batch,
                       remat="minimal", steps=10, eval=EvalConfig(enabled=False))


@pytest.mark.parametrize("text,chip,hbm", [("gpu:h100x8", "h100", 80e9), ("GPU: H200x8", "h200", 141e9)])
def test_gpu_node_targets_parse(text, chip, hbm):
    t = T.parse_target(text)
    assert (t.name, t.platform, t.num_devices, t.chip) == (f"gpu:{chip}x8", "gpu", 8, chip)
    assert t.hbm_bytes_per_device == int(0.75 * hbm)  # JAX's default preallocation (hardware.py)
    assert t.plan_only == (not G.has_gpu_hardware())  # this machine: no GPU, so planned, never run
    assert T.target_env(t)["JAX_PLATFORMS"] == "cpu" if t.plan_only else True
    assert T.parse_target("gpu:8") == T.Target("gpu:8", "gpu", 8)  # the attached GPUs, as before


@pytest.mark.parametrize("text,words", [("gpu:h100x3", "1, 2, 4, 8"), ("gpu:b200x8", "h100, h200"),
                                        ("gpu:h100x8,slices=2", "TPU targets"), ("gpu:h100x8,slices=auto", "TPU")])
def test_bad_gpu_node_is_one_line(text, words):
    with pytest.raises(T.TargetError) as e:
        T.parse_target(text)
    assert "\n" not in str(e.value) and words in str(e.value) and text in str(e.value)


def test_target_description_is_the_chips():
    text = G.target_config("h200")
    h200 = hardware.spec("h200")
    assert "core_count: 132" in text and "cuda_compute_capability { major: 9 minor: 0 }" in text
    assert f"device_memory_size: {int(h200.hbm_bytes.value)}" in text
    assert f"memory_bandwidth: {int(h200.hbm_bandwidth.value)}" in text and '"NVIDIA H200"' in text


def test_without_the_plugin_one_line_and_an_analytic_plan():
    target = T.parse_target("gpu:h100x8")
    notice = T.planning_notice(target)
    if G.plugin_available():
        assert notice is None
    else:
        assert notice is not None and "\n" not in notice and "cannot compile" in notice
        assert "plan_method analytic" in notice and G.GPU_PLAN_EXTRA in notice
        program, planned = plan_point(_cfg(), target)
        plan = planned.to_stored()  # nothing compiled: no Program
        assert program is None and plan["plan_method"] == "analytic" and plan["plan_notice"] == notice
    plan = analytic_plan(_cfg(), target).to_stored()
    h100 = hardware.spec("h100")
    model_flops = flops.model_flops_per_step(SMALL, 16)
    assert plan["model_flops_per_step"] == model_flops and plan["plan_method"] == "analytic"
    assert "compiler" in plan and plan["compiler"] is None  # nothing compiled
    # the weights' matmuls at cuBLAS's measured rate, the causal attention at cuDNN's kernels' rate
    attention = 3 * SMALL.n_layers * 2 * SMALL.seq_len * SMALL.n_heads * SMALL.head_dim * 16 * SMALL.seq_len
    assert flops.attention_flops_per_step(SMALL, 16) == attention
    peak = h100.peak_bf16_flops.value
    step = ((model_flops - attention) / (peak * h100.matmul_efficiency.value)
            + attention / (peak * h100.attention_efficiency.value)) / 8
    assert plan["predicted_step_time"] == pytest.approx(step)
    assert h100.attention_efficiency.value < plan["predicted_mfu"] < h100.matmul_efficiency.value
    need = state_bytes(_cfg(), target)[0]
    assert plan["peak_bytes"] == need and plan["fits"] and "lower bound" in plan["peak_bytes_source"]


@pytest.mark.slow
@needs_cuda_plugin
def test_deviceless_compile_for_h100x8():
    """A real XLA GPU compile for 8 H100s on this CPU machine (no GPU, no CUDA driver)."""
    target = T.parse_target("gpu:h100x8")
    program, planned = plan_point(_cfg(), target)
    plan = planned.to_stored()
    assert plan["plan_method"] == "compiled" and plan["device_kind"] == "NVIDIA H100 80GB HBM3"
    assert plan["platform"] == "gpu" and plan["num_devices"] == 8 and plan["fits"]
    assert 0 < plan["peak_bytes"] < target.hbm_bytes_per_device
    assert plan["roofline"]["hardware"] == "h100" and plan["predicted_step_time"] > 0
    text = program.compiled_step.as_text()
    assert "all-gather" in text or "all-gather-start" in text  # fsdp over the 8 GPUs
    assert "__cudnn$fmha" in text  # flash attention lowered to cuDNN's fused kernel

"""Plan mode: each memory knob compiled for a TPU topology (v5e-4, libtpu, no TPU) against the
same config without it; XLA's per-chip memory moves the way the knob promises. Each plan comes
from the compiler's HLO passes and buffer assignment (search/planning/hlo_passes.py), as a plan-only
study's do by default: their memory is the full compile's (tests/search/planning/test_hlo_passes.py) at a
fraction of its time; the figures in the comments are the full compile's."""
import dataclasses

import pytest

from paxsearch.trainer import remat
from paxsearch.trainer.config import MeshConfig, ModelConfig, TrainConfig

from ..search_util import HAS_LIBTPU

MODEL = ModelConfig(vocab_size=4096, d_model=256, n_layers=2, n_heads=4, head_dim=64, d_ff=1024, seq_len=256,
                    dtype="bfloat16", param_dtype="float32", mlp="gated", activation="silu", position="rope")
# Where the logits and the saved activations are the point: vocabulary 16384 x seq 1024 x 4 rows
# (128 MiB of bfloat16 logits per chip) and 6 layers. Smaller, the TPU compiler holds no logits
# (up to 64 MiB of them it fuses the loss into the unembedding: vocabulary 8192 x seq 512 holds
# 10 MiB of temporaries in all), and at 2 layers the offload's device-side staging buffers cost
# more than the saved tensors it moves (benchmarks/RESULTS.md, bench_memory_knobs.py).
BIG_MODEL = dataclasses.replace(MODEL, vocab_size=16384, seq_len=1024, n_layers=6)
# 2 rows per chip where the batch is not the point (ZeRO-1, offloads and gradient accumulation
# move argument bytes or halve the rows held at once: a TPU compile of 2 rows costs ~2/3 of 4)
BASE = TrainConfig(model=MODEL, mesh=MeshConfig(ici=(4, 1, 1)), per_device_batch=2, remat="full")
BIG = dataclasses.replace(BASE, model=BIG_MODEL, per_device_batch=4)
QKV_INPUT = ("decoder_input", "query_proj", "key_proj", "value_proj")  # MaxText's Llama3.1-70B offloads
VARIANTS = {
    "base": BASE,
    "zero1": dataclasses.replace(BASE, optimizer=dataclasses.replace(BASE.optimizer, zero1=True)),
    "offload_state": dataclasses.replace(BASE, optimizer=dataclasses.replace(BASE.optimizer, offload_state=True)),
    "offload_params": dataclasses.replace(BASE, offload_params=True),
    "big": BIG,
    "vocab_tiles": dataclasses.replace(BIG, model=dataclasses.replace(BIG_MODEL, vocab_tiles=4)),
    "grad_accum": dataclasses.replace(BASE, grad_accum_steps=2),
    "custom_device": dataclasses.replace(BIG, remat=remat.custom(**dict.fromkeys(QKV_INPUT, "device"))),
    "custom_offload": dataclasses.replace(BIG, remat=remat.custom(**dict.fromkeys(QKV_INPUT, "offload"))),
}
_plans: dict = {}


def memory(name):
    """The compiled plan of VARIANTS[name] for v5e-4 (each compiled once per module)."""
    if name not in _plans:
        from paxsearch.search.planning import hlo_passes
        from paxsearch.search.planning import topology as topo

        _plans[name] = hlo_passes.build_plan_program(VARIANTS[name], topo.topology_devices("v5e-4"), "v5e-4").plan
    return _plans[name]




def _param_bytes():
    return 4 * memory("base").param_count


# nine TPU plans from the HLO passes (full compiles: ~10-20 s each on an idle 2-core machine; the figures:
# benchmarks/bench_memory_knobs.py)
pytestmark = [pytest.mark.slow, pytest.mark.tpu,
              pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu is not installed (pip install 'paxsearch[tpu]')")]


def test_zero1_shards_the_moments_over_data():
    base, zero1 = memory("base"), memory("zero1")
    # two float32 moments, 3/4 of each off every chip (data = 4)
    assert base.memory.argument_bytes - zero1.memory.argument_bytes > 0.9 * 2 * _param_bytes() * 3 / 4
    assert zero1.peak_bytes < base.peak_bytes
    assert zero1.model_flops_per_step == base.model_flops_per_step


def test_offloaded_moments_leave_the_device_between_steps():
    base, off = memory("base"), memory("offload_state")
    assert base.memory.argument_bytes - off.memory.argument_bytes > 0.95 * 2 * _param_bytes()
    assert off.peak_bytes < base.peak_bytes  # measured: -1.1% (the update brings the moments in)


def test_offloaded_params_leave_the_arguments_between_steps():
    base, off = memory("base"), memory("offload_params")
    assert base.memory.argument_bytes - off.memory.argument_bytes > 0.95 * _param_bytes()
    # the step brings them back to compute: the peak within the step stays (measured: -3.0%)
    assert off.peak_bytes < 1.01 * base.peak_bytes


def test_vocab_tiling_never_holds_the_whole_logits():
    base, tiled = memory("big"), memory("vocab_tiles")
    logits = 4 * 1024 * 16384 * 2  # rows x S x V bfloat16 per chip: 128 MiB
    assert base.memory.temp_bytes > logits  # measured: 158.5 MiB of temporaries
    assert base.memory.temp_bytes - tiled.memory.temp_bytes > logits / 2  # measured: 103.4 MiB less
    assert tiled.peak_bytes < base.peak_bytes


def test_gradient_accumulation_holds_fewer_activations():
    base, accum = memory("base"), memory("grad_accum")
    assert accum.memory.temp_bytes < base.memory.temp_bytes
    assert accum.model_flops_per_step == base.model_flops_per_step


def test_custom_remat_keeps_what_it_names_on_device_or_offloads_it():
    full, device, offload = memory("big"), memory("custom_device"), memory("custom_offload")
    # saves layer inputs and q/k/v on the chip (measured: 158.5 -> 230.7 MiB of temporaries)
    assert device.memory.temp_bytes > full.memory.temp_bytes
    # the same saved set in host memory (measured: 187.3 MiB on the chip, 84 MiB on the host)
    assert offload.memory.temp_bytes < device.memory.temp_bytes
    assert offload.memory.host_temp_bytes > 0 == device.memory.host_temp_bytes
    assert offload.peak_bytes < device.peak_bytes


def test_the_passes_count_offloaded_arguments_as_the_full_compile_does():
    """Moments and parameters in host memory are no HBM arguments nor outputs, in the HLO passes'
    buffer assignment as in the full compile's memory analysis (one full compile of each)."""
    from paxsearch.search.planning import topology as topo
    from paxsearch.trainer.plan import build_program

    for name in ("offload_state", "offload_params"):
        passes = memory(name).memory
        full = build_program(VARIANTS[name], topo.topology_devices("v5e-4"), count_flops=False).plan.memory
        assert (passes.argument_bytes, passes.output_bytes, passes.alias_bytes) == (
            full.argument_bytes, full.output_bytes, full.alias_bytes), name
        assert passes.temp_bytes <= full.temp_bytes < passes.temp_bytes + (64 << 10)

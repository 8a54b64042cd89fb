"""The Pallas splash-attention kernels' FLOPs are priced at the rate those kernels were measured to
run at (Hardware.attention_efficiency, trainer/hardware.py), every other op's at the matmul rate.
The one measured chip is v6e: MaxText's own XProf profile on v6e-8 gives jax's splash kernels' time
per layer and step at one attention shape; their FLOPs, counted from the kernels that ran, put them
at 30.9% of peak, under half what XLA's own large matmul sustains there (79.3%). Two other trainers'
profiles at the same shape, running tokamax's faster variant of the kernel, check the figure.
Chips with no measurement keep their matmul rate, and say so."""
import dataclasses

import jax
import jax.numpy as jnp
import pytest

from paxsearch.trainer import attention as A
from paxsearch.trainer import hardware, topology
from paxsearch.trainer import roofline as R
from paxsearch.trainer.predict import hardware_for

from ..search_util import needs_libtpu

# the profiles' shape: batch 3 per chip, S 8192, 32 query heads x 128, causal
B, S, H, D = 3, 8192, 32, 128
PEAK_V6E = 918e12


def _kernel_flops_per_layer_step() -> float:
    """FLOPs of the splash kernels the profiled runs executed per layer and step: the forward (2 S x S
    matmuls) twice, once more in the backward pass (remat), and the fused dK/dV/dQ kernel (5 matmuls),
    each over the blocks the causal mask leaves: 10 of 16 at block 2048 (the tokamax runs' forward,
    2048 x 1024 blocks, computes 20 of 32: the same share)."""
    one = 2.0 * S * S * D * H * B  # one S x S matmul over every block, all heads and rows
    n = S // 2048
    assert sum(2 * (i + 1) for i in range(n)) / (n * 2 * n) == sum(i + 1 for i in range(n)) / n ** 2 == 0.625
    return (2 + 2 + 5) * one * 0.625


def test_v6e_attention_efficiency_is_the_profiles_arithmetic():
    fig = hardware.TABLE["v6e"].attention_efficiency
    assert fig is not None and fig.source.startswith("derived from MaxText's own XProf profile")
    flops = _kernel_flops_per_layer_step()
    assert flops == pytest.approx(9.277e12, rel=1e-3)
    maxtext = 1.177 / 36  # MaxText, jax's splash: 1,177 ms of splash per step and chip, 36 layers
    assert round(flops / maxtext / PEAK_V6E, 3) == fig.value == 0.309
    # tokamax's variant of the kernel (exp2, fused reciprocal, constant max logit), two trainers
    llama = 0.816 / 32  # 'Splash MHA (fwd + dkv bwd) 816 ms' per step and chip, 32 layers
    qwen = (10_416 + 11_641) * 1e-3 / (3 * 8) / 36  # fwd + dkv over 3 steps x 8 chips, 36 layers
    assert llama == pytest.approx(qwen, rel=0.005)  # two models, one kernel time per layer
    assert round(flops / llama / PEAK_V6E, 3) == 0.396
    # which their ablations put ~1.24x faster than jax's kernel (1,010 -> 816 ms): 32%, near MaxText's
    assert 0.396 / 1.24 == pytest.approx(fig.value, rel=0.04)
    # under half the rate XLA's own large matmul was measured at on the same chip
    assert fig.value < hardware.TABLE["v6e"].matmul_efficiency.value / 2


def test_chips_without_a_measurement_keep_their_matmul_rate():
    for name in ("v4", "v5e", "v5p"):
        entry = hardware.TABLE[name]
        assert entry.attention_efficiency.source.startswith("assumption:")
        assert entry.attention_efficiency.value == entry.matmul_efficiency.value
    for name in ("a100", "h100", "h200"):  # no splash kernels on GPUs
        assert hardware.TABLE[name].attention_efficiency is None
    hw = hardware_for([], "v5e")
    assert hw.sustained_attention_flops == hw.sustained_flops
    assert R.Hardware("x", 1e12, 1e9, 1e9, 1e9, matmul_efficiency=0.5).sustained_attention_flops == 0.5e12
    v6e = hardware_for([], "v6e")
    assert v6e.sustained_attention_flops == pytest.approx(0.309 * PEAK_V6E)


@pytest.fixture(scope="module")
def v6e_attention_step():
    """The optimized HLO of one splash attention's forward and backward, compiled for one v6e chip."""
    device = topology.topology_devices("v6e-4")[0]
    one = jax.sharding.SingleDeviceSharding(device)
    s, h, d = 1024, 4, 128
    q = jax.ShapeDtypeStruct((1, s, h, d), jnp.bfloat16, sharding=one)
    seg = jax.ShapeDtypeStruct((1, s), jnp.int32, sharding=one)

    def loss(q, k, v, seg):
        return jnp.sum(A.splash(q, k, v, seg).astype(jnp.float32))

    step = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    return step.lower(q, q, q, seg).compile().as_text(), device


@needs_libtpu
def test_splash_kernels_are_priced_at_the_attention_rate(v6e_attention_step):
    text, device = v6e_attention_step
    hw = hardware_for([device])
    assert hw.name == "v6e" and hw.attention_efficiency == 0.309
    module = R.parse_module(text)
    times = R.call_graph(module).multiplier
    kernels = [(c, i) for c in module.computations.values() for i in c.instrs if R.splash_flops(c, i)]
    assert {n for _, i in kernels for n, _ in R.SPLASH_MATMULS if n in i.name} == {
        "splash_mha_fwd", "splash_mha_dkv", "splash_mha_dq"}
    splash = sum(R.splash_flops(c, i) * times.get(c.name, 0) for c, i in kernels)
    roof = R.analyze(text, hw, num_devices=1)
    other = roof.flops_per_step - splash
    assert splash > 0 and roof.compute_s == pytest.approx(other / hw.sustained_flops
                                                         + splash / hw.sustained_attention_flops, rel=1e-9)
    # the same module at the matmul rate throughout (the pricing before the v6e profiles)
    flat = R.analyze(text, dataclasses.replace(hw, attention_efficiency=None), num_devices=1)
    assert roof.compute_s - flat.compute_s == pytest.approx(
        splash / hw.sustained_attention_flops - splash / hw.sustained_flops, rel=1e-9)
    assert roof.step_time_s > flat.step_time_s

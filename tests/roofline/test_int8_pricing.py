"""int8 matmuls priced at the chip's int8 rate (search/planning/roofline/cost.py int8_matmul, flop_rate;
trainer/hardware.py peak_int8_ops): on TPU v5e, v5p and v6e an s8 x s8 -> s32 matmul runs at twice the bf16
peak (the project's v5e ran an int8 8192^3 at 379.5 TOP/s, 0.966 of 393, against bf16's 0.949 of 197), so
the roofline prices its FLOPs at Hardware.int8_speedup x the matmul rate; a chip without an int8 figure
prices them at the bf16 rate."""
import dataclasses

import jax
import jax.numpy as jnp
import pytest

from paxsearch.search.planning import roofline as R
from paxsearch.search.planning.predict import hardware_for
from paxsearch.trainer import hardware, quant


def _dot_module(dtype: str, out: str) -> str:
    return f"""HloModule m, is_scheduled=true

ENTRY %main (a: {dtype}[8192,8192], b: {dtype}[8192,8192]) -> {out}[8192,8192] {{
  %a = {dtype}[8192,8192]{{1,0}} parameter(0)
  %b = {dtype}[8192,8192]{{1,0}} parameter(1)
  ROOT %dot = {out}[8192,8192]{{1,0}} dot(%a, %b), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
}}
"""


def test_the_int8_peaks_are_the_product_pages():
    for name, ratio in (("v5e", 393 / 197), ("v5p", 2.0), ("v6e", 2.0)):
        entry = hardware.TABLE[name]
        assert entry.peak_int8_ops.value / entry.peak_bf16_flops.value == pytest.approx(ratio, rel=1e-9)
        assert entry.peak_int8_ops.source.startswith("https://cloud.google.com/tpu/docs/")
        assert hardware_for([], name).int8_speedup == pytest.approx(ratio)
    assert hardware.TABLE["v4"].peak_int8_ops is None and hardware_for([], "v4").int8_speedup == 1.0


def test_an_int8_matmul_runs_at_the_int8_rate_and_a_bf16_one_at_the_bf16_rate():
    hw = hardware_for([], "v5e")
    flops = 2 * 8192 ** 3
    bf16 = R.analyze(_dot_module("bf16", "bf16"), hw, num_devices=1)
    int8 = R.analyze(_dot_module("s8", "s32"), hw, num_devices=1)
    assert bf16.flops_per_step == int8.flops_per_step == flops
    assert bf16.compute_s == pytest.approx(flops / hw.sustained_flops, rel=1e-9)
    assert int8.compute_s == pytest.approx(flops / (hw.sustained_flops * 393 / 197), rel=1e-9)
    without = R.analyze(_dot_module("s8", "s32"), dataclasses.replace(hw, int8_speedup=1.0), num_devices=1)
    assert without.compute_s == pytest.approx(bf16.compute_s, rel=1e-9)


def test_the_trainers_quantized_projection_compiles_to_matmuls_the_roofline_prices_as_int8():
    """trainer/quant.py's int8 projection, compiled by XLA (here XLA:CPU): its forward matmul is found in
    the optimized module (inside whatever fusion holds it) and priced at the int8 rate."""
    x = jnp.ones((256, 512), jnp.bfloat16)
    w = jnp.ones((512, 1024), jnp.float32)
    text = jax.jit(lambda x, w: quant.tensordot(x, w, 1, "int8")).lower(x, w).compile().as_text()
    hw = hardware_for([], "v5e")
    fast = R.analyze(text, hw, num_devices=1)
    slow = R.analyze(text, dataclasses.replace(hw, int8_speedup=1.0), num_devices=1)
    assert fast.flops_per_step >= 2 * 256 * 512 * 1024
    assert fast.compute_s < slow.compute_s

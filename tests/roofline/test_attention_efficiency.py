"""The Pallas splash-attention kernels' FLOPs are priced at the rate those kernels were measured to
run at (Hardware.attention_efficiency, trainer/hardware.py), every other op's at the matmul rate.
The one measured TPU is v6e: MaxText's own XProf profile on v6e-8 gives jax's splash kernels' time
per layer and step at one attention shape; their FLOPs, counted from the kernels that ran, put them
at 30.9% of peak, under half what XLA's own large matmul sustains there (79.3%). Two other trainers'
profiles at the same shape, running tokamax's faster variant of the kernel, check the figure.
On GPUs the kernels are cuDNN's flash attention (`__cudnn$fmha...` custom calls), which XLA does not
count either: their FLOPs come from the score shape in their backend_config, priced at cuDNN's own
benchmark of the kernels on H200 (50.8%). v5e's is fit to the half-a points of the project's own chip
(benchmarks/calibrate_onchip.py: 51.0% at head dim 128; a splash kernel of head dim 64 at half of it); the
chip's own per-kernel rates (forward, dK/dV, dQ by block and seq, hardware.V5E_SPLASH_RATES) price a kernel
by its sequence and block where a Hardware carries them; since the chip's run 3 the v5e entry prices them by
the grid (hardware.V5E_SPLASH_GRID: also by head dim, query heads per K/V head and batch x K/V heads).
Chips with no measurement keep their matmul rate, and say so."""
import dataclasses
import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from paxsearch.search.planning import roofline as R
from paxsearch.search.planning import topology
from paxsearch.search.planning.predict import hardware_for
from paxsearch.trainer import attention as A
from paxsearch.trainer import hardware

from ..search_util import needs_cuda_plugin, needs_libtpu

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
    for name in ("v4", "v5p"):
        entry = hardware.TABLE[name]
        assert entry.attention_efficiency.source.startswith("assumption:")
        assert entry.attention_efficiency.value == entry.matmul_efficiency.value
    a100 = hardware.TABLE["a100"]  # no measurement of cuDNN's kernels on A100 traced
    assert a100.attention_efficiency.source.startswith("assumption:")
    assert a100.attention_efficiency.value == a100.matmul_efficiency.value
    hw = hardware_for([], "v5p")
    assert hw.sustained_attention_flops == hw.sustained_flops
    assert R.Hardware("x", 1e12, 1e9, 1e9, 1e9, matmul_efficiency=0.5).sustained_attention_flops == 0.5e12
    v6e = hardware_for([], "v6e")
    assert v6e.sustained_attention_flops == pytest.approx(0.309 * PEAK_V6E)


def test_v5e_attention_efficiency_is_fit_to_the_chips_half_a_points_only():
    """v5e's figure is the on-chip benchmark's fit (benchmarks/calibrate_onchip.py): the share of peak that
    gives the half-a points of spaces/onchip_v5e.py the least mean |error|; half b is held out."""
    fig = hardware.TABLE["v5e"].attention_efficiency
    assert fig.value == 0.510 and "half-a points of the on-chip benchmark" in fig.source
    assert "held out" in fig.source and "calibrate_onchip.py" in fig.source
    assert fig.value < hardware.TABLE["v5e"].matmul_efficiency.value


def _splash_module(head_dim: int) -> str:
    """One splash forward kernel over q (1, 4, 2048, head_dim): the FLOPs' shape and the head dim."""
    return f"""HloModule m, is_scheduled=true

ENTRY %main (q: bf16[1,4,2048,{head_dim}], k: bf16[1,4,2048,{head_dim}]) -> bf16[1,4,2048,{head_dim}] {{
  %q = bf16[1,4,2048,{head_dim}]{{3,2,1,0}} parameter(0)
  %k = bf16[1,4,2048,{head_dim}]{{3,2,1,0}} parameter(1)
  ROOT %splash_mha_fwd_residuals.1 = bf16[1,4,2048,{head_dim}]{{3,2,1,0}} custom-call(%q, %k), custom_call_target="tpu_custom_call"
}}
"""


def test_a_splash_kernel_below_the_figures_head_dim_runs_at_its_share_of_the_mxu():
    """QK^T contracts over the head dim and PV writes head-dim columns: at head dim 64 a kernel fills half
    of the 128-wide MXU the figure was set at (128), so its FLOPs run at half the attention rate; at 128
    and above, the rate itself; with attention_head_dim None, every head dim at the rate."""
    hw = dataclasses.replace(hardware_for([], "v5e"), attention_rates=(), attention_grid=())  # one rate for all
    assert hw.attention_head_dim == 128
    for d, share in ((64, 0.5), (128, 1.0), (256, 1.0)):
        text = _splash_module(d)
        roof = R.analyze(text, hw, num_devices=1)
        assert roof.flops_per_step > 0
        assert roof.compute_s == pytest.approx(roof.flops_per_step / (hw.sustained_attention_flops * share), rel=1e-9)
        flat = R.analyze(text, dataclasses.replace(hw, attention_head_dim=None), num_devices=1)
        assert flat.compute_s == pytest.approx(roof.flops_per_step / hw.sustained_attention_flops, rel=1e-9)


CHIP_FIGURES = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "chip_figures_v5e_2026-12-07.json"


def test_v5e_splash_rates_are_the_chips_own_measurement():
    """hardware.V5E_SPLASH_RATES is the chip's record (benchmarks/chip_figures.py, run 1): per kernel,
    block and seq, the kernels' share of peak, heads 8 and 16 (and the forward's forward-only and
    forward + backward runs) averaged, to 3 decimals; each figure names its source."""
    cases = json.loads(CHIP_FIGURES.read_text())["sections"]["splash"]["cases"]
    runs = {}
    for case in cases:
        assert case["head_dim"] == 128 and case["causal"]
        for kernel, k in case["kernels"].items():
            runs.setdefault((kernel, case["block"], case["seq"]), []).append(k["efficiency"])
    rates = {(r.kernel, r.block, r.seq): r.share for r in hardware.V5E_SPLASH_RATES}
    assert set(rates) == set(runs) and len(rates) == 3 * 2 * 4
    for key, shares in runs.items():
        assert rates[key].value == pytest.approx(sum(shares) / len(shares), abs=5e-4), key
        assert "chip_figures_v5e_2026-12-07.json" in rates[key].source
        assert "benchmarks/chip_figures.py" in rates[key].source
    # the entry prices the splash kernels at these since run 2 (benchmarks/RESULTS.md, "The v5e entry from the
    # chip's own figures"); the half-a fit stays only for a kernel without a row
    assert hardware.TABLE["v5e"].attention_rates == hardware.V5E_SPLASH_RATES
    assert hardware_for([], "v5e").attention_rates == hardware.attention_table(hardware.V5E_SPLASH_RATES)
    assert "V5E_SPLASH_RATES" in hardware.TABLE["v5e"].attention_efficiency.source


def _v5e_measured() -> R.Hardware:
    return dataclasses.replace(hardware_for([], "v5e"), attention_grid=(), attention_step_grid=(),
                               attention_rates=hardware.attention_table(hardware.V5E_SPLASH_RATES))


def test_the_splash_rate_follows_the_measured_table_in_log2_seq_and_holds_outside_it():
    hw = _v5e_measured()
    table = {(r.kernel, r.block, r.seq): r.share.value for r in hardware.V5E_SPLASH_RATES}
    for (kernel, block, seq), share in table.items():
        assert hw.attention_share(kernel + "_segmented_residuals.3", seq, block) == pytest.approx(share)
    # between two measured sequences: linear in log2(seq); 2896 ~ halfway from 2048 to 4096
    mid = hw.attention_share("splash_mha_dkv_no_residuals", 2896, 512)
    halfway = (table[("splash_mha_dkv", 512, 2048)] + table[("splash_mha_dkv", 512, 4096)]) / 2
    assert mid == pytest.approx(halfway, abs=1e-4)
    # outside 1k-8k: the nearest end
    assert hw.attention_share("splash_mha_fwd", 512, 512) == table[("splash_mha_fwd", 512, 1024)]
    assert hw.attention_share("splash_mha_dq", 32768, 512) == table[("splash_mha_dq", 512, 8192)]
    # a block below 512 (the sequence not divisible by it) gets the measured block-128 rate, a larger
    # one or an unknown one block 512's
    assert hw.attention_share("splash_mha_fwd", 2048, 256) == table[("splash_mha_fwd", 128, 2048)]
    assert hw.attention_share("splash_mha_fwd", 2048, 64) == table[("splash_mha_fwd", 128, 2048)]
    assert hw.attention_share("splash_mha_fwd", 2048, 2048) == table[("splash_mha_fwd", 512, 2048)]
    assert hw.attention_share("splash_mha_fwd", 2048) == table[("splash_mha_fwd", 512, 2048)]
    assert hw.attention_share("some_other_kernel", 2048, 512) is None
    assert R.Hardware("x", 1, 1, 1, 1).attention_rates == ()  # no table entry of that name: no rows


def _masked_splash(kernel: str, seq: int, blocks: int, head_dim: int = 128) -> str:
    """One splash kernel whose first operand is the mask's block map (1, blocks, blocks), as the
    trainer's kernels have it (S / blocks is the block)."""
    q = f"bf16[1,4,{seq},{head_dim}]"
    return f"""HloModule m, is_scheduled=true

ENTRY %main (m: s8[1,{blocks},{blocks}], q: {q}, k: {q}) -> {q} {{
  %m = s8[1,{blocks},{blocks}]{{2,1,0}} parameter(0)
  %q = {q}{{3,2,1,0}} parameter(1)
  %k = {q}{{3,2,1,0}} parameter(2)
  ROOT %{kernel}.1 = {q}{{3,2,1,0}} custom-call(%m, %q, %k), custom_call_target="tpu_custom_call"
}}
"""


def test_each_splash_kernel_is_priced_at_its_measured_rate_for_its_seq_and_block():
    """With the measured table, a kernel's FLOPs run at its own row's share for the HLO's sequence and
    block (read from the mask's block map), d / 128 of it at head dim d < 128; without it, at the one
    figure."""
    hw = _v5e_measured()
    table = {(r.kernel, r.block, r.seq): r.share.value for r in hardware.V5E_SPLASH_RATES}
    for kernel in ("splash_mha_fwd_residuals", "splash_mha_dkv_no_residuals", "splash_mha_dq_no_residuals"):
        row = next(k for k in ("splash_mha_fwd", "splash_mha_dkv", "splash_mha_dq") if kernel.startswith(k))
        for seq, blocks, block, d in ((2048, 4, 512, 128), (2048, 16, 128, 128), (8192, 16, 512, 128),
                                      (4096, 8, 512, 64)):
            roof = R.analyze(_masked_splash(kernel, seq, blocks, d), hw, num_devices=1)
            assert roof.flops_per_step > 0
            share = table[(row, block, seq)] * min(1.0, d / 128)
            assert roof.compute_s == pytest.approx(roof.flops_per_step / (hw.peak_flops * share), rel=1e-9)
        flat = dataclasses.replace(hw, attention_rates=())
        roof = R.analyze(_masked_splash(kernel, 2048, 4), flat, num_devices=1)
        assert roof.compute_s == pytest.approx(roof.flops_per_step / flat.sustained_attention_flops, rel=1e-9)


def test_v5e_splash_grid_is_the_chips_records():
    """hardware.V5E_SPLASH_GRID is chip_figures.splash_grid over the records it names (runs 1-4), and the v5e
    entry prices the splash kernels by it."""
    from paxsearch.benchmarks import chip_figures

    cases = [c for name in chip_figures.SPLASH_GRID_RECORDS
             for c in json.loads((CHIP_FIGURES.parent / name).read_text())["sections"]["splash"]["cases"]]
    grid = {(r.kernel, r.block, r.head_dim, r.group, r.seq, r.kv_rows): r.share.value for r in hardware.V5E_SPLASH_GRID}
    assert grid == chip_figures.splash_grid(cases) and len(grid) == 144
    assert hardware.TABLE["v5e"].attention_grid == hardware.V5E_SPLASH_GRID
    assert all("chip_figures.py" in r.share.source for r in hardware.V5E_SPLASH_GRID)
    # what the grid holds that the seq-only table averaged away: 3 query heads per K/V head run slower, and so
    # does a larger batch x K/V heads
    assert grid[("splash_mha_dq", 512, 128, 3, 2048, 64)] < 0.9 * grid[("splash_mha_dq", 512, 128, 2, 2048, 64)]
    assert grid[("splash_mha_dkv", 512, 128, 2, 2048, 64)] < 0.95 * grid[("splash_mha_dkv", 512, 128, 2, 2048, 32)]


def test_the_grid_share_interpolates_in_batch_x_kv_heads_then_seq():
    hw = hardware_for([], "v5e")
    g = {(r.kernel, r.block, r.head_dim, r.group, r.seq, r.kv_rows): r.share.value for r in hardware.V5E_SPLASH_GRID}
    for (kernel, block, d, group, seq, rows), share in g.items():
        assert hw.grid_share(kernel + "_no_residuals.2", seq, block, d, group, rows) == (pytest.approx(share), d)
    # between the measured batch x K/V heads 32 and 64 (group 2, head dim 128, seq 2048): linear in log2
    lo, hi = g[("splash_mha_dkv", 512, 128, 2, 2048, 32)], g[("splash_mha_dkv", 512, 128, 2, 2048, 64)]
    mid, _ = hw.grid_share("splash_mha_dkv", 2048, 512, 128, 2, 45)
    assert mid == pytest.approx(lo + (hi - lo) * math.log2(45 / 32), rel=1e-9)
    assert hw.grid_share("splash_mha_dkv", 2048, 512, 128, 2, 4)[0] == lo  # held below the smallest
    # MHA is filed with group 2; an unmeasured group takes the nearest (4 -> 3); an unmeasured head dim the
    # head-dim-128 rows (the caller scales them by d / 128)
    assert hw.grid_share("splash_mha_dq", 2048, 512, 128, 1, 64) == hw.grid_share("splash_mha_dq", 2048, 512, 128,
                                                                                    2, 64)
    assert hw.grid_share("splash_mha_dq", 2048, 512, 128, 4, 64) == hw.grid_share("splash_mha_dq", 2048, 512, 128,
                                                                                    3, 64)
    assert hw.grid_share("splash_mha_dq", 2048, 512, 96, 2, 64)[1] == 128
    assert hw.grid_share("other_kernel", 2048, 512, 128, 2, 64) is None


def test_a_group_measured_at_one_batch_follows_the_pooled_trend_outside_it():
    """A group measured at one batch x K/V heads per seq (group 3 at head dim 128 as run 3 had it: 16 at seq 8192):
    below it, its share moves as the pooled group 2's does over the same span. Run 4 measured that group at 4 and
    8 too: the trend had the forward and dK/dV kernels 10% slow there, dQ within 1%."""
    grid = hardware.V5E_SPLASH_GRID
    run4 = {1024: 32, 2048: 16, 4096: 8, 8192: 4}  # group 3, head dim 128: the seq's batch x K/V heads run 4 added
    full = hardware_for([], "v5e")
    hw = dataclasses.replace(full, attention_grid=tuple(
        (k, blk, d, grp, tuple((seq, tuple(p for p in pts if (d, grp) != (128, 3) or p[0] != run4[seq]))
                               for seq, pts in by_seq))
        for k, blk, d, grp, by_seq in full.attention_grid))
    g = {(r.kernel, r.block, r.head_dim, r.group, r.seq, r.kv_rows): r.share.value for r in grid}
    at16 = g[("splash_mha_dkv", 512, 128, 3, 8192, 16)]
    p8, p16 = g[("splash_mha_dkv", 512, 128, 2, 8192, 8)], g[("splash_mha_dkv", 512, 128, 2, 8192, 16)]
    assert hw.grid_share("splash_mha_dkv", 8192, 512, 128, 3, 8)[0] == pytest.approx(at16 * p8 / p16)
    assert hw.grid_share("splash_mha_dkv", 8192, 512, 128, 3, 4)[0] == pytest.approx(at16 * p8 / p16)  # held
    assert hw.grid_share("splash_mha_dkv", 8192, 512, 128, 3, 16)[0] == pytest.approx(at16)
    for kernel, lo, hi in (("splash_mha_fwd", 0.85, 0.92), ("splash_mha_dkv", 0.85, 0.92), ("splash_mha_dq", 0.97, 1.0)):
        trend, measured = hw.grid_share(kernel, 8192, 512, 128, 3, 4)[0], g[(kernel, 512, 128, 3, 8192, 4)]
        assert full.grid_share(kernel, 8192, 512, 128, 3, 4)[0] == pytest.approx(measured)
        assert lo < trend / measured < hi


def _gqa_splash(kernel: str, b: int, h: int, kv: int, seq: int, d: int) -> str:
    q, k = f"bf16[{b},{h},{seq},{d}]", f"bf16[{b},{kv},{seq},{d}]"
    blocks = seq // 512
    return f"""HloModule m, is_scheduled=true

ENTRY %main (m: s8[1,{blocks},{blocks}], q: {q}, k: {k}, s: s32[{b},{seq},128]) -> {q} {{
  %m = s8[1,{blocks},{blocks}]{{2,1,0}} parameter(0)
  %q = {q}{{3,2,1,0}} parameter(1)
  %k = {k}{{3,2,1,0}} parameter(2)
  %s = s32[{b},{seq},128]{{2,1,0}} parameter(3)
  ROOT %{kernel}.1 = {q}{{3,2,1,0}} custom-call(%m, %q, %k, %s), custom_call_target="tpu_custom_call"
}}
"""


def test_a_gqa_splash_kernel_is_priced_by_its_group_and_batch_x_kv_heads():
    """The K/V operand's heads give the group (query heads per K/V head) and batch x K/V heads the grid is
    read at (the segment ids, rank 3, are not a K/V operand)."""
    hw = dataclasses.replace(hardware_for([], "v5e"), attention_step_grid=())
    for b, h, kv, seq, d in ((16, 12, 4, 2048, 64), (4, 8, 8, 2048, 128), (16, 12, 4, 2048, 128), (2, 16, 8, 8192, 96)):
        roof = R.analyze(_gqa_splash("splash_mha_dq_no_residuals", b, h, kv, seq, d), hw, num_devices=1)
        share, measured = hw.grid_share("splash_mha_dq", seq, 512, d, h // kv, b * kv)
        rate = hw.peak_flops * share * min(d, measured) / measured / hw.grid_in_step("splash_mha_dq")
        assert roof.compute_s == pytest.approx(roof.flops_per_step / rate, rel=1e-9)
    assert hw.grid_in_step("splash_mha_dq") > 1.0  # the dQ kernels ran longer in the chip's steps than alone


def test_inside_the_steps_measured_shapes_a_splash_kernel_is_priced_at_its_rate_there():
    """The v5e entry prices a splash kernel at the share the chip's profiled steps measured for its kernel, block,
    head dim and group (V5E_SPLASH_STEP_GRID) where its seq is one they ran and its batch x K/V heads lies between
    theirs; anywhere else at the grid measured alone times the kind's in-step factor: no extrapolation from a
    few steps' shapes (read beyond them, a seq of 8k at 3 query heads per K/V head came out 6-8% fast)."""
    hw = hardware_for([], "v5e")
    step = {(r.kernel, r.block, r.head_dim, r.group, r.seq, r.kv_rows): r.share.value
            for r in hardware.V5E_SPLASH_STEP_GRID}
    for (kernel, block, d, group, seq, rows), share in step.items():
        assert hw.step_grid_share(kernel + "_no_residuals.2", seq, block, d, group, rows) == pytest.approx(share)
    # dQ at head dim 64, 3 query heads per K/V head, batch x K/V heads 8: 0.253 of peak in a step, 0.367 alone
    roof = R.analyze(_gqa_splash("splash_mha_dq_no_residuals", 2, 12, 4, 2048, 64), hw, num_devices=1)
    assert roof.compute_s == pytest.approx(roof.flops_per_step / (hw.peak_flops * 0.253), rel=1e-9)
    # between two measured batch x K/V heads: linear in log2; MHA filed with group 2
    lo, hi = step[("splash_mha_dkv", 512, 128, 2, 2048, 16)], step[("splash_mha_dkv", 512, 128, 2, 2048, 24)]
    assert hw.step_grid_share("splash_mha_dkv", 2048, 512, 128, 1, 20) == pytest.approx(
        lo + (hi - lo) * math.log2(20 / 16) / math.log2(24 / 16))
    # outside: a seq the steps never ran, a batch x K/V heads beyond theirs, another block or head dim
    for args in ((16384, 512, 128, 3, 8), (2048, 512, 64, 3, 64), (2048, 256, 64, 2, 32), (2048, 512, 96, 2, 16)):
        assert hw.step_grid_share("splash_mha_dq", *args) is None
    roof = R.analyze(_gqa_splash("splash_mha_dq_no_residuals", 2, 12, 4, 16384, 128), hw, num_devices=1)
    share, _ = hw.grid_share("splash_mha_dq", 16384, 512, 128, 3, 8)
    rate = hw.peak_flops * share / hw.grid_in_step("splash_mha_dq")
    assert roof.compute_s == pytest.approx(roof.flops_per_step / rate, rel=1e-9)


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


# ----------------------------------------------------------------------------- GPU: cuDNN flash attention

CUDNN_HLO = Path(__file__).parent / "data" / "cudnn_attention_h100.hlo"
CUDNN = dict(b=2, s=1024, h=8, kvh=2, d=128)  # the shapes tests/roofline/data/cudnn_attention_h100.hlo was built at


def _cudnn_kernel_flops(b, s, h, d, **_):
    """cuDNN's own count (cudnn-frontend benchmark/sdpa_benchmark_training): 2 x (d_qk + d_v) per score
    forward, 2 x (3 d_qk + 2 d_v) backward, over the S (S + 1) / 2 scores a causal mask leaves."""
    scores = s * (s + 1) / 2
    return 2 * b * h * scores * (2 * d), 2 * b * h * scores * (5 * d)


def test_h100_and_h200_attention_efficiency_is_cudnns_benchmark():
    """The figure is the measured forward and backward kernel times of cuDNN 9.19 on H200 (BF16, causal,
    S 4096, 64 q / 8 kv heads of 128) over the FLOPs cuDNN's benchmark counts; each pass alone gives the
    TFLOP/s the benchmark printed."""
    fwd, bwd = _cudnn_kernel_flops(b=1, s=4096, h=64, d=128)
    assert fwd / 0.465e-3 / 1e12 == pytest.approx(591, abs=0.5) and bwd / 1.450e-3 / 1e12 == pytest.approx(474, abs=0.5)
    for name in ("h100", "h200"):
        fig = hardware.TABLE[name].attention_efficiency
        assert fig.source.startswith("measured: cuDNN 9.19") and "df73764adb98b7445b77662ce07b1ea434c8f3ee" in fig.source
        assert round((fwd + bwd) / 1.915e-3 / hardware.TABLE[name].peak_bf16_flops.value, 3) == fig.value == 0.508
        assert fig.value < hardware.TABLE[name].matmul_efficiency.value  # a fused kernel, below cuBLAS's rate


def test_cudnn_flash_attention_calls_are_counted_and_priced_at_the_attention_rate():
    """A cuDNN forward and backward (GQA: 8 query heads over 2 KV heads), compiled deviceless for one
    H100 (jax 0.10.2 with the CUDA plugin; tests/roofline/data/cudnn_attention_h100.hlo is that
    compile's optimized HLO, `test_the_stored_cudnn_module_is_what_xla_compiles` rebuilds it)."""
    text = CUDNN_HLO.read_text()
    module = R.parse_module(text)
    calls = {i.attr("custom_call_target").strip('"'): R.cudnn_fmha_flops(c, i)
             for c in module.computations.values() for i in c.instrs if R.cudnn_fmha_flops(c, i)}
    fwd, bwd = _cudnn_kernel_flops(**CUDNN)
    assert calls == {"__cudnn$fmhaScaleBiasSoftmax": fwd, "__cudnn$fmhaScaleBiasSoftmaxBackward": bwd}
    hw = hardware_for([], "h100")
    assert hw.attention_efficiency == 0.508
    roof = R.analyze(text, hw, num_devices=1)
    flat = R.analyze(text, dataclasses.replace(hw, attention_efficiency=None), num_devices=1)
    other = roof.flops_per_step - fwd - bwd
    assert other >= 0 and roof.compute_s == pytest.approx(other / hw.sustained_flops
                                                         + (fwd + bwd) / hw.sustained_attention_flops, rel=1e-9)
    assert roof.step_time_s > flat.step_time_s  # the kernels at their measured rate, not cuBLAS's


def test_a_cudnn_call_without_its_score_shape_counts_nothing():
    line = next(ln for ln in CUDNN_HLO.read_text().splitlines() if "fmhaScaleBiasSoftmax\"" in ln)
    broken = line.replace('"intermediate_tensor_shape"', '"other_shape"')
    module = R.parse_module(CUDNN_HLO.read_text().replace(line, broken))
    assert sum(R.cudnn_fmha_flops(c, i) for c in module.computations.values() for i in c.instrs) == \
        _cudnn_kernel_flops(**CUDNN)[1]  # the backward still counts, the forward without its shape does not


@needs_cuda_plugin
def test_the_stored_cudnn_module_is_what_xla_compiles():
    """Rebuilds the stored module (needs the gpu-plan extra): the same cuDNN calls, the same FLOPs."""
    from paxsearch.search.planning.targets import parse_target, target_devices
    one = jax.sharding.SingleDeviceSharding(target_devices(parse_target("gpu:h100x8"))[0])
    b, s, h, kvh, d = (CUDNN[k] for k in ("b", "s", "h", "kvh", "d"))
    q = jax.ShapeDtypeStruct((b, s, h, d), jnp.bfloat16, sharding=one)
    kv = jax.ShapeDtypeStruct((b, s, kvh, d), jnp.bfloat16, sharding=one)
    seg = jax.ShapeDtypeStruct((b, s), jnp.int32, sharding=one)

    def loss(q, k, v, seg):
        return jnp.sum(A.cudnn(q, k, v, seg).astype(jnp.float32))

    text = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, kv, kv, seg).compile().as_text()
    fresh, stored = (R.parse_module(t) for t in (text, CUDNN_HLO.read_text()))
    count = [sorted(R.cudnn_fmha_flops(c, i) for c in m.computations.values() for i in c.instrs
                    if R.cudnn_fmha_flops(c, i)) for m in (fresh, stored)]
    assert count[0] == count[1] == sorted(_cudnn_kernel_flops(**CUDNN))


def test_splash_flops_count_the_value_side_at_the_value_head_dim():
    """MLA's kernels take q/k of 192 and v of 128: the matmuls on the value dim (forward P V, dK/dV's dV and
    dP, dQ's dP) count at 128, the rest at 192."""
    from paxsearch.search.planning.roofline import cost

    b, h, s, dqk, dv = 2, 4, 2048, 192, 128
    text = f"""HloModule m, is_scheduled=true

ENTRY %main (m: s8[1,4,4], q: bf16[{b},{h},{s},{dqk}], k: bf16[{b},{h},{s},{dqk}], v: bf16[{b},{h},{s},{dv}]) -> bf16[{b},{h},{s},{dv}] {{
  %m = s8[1,4,4]{{2,1,0}} parameter(0)
  %q = bf16[{b},{h},{s},{dqk}]{{3,2,1,0}} parameter(1)
  %k = bf16[{b},{h},{s},{dqk}]{{3,2,1,0}} parameter(2)
  %v = bf16[{b},{h},{s},{dv}]{{3,2,1,0}} parameter(3)
  %fwd = bf16[{b},{h},{s},{dv}]{{3,2,1,0}} custom-call(%m, %q, %k, %v), custom_call_target="tpu_custom_call", metadata={{op_name="splash_mha_fwd"}}
  ROOT %splash_mha_dkv_no_residuals.1 = bf16[{b},{h},{s},{dqk}]{{3,2,1,0}} custom-call(%m, %q, %k, %v), custom_call_target="tpu_custom_call"
}}
"""
    module = R.parse_module(text)
    entry = module.computations[module.entry]
    dkv = next(i for i in entry.instrs if i.name.startswith("splash_mha_dkv"))
    causal = 5 / 8  # 4 blocks of 512
    assert cost.splash_flops(entry, dkv) == pytest.approx(2.0 * s * s * (2 * dqk + 2 * dv) * b * h * causal)

"""The VPU time of ops without a matmul (search/planning/roofline/vpu.py), priced at the v5e chip's cycles per
register (trainer/hardware.py V5E_VPU_CYCLES, from benchmarks/fit_vpu.py over the chip's own profiled steps)."""
import dataclasses
import gzip
import json
import os

import pytest

from paxsearch.search.planning import roofline as R
from paxsearch.search.planning.roofline import cost, hlo, vpu
from paxsearch.trainer import hardware

from ..search_util import REPO

STEPS = os.path.join(REPO, "benchmarks", "data", "chip_steps_v5e_run5")
VMEM = "f32[8,2048,64]{2,1,0:T(8,128)S(1)}"
HBM = "f32[8,2048,64]{2,1,0:T(8,128)}"


def _v5e() -> R.Hardware:
    from paxsearch.search.planning.predict import hardware_for

    return hardware_for([None], "v5e")


def _rope_text(out: str = VMEM) -> str:
    """RoPE's tables: sine and cosine of positions x frequencies, one fusion, results where `out` says."""
    return f"""HloModule m, entry_computation_layout={{()->()}}

%fused (p0: f32[8,2048,64]) -> (f32[8,2048,64], f32[8,2048,64]) {{
  %p0 = {HBM} parameter(0)
  %s = {out} sine(%p0)
  %c = {out} cosine(%p0)
  ROOT %t = ({out}, {out}) tuple(%s, %c)
}}

ENTRY %main (a: f32[8,2048,64]) -> (f32[8,2048,64], f32[8,2048,64]) {{
  %a = {HBM} parameter(0)
  ROOT %f = ({out}, {out}) fusion(%a), kind=kLoop, calls=%fused
}}
"""


def _rope() -> tuple[hlo.HloModule, hlo.Computation, hlo.Instr]:
    module = hlo.parse_module(_rope_text())
    comp = module.computations[module.entry]
    return module, comp, comp.by_name["f"]


def test_sine_and_cosine_into_vmem_are_priced_by_their_vector_registers_not_their_bytes():
    module, comp, ins = _rope()
    regs = vpu.vpu_registers(module, comp, ins)
    # 8 x 2048 x 64 floats laid out in (8, 128) tiles: 64 lanes padded to 128, 2048 registers an array
    assert regs[vpu.TRIG] == 2 * 2048 and regs[vpu.ARITHMETIC] == 0 == regs[vpu.MOVEMENT]
    hw = _v5e()
    cycles = dict(hw.vpu_cycles)[vpu.TRIG]
    price = cost.op_price(module, comp, ins, hw, estimate=False)
    assert price.seconds == pytest.approx(2 * 2048 * cycles / hw.clock_hz)
    assert price.seconds > 4 * hw.hbm_seconds(price.read, price.written)  # it reads 8 MiB (tiled); writes none: VMEM
    # without the chip's figures (CPU, GPU, TPUs not measured) an op is priced by its bytes alone
    bare = dataclasses.replace(hw, vpu_cycles=())
    assert cost.op_price(module, comp, ins, bare, estimate=False).seconds == pytest.approx(
        hw.hbm_seconds(price.read, price.written))
    # what the VPU adds over the bytes has its own line in the step's breakdown
    roof = R.analyze(_rope_text(), hw, num_devices=1)
    assert roof.vpu_excess_s == pytest.approx(roof.roofline_s - roof.memory_s)
    assert roof.vpu_excess_s > 0 and roof.to_dict()["vpu_excess_s"] == roof.vpu_excess_s


def test_a_copy_that_lays_another_dimension_along_the_lanes_is_a_transpose():
    """A copy (or transpose) whose result's minor-most dimension is not its operand's moves data across the lanes:
    the transpose unit's work, priced at its own cycles (v5e: 3.1 a register against 0.21 for other movement; the
    attention's [B, H, S, D] <-> [B, S, H, D] relayouts in VMEM ran 10-95 us where movement priced them at 1-5)."""
    text = """HloModule m, is_scheduled=true

ENTRY %main (p: bf16[8,2048,768]) -> (bf16[8,2048,768], bf16[8,2048,768], bf16[768,2048,8]) {
  %p = bf16[8,2048,768]{2,1,0:T(8,128)(2,1)S(1)} parameter(0)
  %across = bf16[8,2048,768]{1,2,0:T(8,128)(2,1)S(1)} copy(%p)
  %along = bf16[8,2048,768]{2,0,1:T(8,128)(2,1)S(1)} copy(%p)
  %kept = bf16[768,2048,8]{0,1,2:T(8,128)(2,1)S(1)} transpose(%p), dimensions={2,1,0}
  ROOT %t = (bf16[8,2048,768], bf16[8,2048,768], bf16[768,2048,8]) tuple(%across, %along, %kept)
}
"""
    module = hlo.parse_module(text)
    comp = module.computations[module.entry]
    assert vpu.kind_of(comp.by_name["across"], comp) == vpu.TRANSPOSE  # lanes: dim 2 -> dim 1
    assert vpu.kind_of(comp.by_name["along"], comp) == vpu.MOVEMENT  # the lanes keep dim 2
    assert vpu.kind_of(comp.by_name["kept"], comp) == vpu.MOVEMENT  # result dim 0 is the operand's dim 2
    assert vpu.kind_of(comp.by_name["across"]) == vpu.MOVEMENT  # without its computation, no operand to compare
    hw = _v5e()
    across = cost.op_price(module, comp, comp.by_name["across"], hw, estimate=False).seconds
    along = cost.op_price(module, comp, comp.by_name["along"], hw, estimate=False).seconds
    cycles = dict(hw.vpu_cycles)
    assert across == pytest.approx(along * cycles[vpu.TRANSPOSE] / cycles[vpu.MOVEMENT])
    assert across > 10 * along


def test_a_tile_smaller_than_a_register_fills_a_register_of_its_own():
    """A register holds 8 sublanes x 128 lanes; a T(2,128) tile takes one register for 256 elements (a MoE layer's
    top-k combine, [tokens, 2, d] in T(2,128) tiles, ran 4-7x the registers its elements fill on the v5e chip)."""
    assert vpu.vregs("f32[16,1024]{1,0:T(8,128)}") == 16  # full tiles: elements / 1,024
    assert vpu.vregs("bf16[16,1024]{1,0:T(8,128)(2,1)}") == 16  # counted as 32-bit registers, as the fit was
    assert vpu.vregs("bf16[8,2,1024]{2,1,0:T(2,128)(2,1)}") == 4 * 16  # 64 tiles of 2 x 128, one register each
    assert vpu.vregs("f32[8,1,1024]{2,1,0:T(1,128)}") == 8 * 8  # 64 tiles of 1 x 128
    assert vpu.vregs("f32[16384]{0:T(1024)}") == 16 and vpu.vregs("f32[16,1024]") == 16  # 1-D tiles; no layout


def test_a_reshape_that_re_tiles_its_operand_is_a_transpose():
    """A reshape whose result is tiled otherwise than its operand is a copy through the transpose unit (on the v5e
    chip [16384, 1024] in T(8,128) to [8192, 2, 1024] in T(2,128) ran 2.0-2.4 cycles a register of its result, as
    the transposes did); one that keeps the tile is a bitcast and costs nothing; inside a fusion, nothing."""
    text = """HloModule m, is_scheduled=true

ENTRY %main (p: bf16[16384,1024]) -> (bf16[8192,2,1024], bf16[8192,2,1024]) {
  %p = bf16[16384,1024]{1,0:T(8,128)(2,1)S(1)} parameter(0)
  %retiled = bf16[8192,2,1024]{2,1,0:T(2,128)(2,1)S(1)} reshape(%p)
  %same = bf16[8192,2,1024]{2,1,0:T(8,128)(2,1)S(1)} reshape(%p)
  ROOT %t = (bf16[8192,2,1024], bf16[8192,2,1024]) tuple(%retiled, %same)
}
"""
    module = hlo.parse_module(text)
    comp = module.computations[module.entry]
    retiled, same = comp.by_name["retiled"], comp.by_name["same"]
    assert vpu.relayout(comp, retiled) and not vpu.relayout(comp, same) and not vpu.relayout(None, retiled)
    regs = vpu.vpu_registers(module, comp, retiled)
    assert regs[vpu.TRANSPOSE] == 8192 * 1024 / 128 and sum(regs.values()) == regs[vpu.TRANSPOSE]
    assert sum(vpu.vpu_registers(module, comp, same).values()) == 0
    hw = _v5e()
    assert vpu.vpu_seconds(module, comp, retiled, hw) == pytest.approx(
        65536 * dict(hw.vpu_cycles)[vpu.TRANSPOSE] / hw.clock_hz)  # 108 us at 2.48 cycles: measured 89.5


def test_a_matmul_fusion_gets_no_vpu_price():
    text = """HloModule m, entry_computation_layout={()->()}

%fused (p0: bf16[4096,4096], p1: bf16[4096,4096]) -> bf16[4096,4096] {
  %p0 = bf16[4096,4096]{1,0:T(8,128)(2,1)} parameter(0)
  %p1 = bf16[4096,4096]{1,0:T(8,128)(2,1)} parameter(1)
  %e = bf16[4096,4096]{1,0:T(8,128)(2,1)} sine(%p0)
  ROOT %d = bf16[4096,4096]{1,0:T(8,128)(2,1)} dot(%e, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main (a: bf16[4096,4096], b: bf16[4096,4096]) -> bf16[4096,4096] {
  %a = bf16[4096,4096]{1,0:T(8,128)(2,1)} parameter(0)
  %b = bf16[4096,4096]{1,0:T(8,128)(2,1)} parameter(1)
  ROOT %f = bf16[4096,4096]{1,0:T(8,128)(2,1)} fusion(%a, %b), kind=kOutput, calls=%fused
}
"""
    module = hlo.parse_module(text)
    comp = module.computations[module.entry]
    price = cost.op_price(module, comp, comp.by_name["f"], _v5e(), estimate=False)
    assert price.vpu == 0.0 and price.seconds == pytest.approx(price.flops / price.rate)


def test_on_the_chip_ropes_sine_and_cosine_ran_at_their_vpu_price():
    """The v5e chip's step of m350-s2k-fl-b8-full: its two RoPE table fusions (24 a step each, results in VMEM)
    measured 55.6 us an execution, where their bytes are priced at 6 ns."""
    name = "m350-s2k-fl-b8-full"
    with gzip.open(os.path.join(STEPS, f"{name}.hlo.txt.gz"), "rt") as f:
        module = hlo.parse_module(f.read())
    with open(os.path.join(STEPS, f"{name}.ops.json")) as f:
        ops = json.load(f)
    hw = _v5e()
    bare = dataclasses.replace(hw, vpu_cycles=())
    index = {i.name: (c, i) for c in module.computations.values() for i in c.instrs}
    for op in ("fusion.437", "multiply_cosine_fusion.3"):
        measured = ops[op][0] / ops[op][1]
        assert cost.op_price(module, *index[op], bare, estimate=False).seconds < 0.001 * measured
        assert cost.op_price(module, *index[op], hw, estimate=False).seconds == pytest.approx(measured, rel=0.05)


@pytest.mark.slow  # parses 44 chip steps, then 14 again; CI runs it
def test_the_tables_figures_are_what_fit_vpu_finds_in_the_chips_steps(tmp_path):
    from paxsearch.benchmarks import fit_vpu

    out = tmp_path / "fit.json"
    assert fit_vpu.main(["--json", str(out)]) == 0  # all six folders' steps
    table = {k: f.value for k, f in hardware.V5E_VPU_CYCLES}
    assert set(table) == set(vpu.KINDS)
    everything = json.loads(out.read_text())
    for kind, cycles in everything["cycles"].items():
        assert cycles == pytest.approx(table[kind], rel=0.02, abs=0.005), kind
    assert table["transpose"] > 10 * table["movement"]  # a relayout across the lanes is the transpose unit's work
    in_step = {part.strip("_"): f.value for part, f in hardware.V5E_SPLASH_IN_STEP}
    for kind, times in everything["splash_in_step"].items():  # the factors the entry prices uncovered shapes with
        assert times == pytest.approx(in_step[kind], abs=0.002), kind
    steps = os.path.dirname(STEPS)
    assert fit_vpu.main(["--json", str(out), "--steps", os.path.join(steps, "chip_steps_v5e_run5"),
                         "--steps", os.path.join(steps, "chip_steps_v5e_run6")]) == 0
    found = json.loads(out.read_text())
    # runs 5 and 6 alone (14 of the 44 steps, one of them MoE) find about the same cycles: transposes 2.74
    assert found["cycles"]["transpose"] == pytest.approx(table["transpose"], rel=0.12)
    assert found["cycles"]["trigonometric"] == pytest.approx(table["trigonometric"], rel=0.05)  # 21.0
    assert 0.1 < found["dma_share"] < 0.5  # the DMAs' waits: 51.6 of the 228.1 ms their bytes are priced at
    # the splash kernels in their steps: the forward as its grid prices it, dQ and dK / dV 10-12% longer
    assert found["splash_in_step"]["fwd"] == pytest.approx(1.0, abs=0.03)
    assert found["splash_in_step"]["dq"] > 1.08 and found["splash_in_step"]["dkv"] > 1.08
    for step in found["steps"]:  # with every kind fitted, every step's other bucket comes closer to the chip's
        assert abs(step["other_vpu_s"] - step["other_measured_s"]) < abs(
            step["other_roofline_s"] - step["other_measured_s"]), step["step"]


def test_a_dma_share_and_the_splash_kernels_in_step():
    """Hardware.dma_share and Hardware.attention_in_step (what-ifs of benchmarks/reprice_onchip.py and
    benchmarks/fit_splash.py)."""
    text = """HloModule jit_step, is_scheduled=true, entry_computation_layout={()->()}

ENTRY %main (p0: bf16[4096,4096]) -> bf16[4096,4096] {
  %p0 = bf16[4096,4096]{1,0:T(8,128)(2,1)} parameter(0)
  %copy-start = (bf16[4096,4096]{1,0:T(8,128)(2,1)S(1)}, bf16[4096,4096]{1,0:T(8,128)(2,1)}, u32[]{:S(2)}) copy-start(%p0)
  ROOT %copy-done = bf16[4096,4096]{1,0:T(8,128)(2,1)S(1)} copy-done(%copy-start)
}
"""
    hw = dataclasses.replace(_v5e(), dma_overlap=False, attention_in_step=(), attention_step_grid=())
    whole = R.analyze(text, hw, num_devices=1)
    quarter = R.analyze(text, dataclasses.replace(hw, dma_share=0.25), num_devices=1)
    assert quarter.roofline_s == pytest.approx(0.25 * whole.roofline_s)
    assert quarter.dma_discount_s == pytest.approx(0.75 * whole.roofline_s) and whole.dma_discount_s == 0.0
    slower = dataclasses.replace(hw, attention_in_step=(("_dq", 1.25),))
    assert slower.grid_in_step("splash_mha_dq_segmented_no_residuals.3") == 1.25
    assert slower.grid_in_step("splash_mha_fwd_segmented_residuals") == 1.0
    name = "m350-s2k-fl-b8-full"
    with gzip.open(os.path.join(STEPS, f"{name}.hlo.txt.gz"), "rt") as f:
        module = hlo.parse_module(f.read())
    kernels = [(c, i) for c in module.computations.values() for i in c.instrs if cost.is_attention_kernel(i)]
    dq = [(c, i) for c, i in kernels if "_dq" in i.name]
    assert dq and len(dq) < len(kernels)
    for c, i in kernels:
        ratio = cost.flop_rate(c, i, hw, module) / cost.flop_rate(c, i, slower, module)
        assert ratio == pytest.approx(1.25 if "_dq" in i.name else 1.0)

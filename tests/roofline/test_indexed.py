"""Row gathers, scatters and ragged dots priced at the chip's measured rates (search/planning/roofline/
indexed.py; the v5e figures in trainer/hardware.py from benchmarks/data/chip_figures_v5e_2026-12-07_run3_index.json,
rows of 128 and 256 B from _run4_index_narrow.json).
A TPU scatter moves its update rows one at a time: its bytes at the HBM roofline price it 5-9x too fast."""
import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from paxsearch.search.planning import roofline as R
from paxsearch.search.planning import topology
from paxsearch.search.planning.predict import hardware_for
from paxsearch.search.planning.roofline import cost, hlo, indexed
from paxsearch.trainer import hardware

from ..search_util import needs_libtpu

RECORD = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "data",
                      "chip_figures_v5e_2026-12-07_run3_index.json")
NARROW = RECORD.replace("_run3_index", "_run4_index_narrow")


@pytest.fixture(scope="module")
def record():
    """Run 3's cases and run 4's bf16 rows narrower than 512 B (its f32 rows of 256 and 512 B are not in the table)."""
    with open(RECORD) as f:
        cases = json.load(f)["sections"]["index"]["cases"]
    with open(NARROW) as f:
        narrow = json.load(f)["sections"]["index"]["cases"]
    assert {c["row_bytes"] for c in narrow if c["dtype"] == "bfloat16"} == {128, 256}
    return cases + [c for c in narrow if c["dtype"] == "bfloat16"]


def test_the_v5e_figures_are_the_records(record):
    """Each seconds-per-row figure is its case's device time over its rows; the unsorted factors and the
    ragged-dot shares are computed from the same cases."""
    spec = hardware.TABLE["v5e"]
    table = {(r.kind, r.rows, r.row_bytes): r.seconds.value for r in spec.index_rates}
    sorted_cases = [c for c in record if c["kind"] != "ragged_dot" and c["sorted"]]
    assert len(table) == len(sorted_cases) == 48
    for c in sorted_cases:
        assert table[(c["kind"], c["rows"], c["row_bytes"])] == pytest.approx(c["device_s"] / c["rows"], rel=0.005)
    for kind, factor in spec.unsorted_index:
        ratios = [r["device_s"] / s["device_s"] for r in record if r["kind"] == kind and not r["sorted"]
                  for s in record if s["kind"] == kind and s["sorted"] and s["rows"] == r["rows"]
                  and s["row_bytes"] == r["row_bytes"]]
        assert len(ratios) == 2 and factor.value == pytest.approx(np.mean(ratios), abs=0.006)
    peak = spec.peak_bf16_flops.value
    by = {(c["rows"], c["d"], c["f"], c["pass_"]): c for c in record if c["kind"] == "ragged_dot"}
    for r in spec.ragged_rates:
        (rows, k, n), = {(c0, k0, n0) for c0, k0, n0, _ in by if (k0, n0) == (r.k, r.n)}
        fwd, both = by[(rows, k, n, "fwd")], by[(rows, k, n, "fwd_bwd")]
        assert r.forward.value == pytest.approx(fwd["flops"] / fwd["device_s"] / peak, abs=0.001)
        back = (both["flops"] - fwd["flops"]) / (both["device_s"] - fwd["device_s"]) / peak
        assert r.backward.value == pytest.approx(back, abs=0.001)


def test_row_seconds_interpolate_between_the_measured_sizes():
    hw = hardware_for([], "v5e")
    ns = {(r.kind, r.rows, r.row_bytes): r.seconds.value for r in hardware.TABLE["v5e"].index_rates}
    assert indexed.row_seconds(hw, "scatter", 2048, 32768) == pytest.approx(ns[("scatter", 32768, 2048)])
    mid = indexed.row_seconds(hw, "scatter", 3000, 32768)
    assert ns[("scatter", 32768, 2048)] < mid < ns[("scatter", 32768, 4096)]
    # below the narrowest measured row its time (a row's floor), proportional to the bytes above the widest, held
    # outside the row counts
    assert indexed.row_seconds(hw, "gather", 4, 32768) == ns[("gather", 32768, 128)]
    assert indexed.row_seconds(hw, "scatter", 4, 8192) == ns[("scatter", 8192, 128)]
    assert indexed.row_seconds(hw, "gather", 512, 32768) == ns[("gather", 32768, 512)]
    assert indexed.row_seconds(hw, "scatter", 128, 32768) == ns[("scatter", 32768, 128)]
    # a narrow scatter costs less a row than a 512 B one, but far more than its bytes (256 B at 819 GB/s: 0.3 ns)
    assert 1e-9 < indexed.row_seconds(hw, "scatter", 256, 32768) < ns[("scatter", 32768, 512)]
    assert indexed.row_seconds(hw, "scatter", 32768, 32768) == pytest.approx(2 * ns[("scatter", 32768, 16384)])
    assert indexed.row_seconds(hw, "scatter", 2048, 10 ** 6) == pytest.approx(ns[("scatter", 32768, 2048)])
    between = indexed.row_seconds(hw, "scatter", 2048, 16384)
    assert min(ns[("scatter", 8192, 2048)], ns[("scatter", 32768, 2048)]) <= between
    assert between <= max(ns[("scatter", 8192, 2048)], ns[("scatter", 32768, 2048)])
    assert indexed.row_seconds(hw, "scatter", 2048, 32768, sorted_=False) == pytest.approx(
        1.357 * ns[("scatter", 32768, 2048)])
    assert indexed.row_seconds(R.Hardware("x", 1e12, 1e11, 1e10, 1e9), "scatter", 2048, 32768) is None


def _compiled_text(fn, *shapes) -> str:
    device = topology.topology_devices("v5e-4")[0]
    sharding = jax.sharding.SingleDeviceSharding(device)
    args = [jax.ShapeDtypeStruct(s, d, sharding=sharding) for s, d in shapes]
    return jax.jit(fn).lower(*args).compile().as_text()


@needs_libtpu
def test_a_compiled_scatter_is_priced_at_its_rows_not_its_bytes():
    rows, width = 32768, 1024
    idx = np.sort(np.random.default_rng(0).permutation(rows + rows // 4)[:rows]).astype(np.int32)

    def scatter(t, u):
        return t.at[jnp.asarray(idx)].set(u, indices_are_sorted=True, unique_indices=True, mode="drop")

    text = _compiled_text(scatter, ((rows + rows // 4, width), jnp.bfloat16), ((rows, width), jnp.bfloat16))
    module = R.parse_module(text)
    found = [op for comp in module.computations.values() for ins in comp.instrs
             for op in ([indexed.index_op(module, comp, ins)] if ins.opcode == "scatter" else [])]
    assert found == [("scatter", rows, width * 2, True)]
    # the rows alone: no VPU time (vpu.py), the DMAs on the stream at their bytes (memory_s holds those)
    hw = dataclasses.replace(hardware_for([], "v5e"), vpu_cycles=(), dma_overlap=False)
    step = R.analyze(text, hw, num_devices=1).step_time_s
    per_row = indexed.row_seconds(hw, "scatter", width * 2, rows)
    assert step >= rows * per_row  # 0.88 ms: the bytes alone (134 MB) would be 0.2 ms
    assert step < rows * per_row + 0.5e-3
    roof = R.analyze(text, hw, num_devices=1)  # the excess over the bytes has its own line in the breakdown
    assert roof.index_excess_s == pytest.approx(roof.roofline_s - max(roof.compute_s, roof.memory_s), rel=0.05)
    assert roof.index_excess_s > roof.memory_s and roof.to_dict()["index_excess_s"] == roof.index_excess_s
    no_rows = dataclasses.replace(hw, index_rows=(), unsorted_index=())
    assert R.analyze(text, no_rows, num_devices=1).step_time_s < step - 0.5 * rows * per_row
    assert R.analyze(text, no_rows, num_devices=1).index_excess_s == 0


_MASKED = """HloModule m, entry_computation_layout={()->bf16[8,64,128]{2,1,0}}

%masked (kernel: bf16[4096,128], activations: bf16[4096,64], output_mask: pred[8,4096]) -> bf16[8,64,128] {
  %activations = bf16[4096,64]{1,0} parameter(1)
  %output_mask = pred[8,4096]{1,0} parameter(2)
  %a = bf16[8,4096,64]{2,1,0} broadcast(%activations), dimensions={1,2}
  %kernel = bf16[4096,128]{1,0} parameter(0)
  %k = bf16[8,4096,128]{2,1,0} broadcast(%kernel), dimensions={1,2}
  ROOT %conv = bf16[8,64,128]{2,1,0} convolution(%a, %k), window={size=8 stride=7 lhs_dilate=8}, dim_labels=0fb_0io->0bf
}

ENTRY %main () -> bf16[8,64,128] {
  %p0 = bf16[4096,128]{1,0} constant({...})
  %p1 = bf16[4096,64]{1,0} constant({...})
  %p2 = pred[8,4096]{1,0} constant({...})
  ROOT %fusion = bf16[8,64,128]{2,1,0} fusion(%p0, %p1, %p2), kind=kOutput, calls=%masked
}
"""


def test_the_masked_group_convolution_is_a_ragged_dot_at_the_backward_share():
    """libtpu 0.0.42.1 writes a ragged dot's weight gradient as a convolution over the groups, in a fusion
    handed the group mask and carrying no op_name: priced at its groups' work and the measured backward share."""
    module = R.parse_module(_MASKED)
    comp = module.computations["masked"]
    conv = comp.by_name["conv"] if comp.by_name else next(i for i in comp.instrs if i.opcode == "convolution")
    lhs, rhs = (hlo.operand_shape(comp, o) for o in conv.operands[:2])
    assert cost.ragged_dot_groups(conv, lhs, rhs, comp) == 8
    assert cost.ragged_dot_groups(conv, lhs, rhs) == 1  # without the computation: no mask seen, no op_name
    assert indexed.ragged_dims(comp, conv) == (64, 128)
    hw = hardware_for([], "v5e")
    entry = module.computations[module.entry]
    fusion = next(i for i in entry.instrs if i.opcode == "fusion")
    assert indexed.is_backward(fusion)
    assert cost.flop_rate(entry, fusion, hw, module) == pytest.approx(hw.peak_flops * 0.700)  # (1024, 1408)'s
    assert cost.instr_flops(module, entry, fusion) >= 2.0 * 4096 * 64 * 128  # the groups' work, not 8 x it
    assert cost.instr_flops(module, entry, fusion) < 2 * 2.0 * 4096 * 64 * 128


def test_a_named_einsum_beside_a_mask_is_not_a_ragged_dot():
    """The capacity experts' einsum ('ecd,edf->ecf', the same convolution over the groups) in a fusion that is
    handed a pred[G, rows] mask (the gather dispatch's) keeps its full count: its op_name names the einsum."""
    named = _MASKED.replace("dim_labels=0fb_0io->0bf",
                            'dim_labels=0fb_0io->0bf, metadata={op_name="jit(step)/moe/ecd,edf->ecf/dot_general"}')
    module = R.parse_module(named)
    comp = module.computations["masked"]
    conv = next(i for i in comp.instrs if i.opcode == "convolution")
    lhs, rhs = (hlo.operand_shape(comp, o) for o in conv.operands[:2])
    assert cost.ragged_dot_groups(conv, lhs, rhs, comp) == 1
    entry = module.computations[module.entry]
    fusion = next(i for i in entry.instrs if i.opcode == "fusion")
    assert cost._ragged(module, entry, fusion) is None
    unnamed = R.parse_module(_MASKED)
    assert cost.ragged_dot_groups(next(i for i in unnamed.computations["masked"].instrs if i.opcode == "convolution"),
                                  lhs, rhs, unnamed.computations["masked"]) == 8


def test_ragged_share_takes_the_nearest_measured_shape():
    hw = hardware_for([], "v5e")
    assert indexed.ragged_share(hw, (1024, 1408), backward=False) == 0.476
    assert indexed.ragged_share(hw, (1408, 2048), backward=True) == 0.655
    assert indexed.ragged_share(hw, (1024, 4096), backward=False) == 0.606  # nearest: (1024, 2816)
    assert indexed.ragged_share(R.Hardware("x", 1e12, 1e11, 1e10, 1e9), (1024, 1408), False) is None


@needs_libtpu
def test_a_ragged_dots_feature_dims_are_its_weights_not_its_largest_dims():
    """With fewer rows than the weights' dims (1024 routes against 8 experts of [7168, 2048]), the shape
    the measured share is looked up by is the weights' (2048, 7168), forward and backward."""
    rows, k, n, g = 1024, 7168, 2048, 8
    text = _compiled_text(jax.grad(lambda x, w, s: jnp.sum(jax.lax.ragged_dot(x, w, s).astype(jnp.float32)),
                                   argnums=(0, 1)),
                          ((rows, k), jnp.bfloat16), ((g, k, n), jnp.bfloat16), ((g,), jnp.int32))
    module = R.parse_module(text)
    found = set()
    for comp in module.computations.values():
        for ins in comp.instrs:
            r = cost._ragged(module, comp, ins)
            if r is not None and ins.opcode in ("convolution", "custom-call"):
                found.add(indexed.ragged_dims(*r))
    assert found == {(n, k)}


def test_the_megablox_figures_are_the_record():
    """hardware.V5E_MEGABLOX_RATES: the megablox kernels at tiling 512 x 1024 x 1024 of run 4's record, forward and
    backward (forward + backward less the forward) as for ragged_dot."""
    with open(RECORD.replace("_run3_index", "_run4_gmm")) as f:
        doc = json.load(f)
    peak = doc["peak_flops"]
    by = {(c["kind"], tuple(c.get("tiling") or ()), c["d"], c["f"], c["pass_"]): c for c in doc["sections"]["gmm"]["cases"]}
    rates = hardware.TABLE["v5e"].megablox_rates
    assert len(rates) == 3
    for r in rates:
        fwd, both = (by[("megablox", (512, 1024, 1024), r.k, r.n, p)] for p in ("fwd", "fwd_bwd"))
        assert r.forward.value == pytest.approx(fwd["flops"] / fwd["device_s"] / peak, abs=0.001)
        back = (both["flops"] - fwd["flops"]) / (both["device_s"] - fwd["device_s"]) / peak
        assert r.backward.value == pytest.approx(back, abs=0.001)
        # the kernel at MaxText's tiles beats jax.lax.ragged_dot at every measured shape forward
        rd = by[("ragged_dot", (), r.k, r.n, "fwd")]
        assert fwd["device_s"] < rd["device_s"]
    assert hardware.TABLE["v5p"].megablox_rates is None  # no v5p chip measured: the matmul rate


@needs_libtpu
def test_the_megablox_kernels_are_grouped_matmuls_at_their_measured_share():
    """Compiled for a v5e: the forward (gmm), the lhs gradient (gmm of the transposed weights) and the weight
    gradient (tgmm) are each a tpu_custom_call counted at 2 x rows x K x N and priced at the megablox share of
    their shape and direction; without megablox figures, at the matmul rate."""
    from jax.experimental.pallas.ops.tpu.megablox import ops as mblx

    rows, k, n, g = 4096, 1024, 1408, 8
    sizes = jnp.full((g,), rows // g, jnp.int32)

    def fwd_bwd(x, w):
        out, vjp = jax.vjp(lambda a, b: mblx.gmm(a, b, sizes, jnp.bfloat16, (512, 1024, 1024)), x, w)
        return vjp(out)

    text = _compiled_text(fwd_bwd, ((rows, k), jnp.bfloat16), ((g, k, n), jnp.bfloat16))
    module = R.parse_module(text)
    hw = hardware_for([], "v5e")
    kernels = [(comp, ins) for comp in module.computations.values() for ins in comp.instrs
               if cost.is_megablox_kernel(ins)]
    assert len(kernels) == 3
    assert {indexed.is_backward(ins) for _, ins in kernels} == {False, True}
    for comp, ins in kernels:
        assert cost.is_ragged_dot_kernel(ins) and cost.uses_mxu(module, ins)
        assert cost.instr_flops(module, comp, ins) == 2.0 * rows * k * n
        assert indexed.ragged_dims(comp, ins) == (k, n)
        share = 0.590 if indexed.is_backward(ins) else 0.633
        assert cost.flop_rate(comp, ins, hw, module) == pytest.approx(hw.peak_flops * share)
        plain = dataclasses.replace(hw, megablox_shares=())
        assert cost.flop_rate(comp, ins, plain, module) == plain.sustained_flops

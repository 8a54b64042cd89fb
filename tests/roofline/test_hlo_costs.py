"""The HLO roofline parser (search/planning/roofline/) on small real programs compiled for 8
simulated CPU devices, and on the spellings of replica groups XLA prints."""
import os

from paxsearch.trainer.flagsets import DEVICE_COUNT_FLAG, with_device_count  # noqa: E402  (imports no JAX)

os.environ["JAX_PLATFORMS"] = "cpu"
if DEVICE_COUNT_FLAG not in os.environ.get("XLA_FLAGS", ""):  # conftest sets 8
    os.environ["XLA_FLAGS"] = with_device_count(os.environ.get("XLA_FLAGS"), 8)

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from paxsearch.search.planning import roofline as R
from paxsearch.search.planning.roofline.collectives import _traffic  # a module-private helper, tested where it lives

HW = R.Hardware("test", peak_flops=1e12, hbm_bandwidth=1e11, ici_link_bandwidth=1e10, dcn_bandwidth=1e9,
                physical_dims=1, ici_latency_s=0.0, dcn_latency_s=0.0)


@pytest.fixture(scope="module")
def mesh():
    assert len(jax.devices()) >= 8, "needs 8 simulated CPU devices (tests/conftest.py)"
    return Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("a", "b"))


def _scan_gather(mesh, length=4):
    """A scan of `length` steps whose body all-gathers a weight sharded over 'b'."""
    def f(w, x):
        def body(c, wi):
            return c @ jax.lax.with_sharding_constraint(wi, NamedSharding(mesh, P())), None
        return jax.lax.scan(body, x, w)[0].sum()

    w = jax.ShapeDtypeStruct((length, 64, 64), jnp.float32, sharding=NamedSharding(mesh, P(None, "b", None)))
    x = jax.ShapeDtypeStruct((16, 64), jnp.float32, sharding=NamedSharding(mesh, P("a", None)))
    return jax.jit(f).lower(w, x).compile()


def test_all_gather_in_a_scan_of_4_counts_4_times(mesh):
    compiled = _scan_gather(mesh)
    roof = R.analyze(compiled.as_text(), HW, mesh=mesh)
    gathers = [c for c in roof.collectives if c.kind == "all-gather"]
    assert len(gathers) == 1, roof.collectives
    g = gathers[0]
    assert g.executions == 4
    assert g.axes == ("b",) and g.link == "ici" and g.group_size == 4
    shard = 16 * 64 * 4  # f32[1,16,64]: one layer's weight shard
    assert g.operand_bytes == shard
    assert g.bytes_per_execution == shard * 3  # ring: (n - 1) x the input
    assert g.seconds == pytest.approx(4 * shard * 3 / (2 * HW.ici_link_bandwidth))
    assert list(roof.trip_counts.values()) == [4]
    # links that sustain 80% of their bandwidth (GPU: NCCL's bus bandwidth) make each ICI transfer 1 / 0.8 longer
    slower = R.analyze(compiled.as_text(), dataclasses.replace(HW, ici_efficiency=0.8), mesh=mesh)
    assert [c.seconds for c in slower.collectives] == pytest.approx([c.seconds / 0.8 for c in roof.collectives])
    # the final psum runs over 'a' once, outside the loop
    (psum,) = [c for c in roof.collectives if c.kind == "all-reduce"]
    assert psum.executions == 1 and psum.axes == ("a",)


def test_trip_count_read_from_the_loop_when_xla_wrote_none(mesh):
    text = _scan_gather(mesh, length=6).as_text()
    assert "known_trip_count" in text
    stripped = re.sub(r',"known_trip_count":\{"n":"\d+"\}', "", text)
    stripped = re.sub(r'"known_trip_count":\{"n":"\d+"\},?', "", stripped)
    assert "known_trip_count" not in stripped
    roof = R.analyze(stripped, HW, mesh=mesh)
    assert list(roof.trip_counts.values()) == [6] and not roof.unknown_trip_counts
    (g,) = [c for c in roof.collectives if c.kind == "all-gather"]
    assert g.executions == 6


def test_flops_match_xla_cost_analysis_on_a_loop_free_program(mesh):
    def f(a, b, c):
        return jnp.tanh(a @ b) @ c + 1.0

    sh = NamedSharding(mesh, P("a", None))
    args = [jax.ShapeDtypeStruct(s, jnp.float32, sharding=sh) for s in ((64, 128), (128, 256), (256, 32))]
    compiled = jax.jit(f).lower(*args).compile()
    ca = compiled.cost_analysis()
    ca = ca[0] if isinstance(ca, (list, tuple)) else ca
    roof = R.analyze(compiled.as_text(), HW, mesh=mesh)
    assert roof.flops_per_step == pytest.approx(ca["flops"], rel=0.02)
    matmuls = 2 * 64 * 128 * 256 + 2 * 64 * 256 * 32  # the whole program, split over 8 devices
    assert matmuls <= 8 * roof.flops_per_step <= 1.05 * matmuls


def test_convolution_flops_match_xla():
    x = jax.ShapeDtypeStruct((2, 3, 17, 15), jnp.float32)
    k = jax.ShapeDtypeStruct((4, 3, 3, 5), jnp.float32)
    f = lambda x, k: jax.lax.conv_general_dilated(x, k, (2, 1), ((1, 2), (0, 3)), rhs_dilation=(1, 2))
    compiled = jax.jit(f).lower(x, k).compile()
    ca = compiled.cost_analysis()
    ca = ca[0] if isinstance(ca, (list, tuple)) else ca
    module = R.parse_module(compiled.as_text())
    convs = [(c, i) for c in module.computations.values() for i in c.instrs if i.opcode == "convolution"]
    assert convs
    comp, ins = convs[0]
    assert R.instr_flops(module, comp, ins) == pytest.approx(ca["flops"], rel=0.01)


def test_replica_group_spellings():
    ins = lambda attrs, op="all-gather": R.Instr("x", "f32[8]", op, ["p"], attrs)
    assert R.replica_groups(ins("replica_groups={{0,1},{2,3}}, dimensions={0}"), 4) == [[0, 1], [2, 3]]
    assert R.replica_groups(ins("replica_groups={}, dimensions={0}"), 4) == [[0, 1, 2, 3]]
    assert R.replica_groups(ins("replica_groups=[2,4]<=[8], dimensions={0}"), 8) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert R.replica_groups(ins("replica_groups=[4,2]<=[2,4]T(1,0), dimensions={0}"), 8) == \
        [[0, 4], [1, 5], [2, 6], [3, 7]]
    mesh_b = "replica_groups=mesh['a'=2,'b'=4] {'b'}, dimensions={0}"
    assert R.replica_groups(ins(mesh_b), 8) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    mesh_a = "replica_groups=mesh['a'=2,'b'=4] {'a'}, use_global_device_ids=true"
    assert R.replica_groups(ins(mesh_a), 8) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    # device order given as an iota with a transpose (as XLA's CPU backend prints it)
    cpu = ("replica_groups=mesh['axis_0'=1,'axis_1'=4,'axis_2'=1,'axis_3'=2], device_ids=([2,4]T(1,0)) "
           "{'axis_1'}, dimensions={1}")
    assert R.replica_groups(ins(cpu), 8) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    # a sub-axis: the first factor 2 of b=4 (pre-size 1): b = 2 x 2, group over the major one
    sub = "replica_groups=mesh['a'=2,'b'=4] {'b':(1)2}, dimensions={0}"
    assert R.replica_groups(ins(sub), 8) == [[0, 2], [1, 3], [4, 6], [5, 7]]
    minor = "replica_groups=mesh['a'=2,'b'=4] {'a','b':(2)2}, dimensions={0}"  # a x minor factor of b
    assert R.replica_groups(ins(minor), 8) == [[0, 1, 4, 5], [2, 3, 6, 7]]
    perm = ins("source_target_pairs={{0,1},{1,2},{2,3},{3,0}}", "collective-permute-start")
    assert R.replica_groups(perm, 4) == [[0, 1], [1, 2], [2, 3], [3, 0]]


def test_collective_costs_follow_the_ring_formulas():
    n, b = 4, 1000.0
    assert _traffic("all-gather", b, n) == b * 3
    assert _traffic("reduce-scatter", b, n) == b * 3 / 4
    assert _traffic("all-reduce", b, n) == 2 * b * 3 / 4
    assert _traffic("all-to-all", b, n) == b * 3 / 4
    assert _traffic("collective-permute", b, n) == b
    assert _traffic("all-reduce", b, 1) == 0


def test_cross_slice_transfers_are_priced_over_dcn():
    """TPU multi-slice programs move data between slices with megascale host transfers."""
    text = """HloModule m, num_partitions=4

%body (p: (s32[], f32[256])) -> (s32[], f32[256]) {
  %p = (s32[], f32[256]{0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  %x = f32[256]{0} get-tuple-element(%p), index=1
  %tok = token[] after-all()
  %send.1 = (f32[256]{0}, u32[], token[]) send(%x, %tok), channel_id=3, is_host_transfer=true, frontend_attributes={_xla_megascale_target="{1,2}x{0:3}",_xla_megascale_transfer_type="ALL_REDUCE"}
  %recv.1 = (f32[256]{0}, u32[], token[]) recv(%tok), channel_id=4, is_host_transfer=true, frontend_attributes={_xla_megascale_target="{1,2}x{0:3}",_xla_megascale_transfer_type="ALL_REDUCE"}
  ROOT %t = (s32[], f32[256]{0}) tuple(%next, %x)
}

%cond (q: (s32[], f32[256])) -> pred[] {
  %q = (s32[], f32[256]{0}) parameter(0)
  %j = s32[] get-tuple-element(%q), index=0
  %n = s32[] constant(5)
  ROOT %lt = pred[] compare(%j, %n), direction=LT
}

ENTRY %main (a: f32[256]) -> f32[256] {
  %a = f32[256]{0} parameter(0)
  %zero = s32[] constant(0)
  %init = (s32[], f32[256]{0}) tuple(%zero, %a)
  %w = (s32[], f32[256]{0}) while(%init), condition=%cond, body=%body
  ROOT %out = f32[256]{0} get-tuple-element(%w), index=1
}
"""

    class Dev:
        def __init__(self, i):
            self.slice_index, self.coords = i // 4, (i % 4, 0, 0)

    devices = np.array([Dev(i) for i in range(8)], dtype=object).reshape(2, 4, 1)
    roof = R.analyze(text, HW, mesh_devices=devices, axis_names=("data", "fsdp", "tensor"))
    assert roof.trip_counts == {"w": 5}
    (c,) = roof.collectives
    assert (c.kind, c.link, c.axes, c.group_size, c.executions) == ("all-reduce", "dcn", ("data",), 2, 5)
    assert c.seconds == pytest.approx(5 * 2 * 1024 * 0.5 / HW.dcn_bandwidth)


def test_hbm_bytes_skip_buffers_placed_outside_hbm():
    assert R.hbm_shape_bytes("f32[1024]{0:T(256)}") == 4096
    assert R.hbm_shape_bytes("f32[1024]{0:T(256)S(1)}") == 0
    assert R.hbm_shape_bytes("(bf16[8,128]{1,0}, f32[4]{0:S(1)})") == 8 * 128 * 2
    assert R.shape_bytes("(bf16[8,128]{1,0}, f32[4]{0:S(1)}, s4[2])") == 8 * 128 * 2 + 16 + 1


def test_predicted_step_time_combines_roofline_and_exposed_comm():
    roof = R.Roofline("t", 0, 0, compute_s=2.0, memory_s=1.0, roofline_s=2.0, comm_s=3.0, exposed_comm_s=2.0,
                      step_time_s=4.0, overlap_fraction=None, collectives=[], trip_counts={},
                      unknown_trip_counts=[])
    assert roof.predicted_mfu(model_flops_per_step=4e12, num_devices=2, peak_flops=1e12) == pytest.approx(0.5)
    d = roof.to_dict()
    assert d["predicted"] is True and d["step_time_s"] == 4.0


def test_flops_are_priced_at_peak_times_matmul_efficiency(mesh):
    a = jax.device_put(jnp.ones((256, 512), jnp.float32), NamedSharding(mesh, P()))
    b = jax.device_put(jnp.ones((512, 128), jnp.float32), NamedSharding(mesh, P()))
    text = jax.jit(jnp.dot).lower(a, b).compile().as_text()
    fast = R.Hardware("x", peak_flops=1e9, hbm_bandwidth=1e15, ici_link_bandwidth=1e9, dcn_bandwidth=1e9)
    slow = R.Hardware("x", peak_flops=1e9, hbm_bandwidth=1e15, ici_link_bandwidth=1e9, dcn_bandwidth=1e9,
                      matmul_efficiency=0.5)
    at_peak, at_half = R.analyze(text, fast, mesh=mesh), R.analyze(text, slow, mesh=mesh)
    assert at_peak.flops_per_step == at_half.flops_per_step >= 2 * 256 * 512 * 128
    assert at_peak.compute_s == pytest.approx(at_peak.flops_per_step / 1e9)  # compute-bound: bandwidth is huge
    assert at_half.compute_s == pytest.approx(2 * at_peak.compute_s)
    assert at_half.step_time_s == pytest.approx(2 * at_peak.step_time_s)
    # MFU stays against the nominal peak: half the sustained rate, half the MFU
    model_flops = 2 * 256 * 512 * 128
    assert at_half.predicted_mfu(model_flops, 1, 1e9) == pytest.approx(at_peak.predicted_mfu(model_flops, 1, 1e9) / 2)


def _one_instruction_bytes(text: str, name: str) -> float:
    module = R.parse_module(text)
    comp = module.computations[module.entry]
    return R.instr_bytes(module, comp, comp.by_name[name])


def test_a_fusion_counts_its_operands_and_outputs_once_not_its_intermediates():
    """A softmax-like fusion over S x S scores (as XLA fuses plain attention on TPU): the
    scores parameter is read by three fused ops but counted once; the f32 intermediates
    (convert, exp, ...) stay inside the fusion; an operand in VMEM (S(1)) is not HBM."""
    text = """HloModule m, is_scheduled=true

%fused (p0: bf16[8,256,256], p1: f32[8,256], p2: pred[256,256]) -> f32[8,256] {
  %p0 = bf16[8,256,256]{2,1,0} parameter(0)
  %p1 = f32[8,256]{1,0:S(1)} parameter(1)
  %p2 = pred[256,256]{1,0:S(1)} parameter(2)
  %c = f32[8,256,256]{2,1,0} convert(%p0)
  %m = pred[8,256,256]{2,1,0} broadcast(%p2), dimensions={1,2}
  %s = f32[8,256,256]{2,1,0} select(%m, %c, %c)
  %b = f32[8,256,256]{2,1,0} broadcast(%p1), dimensions={0,1}
  %d = f32[8,256,256]{2,1,0} subtract(%s, %b)
  %e = f32[8,256,256]{2,1,0} exponential(%d)
  %z = f32[] constant(0)
  ROOT %r = f32[8,256]{1,0} reduce(%e, %z), dimensions={2}, to_apply=%add
}

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %a = f32[] add(%x, %y)
}

ENTRY %main (scores: bf16[8,256,256], mx: f32[8,256], mask: pred[256,256]) -> f32[8,256] {
  %scores = bf16[8,256,256]{2,1,0} parameter(0)
  %mx = f32[8,256]{1,0:S(1)} parameter(1)
  %mask = pred[256,256]{1,0:S(1)} parameter(2)
  ROOT %sum = f32[8,256]{1,0} fusion(%scores, %mx, %mask), kind=kLoop, calls=%fused
}
"""
    assert _one_instruction_bytes(text, "sum") == 8 * 256 * 256 * 2 + 8 * 256 * 4


def test_an_async_slice_reads_the_slice_not_the_whole_source():
    """TPU slice-start: ((source), slice, context); the source in the tuple is an alias."""
    text = """HloModule m, is_scheduled=true

ENTRY %main (x: bf16[2,2,2048,512]) -> bf16[1,2,2048,512] {
  %x = bf16[2,2,2048,512]{3,2,1,0:T(8,128)(2,1)} parameter(0)
  %ss = ((bf16[2,2,2048,512]{3,2,1,0:T(8,128)(2,1)}), bf16[1,2,2048,512]{3,2,1,0:T(8,128)(2,1)S(1)}, s32[]{:S(2)}) slice-start(%x), slice={[0:1], [0:2], [0:2048], [0:512]}
  ROOT %sd = bf16[1,2,2048,512]{3,2,1,0:T(8,128)(2,1)S(1)} slice-done(%ss)
}
"""
    assert _one_instruction_bytes(text, "ss") == 1 * 2 * 2048 * 512 * 2  # read from HBM into VMEM
    to_hbm = text.replace("(2,1)S(1)}, s32", "(2,1)}, s32")
    assert _one_instruction_bytes(to_hbm, "ss") == 2 * (1 * 2 * 2048 * 512 * 2)  # read + write


def test_a_stacked_buffer_sliced_inside_a_nested_fusion_counts_the_slice():
    """A scan's saved activations bf16[32,6,64] passed to a fusion that hands them to a nested
    fusion which dynamic-slices one layer (as TPU fuses the per-layer read): one layer is
    read, not all 32."""
    text = """HloModule m, is_scheduled=true

%inner (q0: bf16[32,6,64], q1: s32[]) -> bf16[6,64] {
  %q0 = bf16[32,6,64]{2,1,0} parameter(0)
  %q1 = s32[] parameter(1)
  %zero = s32[] constant(0)
  %ds = bf16[1,6,64]{2,1,0} dynamic-slice(%q0, %q1, %zero, %zero), dynamic_slice_sizes={1,6,64}
  ROOT %b = bf16[6,64]{1,0} bitcast(%ds)
}

%outer (p0: bf16[32,6,64], p1: s32[], p2: bf16[64,64]) -> bf16[6,64] {
  %p0 = bf16[32,6,64]{2,1,0} parameter(0)
  %p1 = s32[] parameter(1)
  %p2 = bf16[64,64]{1,0} parameter(2)
  %layer = bf16[6,64]{1,0} fusion(%p0, %p1), kind=kLoop, calls=%inner
  ROOT %d = bf16[6,64]{1,0} dot(%layer, %p2), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main (acts: bf16[32,6,64], i: s32[], w: bf16[64,64]) -> bf16[6,64] {
  %acts = bf16[32,6,64]{2,1,0} parameter(0)
  %i = s32[] parameter(1)
  %w = bf16[64,64]{1,0} parameter(2)
  ROOT %f = bf16[6,64]{1,0} fusion(%acts, %i, %w), kind=kOutput, calls=%outer
}
"""
    one_layer, weight, out, index = 6 * 64 * 2, 64 * 64 * 2, 6 * 64 * 2, 4
    assert _one_instruction_bytes(text, "f") == one_layer + index + weight + out
    read_whole = text.replace("%layer = bf16[6,64]{1,0} fusion(%p0, %p1), kind=kLoop, calls=%inner",
                              "%layer = bf16[6,64]{1,0} fusion(%p0, %p1), kind=kLoop, calls=%inner\n"
                              "  %all = bf16[32,6,64]{2,1,0} negate(%p0)")
    assert _one_instruction_bytes(read_whole, "f") == 32 * one_layer + index + weight + out


def test_a_padded_operand_sliced_inside_a_fusion_counts_the_slices():
    """The windowed-einsum loop of tensor parallelism (a v5p-1024 512B step, fsdp 32 x tensor 16)
    pads the activation bf16[32,2048,1,20480] to 2 along one dim and dynamic-slices 640 of its
    20480 columns, twice, inside the fusion that feeds the matmul: each iteration reads two
    1/32 slices, not the whole activation (which priced six such fusions of every iteration as
    memory-bound at 1.3 s a step each). A pad read whole still counts the whole operand."""
    text = """HloModule m, is_scheduled=true

%slices (a0: bf16[4,1,64], a1: s32[], a2: s32[]) -> bf16[4,2,8] {
  %a0 = bf16[4,1,64]{2,1,0} parameter(0)
  %a1 = s32[] parameter(1)
  %a2 = s32[] parameter(2)
  %inf = bf16[] constant(-inf)
  %zero = s32[] constant(0)
  %pad.1 = bf16[4,2,64]{2,1,0} pad(%a0, %inf), padding=0_0x0_1x0_0
  %ds.1 = bf16[4,2,8]{2,1,0} dynamic-slice(%pad.1, %zero, %zero, %a1), dynamic_slice_sizes={4,2,8}
  %pad.2 = bf16[4,2,64]{2,1,0} pad(%a0, %inf), padding=0_0x1_0x0_0
  %ds.2 = bf16[4,2,8]{2,1,0} dynamic-slice(%pad.2, %zero, %zero, %a2), dynamic_slice_sizes={4,2,8}
  ROOT %m = bf16[4,2,8]{2,1,0} maximum(%ds.1, %ds.2)
}

%outer (p0: bf16[4,1,64], p1: s32[], p2: s32[], p3: bf16[8,8]) -> bf16[4,2,8] {
  %p0 = bf16[4,1,64]{2,1,0} parameter(0)
  %p1 = s32[] parameter(1)
  %p2 = s32[] parameter(2)
  %p3 = bf16[8,8]{1,0} parameter(3)
  %x = bf16[4,2,8]{2,1,0} fusion(%p0, %p1, %p2), kind=kLoop, calls=%slices
  ROOT %d = bf16[4,2,8]{2,1,0} dot(%x, %p3), lhs_contracting_dims={2}, rhs_contracting_dims={0}
}

ENTRY %main (acts: bf16[4,1,64], i: s32[], j: s32[], w: bf16[8,8]) -> bf16[4,2,8] {
  %acts = bf16[4,1,64]{2,1,0} parameter(0)
  %i = s32[] parameter(1)
  %j = s32[] parameter(2)
  %w = bf16[8,8]{1,0} parameter(3)
  ROOT %f = bf16[4,2,8]{2,1,0} fusion(%acts, %i, %j, %w), kind=kOutput, calls=%outer
}
"""
    slice_bytes, weight, out, indices = 4 * 2 * 8 * 2, 8 * 8 * 2, 4 * 2 * 8 * 2, 2 * 4
    assert _one_instruction_bytes(text, "f") == 2 * slice_bytes + indices + weight + out
    whole = 4 * 64 * 2
    assert 2 * slice_bytes < whole
    read_whole = text.replace("ROOT %m = bf16[4,2,8]{2,1,0} maximum(%ds.1, %ds.2)",
                              "%n = bf16[4,2,64]{2,1,0} negate(%pad.1)\n"
                              "  ROOT %m = bf16[4,2,8]{2,1,0} maximum(%ds.1, %ds.2)")
    assert _one_instruction_bytes(read_whole, "f") == whole + indices + weight + out


def test_an_all_reduce_fused_with_its_slice_is_a_reduce_scatter():
    """The TPU compiler writes a reduce-scatter (the fsdp gradient reduction) as a fusion around
    an all-reduce whose output is the device's 1/n slice: one pass of (n-1)/n of the operand,
    not an all-reduce's two. An all-reduce fused with work that keeps its full size stays one."""
    text = """HloModule m, num_partitions=4

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

%all-reduce-scatter.1 (input_0: f32[256], pid: u32[]) -> f32[64] {
  %input_0 = f32[256]{0} parameter(0)
  %pid = u32[] parameter(1)
  %all-reduce.1 = f32[256]{0} all-reduce(%input_0), channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=%add
  %c64 = u32[] constant(64)
  %off = u32[] multiply(%pid, %c64)
  ROOT %ds = f32[64]{0} dynamic-slice(%all-reduce.1, %off), dynamic_slice_sizes={64}
}

%all-reduce-fused.2 (input_1: f32[256]) -> f32[256] {
  %input_1 = f32[256]{0} parameter(0)
  %all-reduce.2 = f32[256]{0} all-reduce(%input_1), channel_id=2, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=%add
  ROOT %neg = f32[256]{0} negate(%all-reduce.2)
}

ENTRY %main (a: f32[256], b: f32[256], p: u32[]) -> (f32[64], f32[256]) {
  %a = f32[256]{0} parameter(0)
  %b = f32[256]{0} parameter(1)
  %p = u32[] parameter(2)
  %fusion.1 = f32[64]{0} fusion(%a, %p), kind=kOutput, calls=%all-reduce-scatter.1
  %fusion.2 = f32[256]{0} fusion(%b), kind=kOutput, calls=%all-reduce-fused.2
  ROOT %t = (f32[64]{0}, f32[256]{0}) tuple(%fusion.1, %fusion.2)
}
"""
    roof = R.analyze(text, HW)
    by_name = {c.name: c for c in roof.collectives}
    scatter, full = by_name["all-reduce.1"], by_name["all-reduce.2"]
    assert (scatter.kind, scatter.group_size) == ("reduce-scatter", 4)
    assert scatter.bytes_per_execution == pytest.approx(1024 * 3 / 4)
    assert (full.kind, full.bytes_per_execution) == ("all-reduce", pytest.approx(2 * 1024 * 3 / 4))
    assert scatter.seconds == pytest.approx(full.seconds / 2)


def test_an_in_place_update_of_a_stacked_buffer_writes_the_update_and_reads_nothing_of_the_buffer():
    """A scan saving one layer's activations into its stacked buffer (a fusion whose root is a
    dynamic-update-slice of parameter 0, aliased to its result): the update is read from its operand
    and written into the buffer; nothing of the buffer is read (issue 41: counting a read of the slice
    too put 3-48 ms a step on the v5e chip's points, benchmarks/calibrate_onchip.py)."""
    text = """HloModule m, is_scheduled=true

%save (p0: f32[12,8,256], p1: s32[], p2: f32[8,256]) -> f32[12,8,256] {
  %p0 = f32[12,8,256]{2,1,0} parameter(0)
  %p2 = f32[8,256]{1,0} parameter(2)
  %b = f32[1,8,256]{2,1,0} bitcast(%p2)
  %p1 = s32[] parameter(1)
  %zero = s32[] constant(0)
  ROOT %dus = f32[12,8,256]{2,1,0} dynamic-update-slice(%p0, %b, %p1, %zero, %zero)
}

ENTRY %main (buf: f32[12,8,256], i: s32[], x: f32[8,256]) -> f32[12,8,256] {
  %buf = f32[12,8,256]{2,1,0} parameter(0)
  %i = s32[] parameter(1)
  %x = f32[8,256]{1,0} parameter(2)
  ROOT %f = f32[12,8,256]{2,1,0} fusion(%buf, %i, %x), kind=kLoop, calls=%save
}
"""
    layer, index = 8 * 256 * 4, 4
    assert _one_instruction_bytes(text, "f") == layer + index + layer  # the update read, then written


def test_an_allocated_buffer_moves_no_bytes():
    """TPU's AllocateBuffer custom call gives the stacked buffer a scan then fills in place: it
    writes nothing (priced at its result, 11-43 ms a step on the v5e chip's points)."""
    text = """HloModule m, is_scheduled=true

ENTRY %main () -> f32[12,8,256] {
  ROOT %a = f32[12,8,256]{2,1,0:T(8,128)} custom-call(), custom_call_target="AllocateBuffer"
}
"""
    assert _one_instruction_bytes(text, "a") == 0
    other = text.replace('"AllocateBuffer"', '"SomethingElse"')
    assert _one_instruction_bytes(other, "a") == 12 * 8 * 256 * 4

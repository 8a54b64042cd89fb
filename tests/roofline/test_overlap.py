"""Communication overlap read from the compiled schedule (search/planning/roofline/schedule.py): small
hand-written scheduled HLO modules whose exposed communication is computed by hand. The step
compiled for a TPU topology with libtpu is read in tests/search/planning/test_tpu_targets.py."""
import os

from paxsearch.trainer.flagsets import DEVICE_COUNT_FLAG, with_device_count  # noqa: E402  (imports no JAX)

os.environ["JAX_PLATFORMS"] = "cpu"
if DEVICE_COUNT_FLAG not in os.environ.get("XLA_FLAGS", ""):  # conftest sets 8
    os.environ["XLA_FLAGS"] = with_device_count(os.environ.get("XLA_FLAGS"), 8)

import pytest

from paxsearch.search.planning import roofline as R

US = 1e-6
# Round figures: a dot f32[100,500] x f32[500,100] is 2 x 100 x 100 x 500 = 1e7 FLOPs = 10 us
# (its 440,000 bytes take 0.44 us, so it is compute-bound). An all-gather of f32[16,125]
# (8,000 bytes) over 4 devices moves 3 x 8,000 bytes over 2 links of 1e9 B/s = 12 us, plus
# 3 hops x 1 us = 15 us. A collective-permute of the same buffer: 8,000 B over one link = 8 us
# + 1 hop = 9 us.
HW = R.Hardware("round", peak_flops=1e12, hbm_bandwidth=1e12, ici_link_bandwidth=1e9, dcn_bandwidth=1e9,
                physical_dims=1, ici_latency_s=1 * US, dcn_latency_s=0.0)
DOT_S, GATHER_S, PERMUTE_S = 10 * US, 15 * US, 9 * US

PARAMS = """  %a = f32[100,500]{1,0} parameter(0)
  %b = f32[500,100]{1,0} parameter(1)
  %x = f32[16,125]{1,0} parameter(2)
  %y = f32[16,125]{1,0} parameter(3)
"""
DOT = "  %{n} = f32[100,100]{{1,0}} dot(f32[100,500]{{1,0}} %a, f32[500,100]{{1,0}} %b), " \
      "lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}\n"
AG_START = "  %{n} = (f32[16,125]{{1,0}}, f32[64,125]{{1,0}}) all-gather-start(f32[16,125]{{1,0}} %{src}), " \
           "channel_id={ch}, replica_groups={{{{0,1,2,3}}}}, dimensions={{0}}, use_global_device_ids=true\n"
AG_DONE = "  %{n} = f32[64,125]{{1,0}} all-gather-done((f32[16,125]{{1,0}}, f32[64,125]{{1,0}}) %{start})\n"
AG_SYNC = "  %{n} = f32[64,125]{{1,0}} all-gather(f32[16,125]{{1,0}} %{src}), channel_id={ch}, " \
          "replica_groups={{{{0,1,2,3}}}}, dimensions={{0}}, use_global_device_ids=true\n"
CP_START = "  %{n} = (f32[16,125]{{1,0}}, f32[16,125]{{1,0}}, u32[], u32[]) collective-permute-start(" \
           "f32[16,125]{{1,0}} %{src}), channel_id={ch}, source_target_pairs={pairs}\n"
CP_DONE = "  %{n} = f32[16,125]{{1,0}} collective-permute-done((f32[16,125]{{1,0}}, f32[16,125]{{1,0}}, u32[], u32[]) " \
          "%{start})\n"
FORWARD = "{{0,1},{1,2},{2,3},{3,0}}"
BACKWARD = "{{0,3},{1,0},{2,1},{3,2}}"


def module(body: str, root: str, scheduled: bool = True) -> str:
    header = "HloModule m, is_scheduled=true" if scheduled else "HloModule m"
    return (f"{header}\n\nENTRY %main (a: f32[100,500], b: f32[500,100], x: f32[16,125], y: f32[16,125]) -> f32[1] {{\n"
            f"{PARAMS}{body}  ROOT %out = tuple({root})\n}}\n")


def analyze(text):
    return R.analyze(text, HW, num_devices=4)


def test_the_round_figures():
    text = module(AG_START.format(n="s", src="x", ch=1) + DOT.format(n="d") + AG_DONE.format(n="g", start="s"), "%d, %g")
    roof = analyze(text)
    (c,) = roof.collectives
    assert c.seconds == pytest.approx(GATHER_S)
    assert roof.compute_s == pytest.approx(DOT_S) and roof.roofline_s == pytest.approx(DOT_S)


def test_an_async_all_gather_hidden_behind_two_dots():
    body = AG_START.format(n="s", src="x", ch=1) + DOT.format(n="d1") + DOT.format(n="d2") + AG_DONE.format(n="g", start="s")
    roof = analyze(module(body, "%d1, %d2, %g"))
    assert roof.overlap == "schedule" and roof.overlap_fraction is None
    assert roof.comm_s == pytest.approx(15 * US)
    assert roof.exposed_comm_s == pytest.approx(0.0, abs=1e-15)  # 20 us of work hide 15 us
    assert roof.step_time_s == pytest.approx(20 * US)


def test_a_collective_longer_than_its_window_is_exposed_by_the_difference():
    body = (AG_START.format(n="s", src="x", ch=1) + DOT.format(n="d1") + AG_DONE.format(n="g", start="s")
            + DOT.format(n="d2"))
    roof = analyze(module(body, "%d1, %d2, %g"))
    assert roof.exposed_comm_s == pytest.approx(GATHER_S - DOT_S)  # 5 us
    assert roof.step_time_s == pytest.approx(2 * DOT_S + 5 * US)
    assert roof.collectives[0].exposed_s == pytest.approx(5 * US)


def test_a_synchronous_collective_is_fully_exposed():
    body = DOT.format(n="d1") + AG_SYNC.format(n="g", src="x", ch=1) + DOT.format(n="d2")
    roof = analyze(module(body, "%d1, %d2, %g"))
    assert roof.exposed_comm_s == pytest.approx(GATHER_S)
    assert roof.step_time_s == pytest.approx(2 * DOT_S + GATHER_S)


def test_two_overlapping_ring_collectives_queue_on_the_links():
    # both start at 0; the first runs 0-15 us, the second waits for the links: 15-30 us;
    # the dots end at 20 us: the first is hidden, the second stalls 10 us
    body = (AG_START.format(n="s1", src="x", ch=1) + AG_START.format(n="s2", src="y", ch=2) + DOT.format(n="d1")
            + DOT.format(n="d2") + AG_DONE.format(n="g1", start="s1") + AG_DONE.format(n="g2", start="s2"))
    roof = analyze(module(body, "%d1, %d2, %g1, %g2"))
    assert roof.comm_s == pytest.approx(2 * GATHER_S)
    by_name = {c.name: c.exposed_s for c in roof.collectives}
    assert by_name["s1"] == pytest.approx(0.0, abs=1e-15) and by_name["s2"] == pytest.approx(10 * US)
    assert roof.step_time_s == pytest.approx(30 * US)


@pytest.mark.parametrize("second, exposed", [(BACKWARD, 0.0), (FORWARD, 2 * PERMUTE_S - DOT_S)])
def test_permutes_in_opposite_directions_run_side_by_side_and_the_same_direction_queues(second, exposed):
    body = (CP_START.format(n="p1", src="x", ch=1, pairs=FORWARD) + CP_START.format(n="p2", src="y", ch=2, pairs=second)
            + DOT.format(n="d1") + CP_DONE.format(n="q1", start="p1") + CP_DONE.format(n="q2", start="p2"))
    roof = analyze(module(body, "%d1, %q1, %q2"))
    assert [c.seconds for c in roof.collectives] == pytest.approx([PERMUTE_S, PERMUTE_S])
    assert roof.exposed_comm_s == pytest.approx(exposed, abs=1e-15)
    assert roof.step_time_s == pytest.approx(DOT_S + exposed)


# The loop both loop tests share: state (counter, a, b, x), 4 iterations; the body's
# parameters and counter, the condition, and the entry's parameters up to the loop's init.
LOOP_BODY_HEAD = """(p: (s32[], f32[100,500], f32[500,100], f32[16,125])) -> (s32[], f32[100,500], f32[500,100], f32[16,125]) {
  %p = (s32[], f32[100,500]{1,0}, f32[500,100]{1,0}, f32[16,125]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %a = f32[100,500]{1,0} get-tuple-element(%p), index=1
  %b = f32[500,100]{1,0} get-tuple-element(%p), index=2
  %x = f32[16,125]{1,0} get-tuple-element(%p), index=3
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
"""
LOOP_COND_AND_ENTRY_HEAD = """%cond (q: (s32[], f32[100,500], f32[500,100], f32[16,125])) -> pred[] {
  %q = (s32[], f32[100,500]{1,0}, f32[500,100]{1,0}, f32[16,125]{1,0}) parameter(0)
  %j = s32[] get-tuple-element(%q), index=0
  %n = s32[] constant(4)
  ROOT %lt = pred[] compare(%j, %n), direction=LT
}

ENTRY %main (a: f32[100,500], b: f32[500,100], x: f32[16,125]) -> f32[16,125] {
  %a = f32[100,500]{1,0} parameter(0)
  %b = f32[500,100]{1,0} parameter(1)
  %x = f32[16,125]{1,0} parameter(2)
  %zero = s32[] constant(0)
"""


def test_a_loop_body_exposes_its_stall_once_per_iteration():
    text = f"""HloModule m, is_scheduled=true

%body {LOOP_BODY_HEAD}{AG_START.format(n="s", src="x", ch=1)}{DOT.format(n="d")}{AG_DONE.format(n="g", start="s")}  ROOT %t = (s32[], f32[100,500]{{1,0}}, f32[500,100]{{1,0}}, f32[16,125]{{1,0}}) tuple(%next, %a, %b, %x)
}}

{LOOP_COND_AND_ENTRY_HEAD}  %init = (s32[], f32[100,500]{{1,0}}, f32[500,100]{{1,0}}, f32[16,125]{{1,0}}) tuple(%zero, %a, %b, %x)
  %w = (s32[], f32[100,500]{{1,0}}, f32[500,100]{{1,0}}, f32[16,125]{{1,0}}) while(%init), condition=%cond, body=%body
  ROOT %out = f32[16,125]{{1,0}} get-tuple-element(%w), index=3
}}
"""
    roof = analyze(text)
    assert roof.trip_counts == {"w": 4}
    # per iteration: 10 us of dot and a 15 us gather: 5 us exposed. The scalar ops: the add
    # moves 4 + 4 + 4 B in each of 4 iterations, the compare 4 + 4 + 1 B in each of 5 tests
    scalars = (4 * 12 + 5 * 9) / HW.hbm_bandwidth
    assert roof.roofline_s == pytest.approx(4 * DOT_S + scalars)
    assert roof.exposed_comm_s == pytest.approx(4 * 5 * US)
    assert roof.step_time_s == pytest.approx(4 * DOT_S + scalars + 4 * 5 * US)



def _ag_dot(name: str) -> str:
    """A TPU async-collective fusion: a dot (10 us) carrying a copy of the all-gather of
    channel 1 (15 us); each copy has its own fused computation, as XLA writes them."""
    return f"""%{name} (p0: f32[100,500], p1: f32[500,100], p2: f32[16,125]) -> (f32[100,100], f32[64,125]) {{
  %p0 = f32[100,500]{{1,0}} parameter(0)
  %p1 = f32[500,100]{{1,0}} parameter(1)
  %p2 = f32[16,125]{{1,0}} parameter(2)
  %d = f32[100,100]{{1,0}} dot(f32[100,500]{{1,0}} %p0, f32[500,100]{{1,0}} %p1), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  %g = f32[64,125]{{1,0}} all-gather(f32[16,125]{{1,0}} %p2), channel_id=1, replica_groups={{{{0,1,2,3}}}}, dimensions={{0}}, use_global_device_ids=true
  ROOT %t = (f32[100,100]{{1,0}}, f32[64,125]{{1,0}}) tuple(%d, %g)
}}

"""


def _carry(n: str, fused: str) -> str:
    return (f"  %{n} = (f32[100,100]{{1,0}}, f32[64,125]{{1,0}}) fusion(f32[100,500]{{1,0}} %a, f32[500,100]{{1,0}} %b, "
            f"f32[16,125]{{1,0}} %x), kind=kOutput, calls=%{fused}\n")


WINDOWED_LOOP = f"""HloModule m, is_scheduled=true

{_ag_dot("ag_start")}{_ag_dot("ag_step_1")}{_ag_dot("ag_step_2")}{_ag_dot("ag_done")}%windowed_dot_general_body_ag {LOOP_BODY_HEAD}{_carry("f1", "ag_step_1")}  %cp1 = f32[16,125]{{1,0}} collective-permute(f32[16,125]{{1,0}} %x), channel_id=2, source_target_pairs={FORWARD}
{_carry("f2", "ag_step_2")}  %cp2 = f32[16,125]{{1,0}} collective-permute(f32[16,125]{{1,0}} %cp1), channel_id=3, source_target_pairs={FORWARD}
  ROOT %t = (s32[], f32[100,500]{{1,0}}, f32[500,100]{{1,0}}, f32[16,125]{{1,0}}) tuple(%next, %a, %b, %cp2)
}}

{LOOP_COND_AND_ENTRY_HEAD}{_carry("s", "ag_start")}  %init = (s32[], f32[100,500]{{1,0}}, f32[500,100]{{1,0}}, f32[16,125]{{1,0}}) tuple(%zero, %a, %b, %x)
  %w = (s32[], f32[100,500]{{1,0}}, f32[500,100]{{1,0}}, f32[16,125]{{1,0}}) while(%init), condition=%cond, body=%windowed_dot_general_body_ag
{_carry("e", "ag_done")}  ROOT %out = f32[16,125]{{1,0}} get-tuple-element(%w), index=3
}}
"""


def test_a_chain_started_before_a_windowed_einsum_loop_is_one_transfer_hidden_by_the_loop():
    # The shape of a TPU tensor-parallel layer (v5e-64, fsdp 4 x tensor 16, the 128B's widths):
    # the layer body starts an async-collective chain (channel 1) in one fusion, runs XLA's
    # windowed-einsum loop, whose body computes in fusions carrying copies of the same
    # channel and sends the next shard with plain (synchronous) collective-permutes, and
    # ends the chain in a fusion after the loop. By hand: the chain is one all-gather of 15 us,
    # issued after %s (10 us) and done at %e after the loop's 4 x (10 + 9 + 10 + 9) us: hidden.
    # The permutes are synchronous: 8 x 9 us, all exposed. Step: 10 + 4 x 38 + 10 us + the
    # loop counter's scalar ops. (Read as a chain started and done in every iteration, the
    # gather ran 4 times, 60 us, and each iteration's first permute queued behind it: 24 us.)
    roof = analyze(WINDOWED_LOOP)
    assert roof.trip_counts == {"w": 4}
    from paxsearch.search.planning.roofline.collectives import chain_homes
    module = R.parse_module(WINDOWED_LOOP)
    assert chain_homes(module, R.call_graph(module)) == {"all-gather:1": {"main"}}
    body = module.computations["windowed_dot_general_body_ag"]
    assert R.events(module, body) == {"cp1": ("sync", ["collective-permute:2"]),
                                      "cp2": ("sync", ["collective-permute:3"])}
    assert R.events(module, module.computations["main"]) == {"s": ("open", ["all-gather:1"]),
                                                             "e": ("close", ["all-gather:1"])}
    by_kind = {c.kind: c for c in roof.collectives if c.kind == "all-gather"}
    gather = by_kind["all-gather"]
    assert gather.executions == 1 and gather.seconds == pytest.approx(GATHER_S)
    assert gather.exposed_s == pytest.approx(0.0, abs=1e-15)
    permutes = [c for c in roof.collectives if c.kind == "collective-permute"]
    assert [c.executions for c in permutes] == [4, 4]
    assert sum(c.exposed_s for c in permutes) == pytest.approx(8 * PERMUTE_S)
    assert roof.comm_s == pytest.approx(GATHER_S + 8 * PERMUTE_S)
    scalars = (4 * 12 + 5 * 9) / HW.hbm_bandwidth
    assert roof.roofline_s == pytest.approx(10 * DOT_S + scalars)
    assert roof.exposed_comm_s == pytest.approx(8 * PERMUTE_S)
    assert roof.step_time_s == pytest.approx(10 * DOT_S + scalars + 8 * PERMUTE_S)


def test_unscheduled_hlo_falls_back_to_the_fixed_fraction():
    body = AG_START.format(n="s", src="x", ch=1) + DOT.format(n="d1") + AG_DONE.format(n="g", start="s")
    roof = analyze(module(body, "%d1, %g", scheduled=False))
    assert roof.overlap == "fixed_fraction" and roof.overlap_fraction == R.OVERLAP_FRACTION
    assert roof.exposed_comm_s == pytest.approx(GATHER_S - R.OVERLAP_FRACTION * DOT_S)
    assert roof.to_dict()["overlap"] == "fixed_fraction"


def test_latency_per_hop_is_a_hardware_field():
    body = AG_SYNC.format(n="g", src="x", ch=1) + DOT.format(n="d")
    hw = R.Hardware("slow hops", 1e12, 1e12, 1e9, 1e9, 1, ici_latency_s=10 * US)
    (c,) = R.analyze(module(body, "%d, %g"), hw, num_devices=4).collectives
    assert c.seconds == pytest.approx(12 * US + 3 * 10 * US)
    assert R.Hardware("d", 1, 1, 1, 1).ici_latency_s == R.ICI_STEP_LATENCY_S
    assert R.Hardware("d", 1, 1, 1, 1).dcn_latency_s == R.DCN_STEP_LATENCY_S
    from paxsearch.search.planning.roofline.collectives import _hops
    assert _hops("all-reduce", 4) == 6 and _hops("all-gather", 4) == 3 and _hops("collective-permute", 4) == 1


# The step compiled for v5e-16 and read from its schedule: tests/search/planning/test_tpu_targets.py
# (test_a_step_compiled_for_v5e_16_is_read_from_its_schedule), which shares that compile with
# the MFU test there.


def test_ring_steps_follow_the_torus_dimensions():
    class Dev:
        def __init__(self, i):
            self.slice_index, self.coords = 0, (i % 4, i // 4, 0)

    import numpy as np

    layout = R.DeviceLayout(np.array([Dev(i) for i in range(16)], dtype=object).reshape(1, 16, 1),
                            ("data", "fsdp", "tensor"))
    assert layout.ring_steps([list(range(16))]) == 3 + 3  # one ring along x, then one along y
    assert layout.ring_steps([[0, 1, 2, 3], [4, 5, 6, 7]]) == 3  # along x only
    assert layout.ring_steps([[0, 5]]) == 1  # never more than n - 1
    assert R.DeviceLayout(None, None).ring_steps([list(range(16))]) is None
    from paxsearch.search.planning.roofline.collectives import _hops
    assert _hops("all-gather", 16, 6) == 6 and _hops("all-reduce", 16, 6) == 12 and _hops("all-gather", 16) == 15

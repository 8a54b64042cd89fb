"""Host offload as the compiled program's own text prints it (search/planning/roofline/host.py): a full
compile's `as_text()` (and so every plan made by a full compile, and the chip's own trials) writes
the offloaded stacks' per-layer moves as dynamic-slice-start / -done out of, and
dynamic-update-slice-start / -done into, a buffer in host memory (`S(5)`), where the HLO passes'
dump prints async-start wrappers. Unpriced, remat=offload on the v5e chip was planned at 151 ms a
step against 264 ms measured, 116 ms of it waiting for these transfers (benchmarks/RESULTS.md,
"The v5e chip's own figures, run 2")."""
import dataclasses

import pytest

from paxsearch.search.planning import roofline as R

_SRC = "bf16[16,4,2048,1024]{2,3,1,0:T(8,128)(2,1)S(5)}"
_SLICE = "bf16[1,4,2048,1024]{2,3,1,0:T(8,128)(2,1)}"
_IDX = "s32[]{:T(128)}"
SLICE_BYTES = 4 * 2048 * 1024 * 2

HLO = f"""HloModule jit_step, entry_computation_layout={{()->()}}

ENTRY %main (p0: bf16[16,4,2048,1024], p1: bf16[1,4,2048,1024], i: s32[]) -> (bf16[1,4,2048,1024], bf16[16,4,2048,1024]) {{
  %p0 = {_SRC} parameter(0)
  %p1 = {_SLICE} parameter(1)
  %i = {_IDX} parameter(2)
  %c = {_IDX} constant(0)
  %dynamic-slice-start = (({_SRC}, {_IDX}, {_IDX}, {_IDX}, {_IDX}), {_SLICE}, u32[]{{:S(2)}}) dynamic-slice-start(%p0, %i, %c, %c, %c), dynamic_slice_sizes={{1,4,2048,1024}}
  %dynamic-update-slice-start = (({_SRC}, {_SLICE}, {_IDX}, {_IDX}, {_IDX}, /*index=5*/{_IDX}), {_SRC}, u32[]{{:S(2)}}) dynamic-update-slice-start(%p0, %p1, %i, %c, %c, /*index=5*/%c)
  %dynamic-slice-done = {_SLICE} dynamic-slice-done(%dynamic-slice-start)
  %dynamic-update-slice-done = {_SRC} dynamic-update-slice-done(%dynamic-update-slice-start)
  ROOT %t = ({_SLICE}, {_SRC}) tuple(%dynamic-slice-done, %dynamic-update-slice-done)
}}
"""

HW = R.Hardware(name="v5e-like", peak_flops=197e12, hbm_bandwidth=819e9, ici_link_bandwidth=1e11,
                dcn_bandwidth=3.125e9, host_bandwidth=1.5e10)


def _host(roof):
    return {c.kind: c for c in roof.collectives if c.link == "host"}


def test_async_slices_to_and_from_host_memory_are_priced_on_the_host_link():
    roof = R.analyze(HLO, HW, num_devices=1)
    host = _host(roof)
    assert set(host) == {"host-h2d", "host-d2h"}
    for c in host.values():
        assert c.bytes_per_execution * c.executions == SLICE_BYTES
        assert c.seconds == pytest.approx(SLICE_BYTES / HW.host_bandwidth)
        # nothing computes between the starts and their -done halves: the step waits for them
        assert 0.9 * c.seconds <= c.exposed_s <= c.seconds
    unpriced = R.analyze(HLO, dataclasses.replace(HW, host_bandwidth=None), num_devices=1)
    assert not _host(unpriced)
    assert roof.step_time_s == pytest.approx(unpriced.step_time_s + sum(c.exposed_s for c in host.values()),
                                             rel=1e-6)


def test_a_slice_within_hbm_is_not_a_host_transfer():
    hbm = HLO.replace("(2,1)S(5)}", "(2,1)}")
    assert not _host(R.analyze(hbm, HW, num_devices=1))

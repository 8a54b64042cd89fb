"""benchmarks/bench_onchip.py's bookkeeping, without a study: each point's error, side and verdict,
and the summary over the trained points and the held-out half."""
from __future__ import annotations

import pytest

from paxsearch.benchmarks import bench_onchip


def _point(name, half, plan, chip, predicted=None, measured=None, chip_predicted=None, chip_bytes=None,
           measured_bytes=None):
    return bench_onchip.Point(name=name, half=half, plan_outcome=plan, chip_outcome=chip, predicted_step=predicted,
                   chip_predicted_step=chip_predicted, measured_step=measured, plan_bytes=None, chip_bytes=chip_bytes,
                   measured_bytes=measured_bytes, plan_libtpu="0.0.52", chip_libtpu="0.0.42.1")


POINTS = [
    _point("p1", "a", "ok", "ok", predicted=0.9, measured=1.0, chip_predicted=0.95, chip_bytes=10.0,
           measured_bytes=9.0),
    _point("p2", "b", "ok", "ok", predicted=1.1, measured=1.0),
    _point("p3", "b", "ok", "ok", predicted=0.8, measured=1.0),
    _point("p4", "b", "ok", "predicted_oom", predicted=0.5),  # the plan said fit, the chip's compiler refused
    _point("p5", "a", "predicted_oom", "predicted_oom"),
    _point("p6", "b", "predicted_oom", None),  # not run on the chip
    _point("p7", "a", "ok", "crash", predicted=1.0),  # a crash says nothing about memory
]


def test_each_points_error_and_verdicts():
    p1, _, p3, p4, p5, p6, p7 = POINTS
    assert p1.error == pytest.approx(-0.1) and p1.chip_error == pytest.approx(-0.05)
    assert p1.memory_error == pytest.approx(-0.1)
    assert p3.error == pytest.approx(-0.2)
    assert (p4.plan_fits, p4.chip_fits, p4.error) == (True, False, None)
    assert (p5.plan_fits, p5.chip_fits) == (False, False)
    assert p6.chip_fits is None and p7.chip_fits is None


def test_the_summary_over_trained_points_and_the_held_out_half():
    s = bench_onchip.summarize(POINTS, held_out_half="b")
    assert s.trained == 3 and s.mean_abs_error == pytest.approx((0.1 + 0.1 + 0.2) / 3)
    assert s.max_abs_error == pytest.approx(0.2)
    assert s.held_out == 2 and s.held_out_mean_abs_error == pytest.approx(0.15)
    assert (s.predicted_faster, s.predicted_slower) == (2, 1)
    assert (s.verdicts_compared, s.verdicts_agree) == (5, 4)  # p1 p2 p3 p5 agree, p4 does not
    assert s.memory_compared == 1
    text = bench_onchip.summary_text(s, POINTS)
    assert "2 predicted faster, 1 slower (67% on one side)" in text and "4 of 5 agree" in text
    assert "plan libtpu 0.0.52" in text and "chip libtpu 0.0.42.1" in text


def test_the_table_has_a_row_per_point():
    table = bench_onchip.table(POINTS).splitlines()
    assert len(table) == 2 + len(POINTS) and table[1].count("---") == table[0].count("|") - 1
    assert "| p4 | b | ok | predicted_oom |" in bench_onchip.table(POINTS)


def test_several_held_out_halves():
    more = POINTS + [_point("p8", "c", "ok", "ok", predicted=1.3, measured=1.0)]
    s = bench_onchip.summarize(more, held_out_half="b,c")
    assert s.held_out == 3 and s.held_out_max_abs_error == pytest.approx(0.3)
    assert bench_onchip.summarize(POINTS, held_out_half="c").held_out == 0


def test_a_chip_record_stands_for_the_chips_study(tmp_path):
    """A record (benchmarks/data/onchip_v5e_run*.json) gives the chip's side of a point as its study
    would: run 1's hold only half, outcome and step; run 2's also the chip's compile and peak."""
    import json

    path = tmp_path / "record.json"
    path.write_text(json.dumps({"what": "w", "command": "c", "points": {
        "p1": {"half": "a", "chip_outcome": "ok", "measured_step_s": 0.5},
        "p2": {"half": "c", "chip_outcome": "predicted_oom", "chip_peak_bytes": 17.6 * 2**30,
               "chip_libtpu": "0.0.42.1"},
    }}))
    rows = bench_onchip.read_record(str(path))
    assert rows["p1"] == {"d.half": "a", "outcome": "ok", "step_time": 0.5}
    assert rows["p2"]["outcome"] == "predicted_oom" and rows["p2"]["env.libtpu"] == "0.0.42.1"
    assert "step_time" not in rows["p2"]
    assert set(bench_onchip._RECORD_KEYS.values()) <= {"outcome", "step_time", "plan.predicted_step_time",
                                                         "plan.peak_bytes", "measured_peak_bytes", "env.libtpu"}


def test_the_committed_records_read():
    """The chip's three runs as committed: every point has a half and an outcome, and a trained one a step;
    run 3 is half d, all 14 points trained."""
    import os

    data = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "data")
    for name in ("onchip_v5e_run1_measured.json", "onchip_v5e_run2_measured.json", "onchip_v5e_run3_measured.json"):
        rows = bench_onchip.read_record(os.path.join(data, name))
        assert rows and all(r["d.half"] in ("a", "b", "c", "d") and r["outcome"] for r in rows.values())
        assert all(r["step_time"] > 0 for r in rows.values() if r["outcome"] == "ok")
    run3 = bench_onchip.read_record(os.path.join(data, "onchip_v5e_run3_measured.json"))
    assert len(run3) == 14 and {r["d.half"] for r in run3.values()} == {"d"}
    assert all(r["outcome"] == "ok" for r in run3.values())

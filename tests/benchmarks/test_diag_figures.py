"""benchmarks/diag_figures.py's arithmetic, without a compile: the value a figure needs for a
target step, and the per-chip matmul rate that brings a chip's rows nearest their published steps."""
from __future__ import annotations

import pytest

from paxsearch.benchmarks import diag_figures


def _step(a: float, b: float, rate: float) -> float:
    return a + b / rate


def test_the_needed_rate_gives_the_target_step():
    a, b, now = 2.0, 7.0, 0.9
    target = _step(a, b, 0.75)
    needed = diag_figures._solve("inverse", now, _step(a, b, now), _step(a, b, 0.9 * now), target)
    assert needed == pytest.approx(0.75, rel=1e-9)
    # a latency: step = a + b x latency
    needed = diag_figures._solve("linear", 1e-6, 3.0 + 1e5 * 1e-6, 3.0 + 1e5 * 0.9e-6, 3.0 + 1e5 * 5e-6)
    assert needed == pytest.approx(5e-6, rel=1e-9)


def test_no_rate_gives_a_step_below_what_the_figure_cannot_move():
    a, b, now = 2.0, 7.0, 0.9
    assert diag_figures._solve("inverse", now, _step(a, b, now), _step(a, b, 0.9 * now), 1.5) is None


def test_the_floor_finds_the_one_rate_two_rows_share():
    rows = []
    for a, b in ((2.0, 7.0), (1.0, 9.0)):  # two rows whose published steps both need a rate of 0.8
        step, lower = _step(a, b, 0.9), _step(a, b, 0.81)
        rows.append(("v5e, one slice", 0.9, step, lower / step - 1, _step(a, b, 0.8), 0.0))
    line = diag_figures.matmul_floor(rows)
    assert "the best single rate 0.800, mean 0.0% (max 0.0%)" in line
    rows.append(("v5e, one slice", 0.9, _step(2.0, 7.0, 0.9), _step(2.0, 7.0, 0.81) / _step(2.0, 7.0, 0.9) - 1,
                 _step(2.0, 7.0, 0.95), 0.0))  # a third row needing 0.95: no rate fits all three
    assert "mean 0.0%" not in diag_figures.matmul_floor(rows).split("best single rate")[1]

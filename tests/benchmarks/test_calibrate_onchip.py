"""benchmarks/calibrate_onchip.py's arithmetic, without a compile: the splash kernels' seconds at a share
of peak (head dim 64 at half of it), the fit that uses only the half it is given, and the summary's
mean / max |error| and side bias."""
from __future__ import annotations

import pytest

from paxsearch.benchmarks import calibrate_onchip

PEAK, HBM = 100e12, 1e12


def test_attention_seconds_take_the_roofline_of_each_kernel_and_halve_the_rate_at_head_dim_64():
    kernels = [(1e12, 1e9, 128, 2.0), (1e12, 1e9, 64, 1.0)]
    # 128: 1e12 / (1e14 x 0.5) = 20 ms, twice; 64: at 0.25 of peak, 40 ms
    assert calibrate_onchip.attention_seconds(kernels, PEAK, 0.5, HBM) == pytest.approx(2 * 0.02 + 0.04)
    memory_bound = [(1e9, 1e11, 128, 1.0)]  # 0.1 s of bytes against 0.02 ms of FLOPs
    assert calibrate_onchip.attention_seconds(memory_bound, PEAK, 0.5, HBM) == pytest.approx(0.1)


def _point(name, half, fixed, flops, efficiency):
    """A point whose measured step is what `efficiency` gives its kernel."""
    measured = fixed + flops / (PEAK * efficiency)
    return calibrate_onchip.Priced(name, half, measured, None, fixed, [(flops, 0.0, 128, 1.0)])


def test_the_fit_recovers_the_rate_of_its_own_half_and_ignores_the_other():
    points = [_point("a1", "a", 0.1, 5e12, 0.5), _point("a2", "a", 0.3, 1e13, 0.5),
              _point("b1", "b", 0.2, 5e12, 0.8)]  # half b ran at another rate: it must not move the fit
    assert calibrate_onchip.fit_attention(points, "a", PEAK, HBM) == 0.5
    assert calibrate_onchip.fit_attention(points, "b", PEAK, HBM) == 0.8
    for p in points[:2]:
        assert calibrate_onchip.step_at(p, 0.5, PEAK, HBM) == pytest.approx(p.measured)


def test_the_summary_gives_mean_max_and_the_side_most_points_are_on():
    s = calibrate_onchip.summary([0.02, -0.04, 0.06, 0.01])
    assert s["n"] == 4 and s["mean"] == pytest.approx(0.0325) and s["max"] == pytest.approx(0.06)
    assert (s["faster"], s["slower"]) == (1, 3) and s["side"] == 0.75
    assert calibrate_onchip.summary([])["mean"] is None
    assert calibrate_onchip.errors({"x": 1.1, "y": 0.9}, {"x": 1.0, "y": 1.0}) == pytest.approx({"x": 0.1, "y": -0.1})

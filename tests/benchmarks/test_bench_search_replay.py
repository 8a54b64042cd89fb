"""benchmarks/bench_search.py's offline replay of steering: no steering trains every config in
order, the steering rules only skip, and scoring on independent runs (truth) picks the best
config by them, not by the replayed measurement."""
from __future__ import annotations

import pytest

from paxsearch.benchmarks import bench_search


def _rows(mfus, predicted):
    """Study rows of configs 0..n-1 with plans whose predicted step times spread (a feature)."""
    return [{"decisions": {"c": i}, "mfu": m, "plan": {"predicted_mfu": p, "predicted_step_time": 0.01 * (i + 1)}}
            for i, (m, p) in enumerate(zip(mfus, predicted, strict=True))]


def test_no_steering_trains_every_config_and_finds_the_best_at_its_position():
    rows = _rows([0.1, 0.2, 0.3, 0.4, 0.5, 0.6], [0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    out = bench_search.replay({"rows": rows}, orders=20)
    none = out["none"]
    assert none["best_skipped"] == 0 and none["trained_mean"] == 6
    assert out["best"] == {"c": 5} and out["scored_on"] == "the steered measurements"
    # the best's position in a random order of 6, averaged over 20 orders: between 1 and 6, and
    # after all 6 trainings every order has found it
    assert 1 <= none["trained_to_best_mean"] <= 6
    assert none["best_found_after"][15] == pytest.approx(1.0)
    for rule in ("global", "learned"):
        assert out[rule]["trained_mean"] <= 6


def test_a_perfect_prediction_skips_what_cannot_win_and_never_the_best():
    mfus = [0.05 * (i + 1) for i in range(12)]
    rows = _rows(mfus, mfus)  # measured / predicted = 1 everywhere: the bound is 1
    out = bench_search.replay({"rows": rows}, orders=30)
    assert out["global"]["best_skipped"] == 0
    assert out["global"]["trained_mean"] < out["none"]["trained_mean"]  # it skipped the dominated
    assert out["global"]["trained_to_best_mean"] <= out["none"]["trained_to_best_mean"]
    assert out["global"]["best_found_after"][5] >= out["none"]["best_found_after"][5]


def test_truth_from_independent_runs_chooses_the_best():
    rows = _rows([0.1, 0.9, 0.3, 0.4], [0.1, 0.2, 0.3, 0.4])  # config 1 measured lucky here
    other = _rows([0.1, 0.2, 0.3, 0.5], [0.1, 0.2, 0.3, 0.4])
    truth = bench_search.truth_of([rows, other])
    assert truth[bench_search._key({"c": 1})] == pytest.approx(0.55)  # the mean of both runs
    assert bench_search.replay({"rows": rows}, orders=5)["best"] == {"c": 1}
    truth = bench_search.truth_of([other])
    out = bench_search.replay({"rows": rows}, orders=5, truth=truth)
    assert out["best"] == {"c": 3} and out["best_mfu"] == 0.5
    assert out["scored_on"] == "independent runs (truth)"

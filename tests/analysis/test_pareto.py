"""Pareto front, tie tolerance, knee and best-per-objective on plain DataFrames."""
from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from paxsearch.analysis import pareto

SIGN = {"loss": 1.0, "mfu": -1.0, "memory": 1.0, "time_to_train": 1.0}
COLUMN = {"loss": "loss", "mfu": "mfu", "memory": "memory_bytes", "time_to_train": "time_to_train"}


def frame_of(rows: list[tuple], states=None) -> pd.DataFrame:
    """rows of (loss, mfu, memory_bytes); trial numbers 0..n-1."""
    frame = pd.DataFrame(rows, columns=["loss", "mfu", "memory_bytes"])
    frame.insert(0, "number", range(len(rows)))
    frame.insert(1, "state", states or ["COMPLETE"] * len(rows))
    return frame


def brute_force_front(frame: pd.DataFrame, objectives, rtol: float) -> set[int]:
    """The definition, written out pair by pair."""
    def feasible(row):
        return row["state"] == "COMPLETE" and all(
            np.isfinite(row[COLUMN[o]]) for o in objectives)

    rows = [r for _, r in frame.iterrows() if feasible(r)]
    front = set()
    for p in rows:
        dominated = False
        for q in rows:
            no_worse, better = True, False
            for o in objectives:
                a, b = SIGN[o] * p[COLUMN[o]], SIGN[o] * q[COLUMN[o]]
                margin = rtol * max(abs(a), abs(b))
                if b > a + margin:
                    no_worse = False
                if b < a - margin:
                    better = True
            dominated |= no_worse and better
        if not dominated:
            front.add(int(p["number"]))
    return front


def random_frame(seed: int, n: int = 60) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    # Coarse values so that exact ties and near-ties occur often.
    frame = frame_of(list(zip(rng.integers(20, 40, n) / 10.0,
                              rng.integers(1, 20, n) / 40.0,
                              rng.integers(1, 16, n) * 2.0 ** 28, strict=True)))
    frame.loc[rng.random(n) < 0.1, "state"] = "FAIL"
    frame.loc[rng.random(n) < 0.05, "loss"] = np.nan
    frame.loc[rng.random(n) < 0.05, "mfu"] = np.nan
    frame.loc[rng.random(n) < 0.03, "memory_bytes"] = np.inf
    frame["time_to_train"] = rng.integers(1, 30, n) * 3600.0
    frame.loc[rng.random(n) < 0.03, "time_to_train"] = np.inf  # predicted_oom: never runs
    return frame


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("objectives", [("mfu", "memory"), ("loss", "mfu"),
                                        ("loss", "mfu", "memory"), ("loss", "time_to_train", "memory")])
@pytest.mark.parametrize("rtol", [0.0, 0.05])
def test_front_equals_brute_force(seed, objectives, rtol):
    frame = random_frame(seed)
    got = set(pareto.pareto_front(frame, objectives, rtol)["number"])
    assert got == brute_force_front(frame, objectives, rtol)
    assert got, "a non-empty feasible set always has a front"


def test_failed_and_nan_trials_are_never_on_the_front():
    frame = frame_of([(1.0, 0.9, 1.0), (np.nan, 0.99, 0.5), (0.5, 0.99, 0.5),
                      (2.0, 0.5, 2.0)], states=["COMPLETE", "COMPLETE", "FAIL", "COMPLETE"])
    mask = pareto.pareto_mask(frame, ["loss", "mfu", "memory"])
    assert mask.tolist() == [True, False, False, False]
    # Without loss among the objectives, trial 1's NaN loss does not matter.
    assert set(pareto.pareto_front(frame, ["mfu", "memory"])["number"]) == {1}


def test_differences_within_tolerance_are_ties():
    # Trial 1 beats trial 0 on MFU by 0.5 %: a tie at rtol 1 %, a win at rtol 0.
    frame = frame_of([(3.0, 0.400, 1e9), (3.0, 0.402, 1e9)])
    assert set(pareto.pareto_front(frame, ["loss", "mfu", "memory"], rtol=0.0)["number"]) \
        == {1}
    assert set(pareto.pareto_front(frame, ["loss", "mfu", "memory"], rtol=0.01)["number"]) \
        == {0, 1}
    # A tie on one objective does not protect a point beaten clearly on another.
    frame = frame_of([(3.000, 0.40, 1e9), (3.001, 0.50, 1e9)])
    assert set(pareto.pareto_front(frame, ["loss", "mfu", "memory"], rtol=0.01)["number"]) \
        == {1}
    # Exact duplicates are both kept.
    frame = frame_of([(3.0, 0.4, 1e9), (3.0, 0.4, 1e9), (3.5, 0.3, 2e9)])
    assert set(pareto.pareto_front(frame)["number"]) == {0, 1}


def test_knee_and_best_per_objective_hand_made():
    gib = 2.0 ** 30
    frame = frame_of([
        (3.0, 0.10, 1 * gib),   # 0: least memory
        (2.0, 0.30, 4 * gib),   # 1: balanced -> knee
        (1.0, 0.35, 16 * gib),  # 2: best loss and best MFU, most memory
        (2.5, 0.20, 8 * gib),   # 3: dominated by 1
        (0.5, 0.90, 0.5 * gib),  # 4: would win everything but failed
    ], states=["COMPLETE"] * 4 + ["FAIL"])
    objectives = ["loss", "mfu", "memory"]
    assert set(pareto.pareto_front(frame, objectives)["number"]) == {0, 1, 2}
    assert pareto.best_per_objective(frame, objectives) == {"loss": 2, "mfu": 2, "memory": 0}
    # Normalised over the front: 0 -> (1, 1, 0), 1 -> (0.5, 0.2, 0.2), 2 -> (0, 0, 1).
    assert pareto.knee(frame, objectives) == 1
    # On MFU and memory alone: 0 -> (1, 0), 1 -> (0.2, 0.2), 2 -> (0, 1).
    assert pareto.knee(frame, ["mfu", "memory"]) == 1


def test_ties_for_best_go_to_lowest_number_and_empty_is_none():
    frame = frame_of([(1.0, 0.3, 5.0), (1.0, 0.3, 5.0)])
    assert pareto.best_per_objective(frame) == {"loss": 0, "mfu": 0, "memory": 0}
    assert pareto.knee(frame) == 0
    failed = frame_of([(1.0, 0.3, 5.0)], states=["FAIL"])
    assert pareto.best_per_objective(failed) == {"loss": None, "mfu": None, "memory": None}
    assert pareto.knee(failed) is None
    assert pareto.pareto_front(failed).empty


def test_unknown_objective_is_rejected():
    with pytest.raises(ValueError, match="subset"):
        pareto.pareto_mask(frame_of([(1.0, 0.3, 5.0)]), ["throughput"])


def test_single_objective_front_is_its_best():
    frame = random_frame(3)
    for objective in pareto.OBJECTIVES:
        front = pareto.pareto_front(frame, [objective])
        best = pareto.best_per_objective(frame, [objective])[objective]
        assert best in set(front["number"])
        values = set(SIGN[objective] * front[COLUMN[objective]])
        assert len(values) == 1  # only the (tied) best values survive


def test_all_pairs_of_front_points_are_mutually_non_dominated():
    frame = random_frame(11, n=200)
    objectives = ["loss", "mfu", "memory"]
    front = pareto.pareto_front(frame, objectives)
    cost = np.column_stack([SIGN[o] * front[COLUMN[o]] for o in objectives])
    for a, b in itertools.permutations(range(len(cost)), 2):
        assert not ((cost[a] <= cost[b]).all() and (cost[a] < cost[b]).any())


def test_complete_trials_with_a_failure_kind_are_not_feasible():
    frame = pd.DataFrame({"number": [0, 1], "state": ["COMPLETE", "COMPLETE"], "loss": [2.0, 1.0],
                          "mfu": [0.1, 0.0], "memory_bytes": [10.0, 5.0],
                          "failure_kind": [None, "predicted_oom"]})
    assert list(pareto.feasible_mask(frame, ["memory"])) == [True, False]
    assert pareto.best_per_objective(frame, ["memory"])["memory"] == 0

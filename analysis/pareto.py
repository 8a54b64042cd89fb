"""Pareto front, knee and best-per-objective over a trials DataFrame (pure functions).

Objectives are named "loss" (lower is better), "mfu" (higher), "memory" and "time_to_train"
(lower); see
OBJECTIVES for their columns. A trial is feasible for a set of objectives when its state is
COMPLETE, it carries no failure_kind (a predicted_oom trial is stored COMPLETE so that the
tuner learns the memory constraint) and its score is finite on each of them; everything else
is left out.

Tolerance: with relative tolerance rtol, two scores a, b on one objective differ only when
|a - b| > rtol * max(|a|, |b|); smaller differences are ties. Trial q dominates trial p when q
is not worse than p beyond the tolerance on every objective, and better than p beyond the
tolerance on at least one. rtol = 0 is ordinary Pareto dominance.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

# name -> (column, sign): sign * column is to be minimised.
OBJECTIVES = {"loss": ("loss", 1.0), "mfu": ("mfu", -1.0), "memory": ("memory_bytes", 1.0),
              "time_to_train": ("time_to_train", 1.0)}
DEFAULT_OBJECTIVES = ("loss", "mfu", "memory")


def _check(objectives: Sequence[str]) -> list[str]:
    objectives = list(objectives)
    unknown = [o for o in objectives if o not in OBJECTIVES]
    if unknown or not objectives:
        raise ValueError(f"objectives must be a non-empty subset of {sorted(OBJECTIVES)}, "
                         f"got {objectives}")
    return objectives


def column(objective: str) -> str:
    return OBJECTIVES[objective][0]


def feasible_mask(frame: pd.DataFrame, objectives: Sequence[str] = DEFAULT_OBJECTIVES
                  ) -> pd.Series:
    """COMPLETE trials without a failure kind and with a finite score on every given objective."""
    mask = frame["state"] == "COMPLETE"
    if "failure_kind" in frame:
        mask &= frame["failure_kind"].isna() | (frame["failure_kind"].astype(str) == "")
    for objective in _check(objectives):
        name = column(objective)
        if name not in frame:
            return pd.Series(False, index=frame.index)
        values = pd.to_numeric(frame[name], errors="coerce").to_numpy(dtype=float)
        mask &= np.isfinite(values)
    return mask.astype(bool)


def _costs(frame: pd.DataFrame, objectives: list[str]) -> np.ndarray:
    """Scores as an (n, k) array where every objective is to be minimised."""
    return np.column_stack([
        OBJECTIVES[o][1] * pd.to_numeric(frame[column(o)], errors="coerce").to_numpy(float)
        for o in objectives])


def pareto_mask(frame: pd.DataFrame, objectives: Sequence[str] = DEFAULT_OBJECTIVES,
                rtol: float = 0.0) -> pd.Series:
    """True for feasible trials that no other feasible trial dominates (see module doc)."""
    objectives = _check(objectives)
    feasible = feasible_mask(frame, objectives)
    result = pd.Series(False, index=frame.index)
    if not feasible.any():
        return result
    cost_NxK = _costs(frame[feasible], objectives)
    # One row at a time keeps memory at O(n k) for large studies.
    on_front = np.ones(len(cost_NxK), dtype=bool)
    for i, point_K in enumerate(cost_NxK):
        margin_NxK = rtol * np.maximum(np.abs(cost_NxK), np.abs(point_K))
        no_worse = (cost_NxK <= point_K + margin_NxK).all(axis=1)
        better = (cost_NxK < point_K - margin_NxK).any(axis=1)
        on_front[i] = not (no_worse & better).any()
    result[feasible] = on_front
    return result


def pareto_front(frame: pd.DataFrame, objectives: Sequence[str] = DEFAULT_OBJECTIVES,
                 rtol: float = 0.0) -> pd.DataFrame:
    """The non-dominated rows, sorted by trial number."""
    return frame[pareto_mask(frame, objectives, rtol)].sort_values("number")


def knee(frame: pd.DataFrame, objectives: Sequence[str] = DEFAULT_OBJECTIVES,
         rtol: float = 0.0) -> int | None:
    """Trial number of the front point nearest the utopia point.

    Each objective is min-max normalised over the front (0 = best, 1 = worst; an objective
    constant over the front is 0); the knee minimises the Euclidean distance to the origin.
    Ties go to the lowest trial number. None when no trial is feasible.
    """
    objectives = _check(objectives)
    front = pareto_front(frame, objectives, rtol)
    if front.empty:
        return None
    cost_NxK = _costs(front, objectives)
    low_K, span_K = cost_NxK.min(axis=0), np.ptp(cost_NxK, axis=0)
    normalised_NxK = np.divide(cost_NxK - low_K, span_K, out=np.zeros_like(cost_NxK),
                               where=span_K > 0)
    distance_N = np.linalg.norm(normalised_NxK, axis=1)
    best = np.flatnonzero(distance_N == distance_N.min())
    return int(front["number"].to_numpy()[best].min())


def best_per_objective(frame: pd.DataFrame,
                       objectives: Sequence[str] = DEFAULT_OBJECTIVES) -> dict[str, int | None]:
    """For each objective, the number of the best feasible trial on it alone (None if none).

    Feasible here means COMPLETE with a finite score on that objective. Ties go to the lowest
    trial number.
    """
    best: dict[str, int | None] = {}
    for objective in _check(objectives):
        candidates = frame[feasible_mask(frame, [objective])]
        if candidates.empty:
            best[objective] = None
            continue
        cost_N = _costs(candidates, [objective])[:, 0]
        numbers = candidates["number"].to_numpy()[cost_N == cost_N.min()]
        best[objective] = int(numbers.min())
    return best


def available_objectives(frame: pd.DataFrame,
                         objectives: Sequence[str] = DEFAULT_OBJECTIVES) -> list[str]:
    """The given objectives that at least one COMPLETE trial has a finite score for."""
    return [o for o in _check(objectives) if feasible_mask(frame, [o]).any()]

"""The report's plain answer: which trial to use, why, and the commands that run it (pure)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pandas as pd

from . import fmt, pareto, quality
from .load import decision_columns


@dataclass(frozen=True)
class Recommendation:
    number: int
    choice: str  # how it was chosen: "the knee of the Pareto front over loss, mfu, memory" | "the best mfu"
    decisions: dict[str, Any]
    scores: dict[str, str]  # objective title -> value as the report prints it
    reasons: tuple[str, ...]  # margins over the others and the memory headroom, one sentence each
    commands: tuple[str, ...]  # the commands that reuse it


def _number(row: pd.Series, column: str) -> float:
    value = pd.to_numeric(pd.Series([row.get(column)]), errors="coerce").iloc[0]
    return float(value) if pd.notna(value) else math.nan


def _mfu_reason(frame: pd.DataFrame, chosen: pd.Series, feasible: pd.DataFrame) -> str | None:
    others = feasible[feasible["number"] != chosen["number"]]
    mfu = pd.to_numeric(others["mfu"], errors="coerce").dropna()
    own = _number(chosen, "mfu")
    if mfu.empty or not math.isfinite(own) or own <= 0:
        return None
    rival = others.loc[mfu.idxmax()]
    theirs = float(mfu.max())
    if own >= theirs:
        return (f"MFU {fmt.value('mfu', own)}: {own / theirs - 1:.1%} above the runner-up, trial "
                f"{int(rival['number'])} ({fmt.value('mfu', theirs)})" if theirs > 0 else
                f"MFU {fmt.value('mfu', own)}; no other trial has a positive MFU")
    trade = f"trial {int(rival['number'])} reaches MFU {fmt.value('mfu', theirs)} ({theirs / own - 1:.1%} more)"
    their_memory, own_memory = _number(rival, "memory_bytes"), _number(chosen, "memory_bytes")
    if math.isfinite(their_memory) and math.isfinite(own_memory) and their_memory > own_memory:
        trade += (f" with {fmt.value('memory_bytes', their_memory)} per device against "
                  f"{fmt.value('memory_bytes', own_memory)} here")
    return trade + "; pick it with `--objective mfu` where memory is no concern"


def _time_reason(chosen: pd.Series, feasible: pd.DataFrame) -> str | None:
    """The full run's time against the runner-up's (the fastest other trial)."""
    others = feasible[feasible["number"] != chosen["number"]]
    times = pd.to_numeric(others["time_to_train"], errors="coerce").dropna()
    own = _number(chosen, "time_to_train")
    if times.empty or not math.isfinite(own) or own <= 0:
        return None
    rival, theirs = int(others.loc[times.idxmin(), "number"]), float(times.min())
    text = f"full run in {fmt.value('time_to_train', own)}"
    if own <= theirs:
        return (f"{text}: {theirs / own - 1:.1%} faster than the runner-up, trial {rival} "
                f"({fmt.value('time_to_train', theirs)})")
    return (f"{text}; trial {rival} would take {fmt.value('time_to_train', theirs)} ({1 - theirs / own:.1%} less), "
            "pick it with `--objective time_to_train` where the other objectives matter less")


def _memory_reason(chosen: pd.Series, predicted: bool) -> str | None:
    peak, budget = _number(chosen, "memory_bytes"), _number(chosen, "memory_budget_bytes")
    if not math.isfinite(peak):
        return None
    what = "predicted" if predicted else "compiled"
    if not math.isfinite(budget) or budget <= 0:
        return f"{fmt.value('memory_bytes', peak)} per device ({what})"
    spare = budget - peak
    return (f"fits with {fmt.value('memory_bytes', spare)} to spare per device: {what} peak "
            f"{fmt.value('memory_bytes', peak)} of a {fmt.value('memory_bytes', budget)} budget "
            f"({spare / budget:.0%} free)")


def recommend(frame: pd.DataFrame, objectives: list[str], knee: int | None, run_ref: str,
              predicted: bool) -> Recommendation | None:
    """The knee of the Pareto front (with one objective: its best trial), with its margins and
    headroom. run_ref is how the commands name the study (the run folder as the user gave it, or
    `URL --study NAME`). None when no trial has finite scores."""
    if not objectives:
        return None
    if len(objectives) == 1:
        number = pareto.best_per_objective(frame, objectives)[objectives[0]]
        choice = f"the best {objectives[0]}"
    else:
        number, choice = knee, f"the knee of the Pareto front over {', '.join(objectives)}"
    if number is None:
        return None
    chosen = frame[frame["number"] == number].iloc[0]
    feasible = frame[pareto.feasible_mask(frame, objectives)]
    decisions = {c[2:]: chosen[c] for c in decision_columns(frame) if pd.notna(chosen[c])}
    scores = {}
    for o in objectives:
        scores[fmt.title(pareto.column(o), predicted)] = fmt.value(pareto.column(o), chosen[pareto.column(o)])
        if o == "mfu" and pd.notna(chosen.get(quality.DROPPED)):  # beside MFU, which dropping raises
            scores[fmt.title(quality.DROPPED)] = fmt.value(quality.DROPPED, chosen[quality.DROPPED])
    reasons = [r for r in (_time_reason(chosen, feasible) if "time_to_train" in objectives else None,
                           _mfu_reason(frame, chosen, feasible) if "mfu" in objectives else None,
                           _memory_reason(chosen, predicted)) if r]
    if "loss" in objectives and len(feasible) > 1:
        losses = pd.to_numeric(feasible["loss"], errors="coerce")
        rank = int((losses < _number(chosen, "loss")).sum()) + 1
        reasons.append(f"loss {fmt.value('loss', chosen['loss'])}, rank {rank} of {len(feasible)} scored trials")
    reasons += quality.notes(chosen, frame, feasible)  # what dropping tokens and int8 cost in quality
    commands = (f"paxsearch train {run_ref} --trial {number} --steps N",
                f"paxsearch best {run_ref} --objective {'knee' if len(objectives) > 1 else objectives[0]} "
                f"--export trial{number}.json")
    return Recommendation(int(number), choice, decisions, scores, tuple(reasons), commands)

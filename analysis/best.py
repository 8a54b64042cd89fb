"""Pick one trial of a study (best on an objective, or the knee) and return its Fiddle config."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from ..store import compiler
from ..store.outcome import plan_of
from . import fmt, pareto, quality
from .load import Source, decision_columns, objective_names, open_study, trials_frame

SCORES = ("loss", "mfu", quality.DROPPED, "memory_bytes", "time_to_train", "eval_loss", "tokens_per_sec")

CHOICES = ("mfu", "loss", "memory", "time_to_train", "knee")


def study_objectives(study_objective_names: list[str], frame: pd.DataFrame) -> list[str]:
    """The study's objectives that pareto knows and that some completed trial has scored."""
    known = [n for n in study_objective_names if n in pareto.OBJECTIVES]
    return pareto.available_objectives(frame, known or pareto.DEFAULT_OBJECTIVES)


def best_trial(source: Source, objective: str = "knee", study_name: str | None = None,
               rtol: float = 0.0) -> tuple[int, str]:
    """(trial number, Fiddle-serialized config JSON) of the chosen trial.

    objective: "mfu" (highest), "loss", "memory" or "time_to_train" (lowest), or "knee" (the Pareto point
    nearest the utopia point over the study's objectives, see pareto.knee).
    """
    chosen = choose(source, objective, study_name, rtol)
    return chosen.number, chosen.config


@dataclass(frozen=True)
class Chosen:
    number: int
    config: str  # Fiddle JSON
    decisions: dict[str, Any]
    scores: dict[str, str]  # score title -> value as the report prints it
    compiler: str | None = None  # "planned with jax ..., libtpu ..." (the study's when it mixes compilers)
    # what its speed knobs cost in quality (analysis/quality.py): "drops 13.9% of tokens ...", an int8
    # pick's loss cost against bf16 (over the tolerance said so)
    notes: tuple[str, ...] = ()


def choose(source: Source, objective: str = "knee", study_name: str | None = None, rtol: float = 0.0) -> Chosen:
    """best_trial, with the trial's decisions and scores (for `paxsearch best`)."""
    if objective not in CHOICES:
        raise ValueError(f"objective must be one of {CHOICES}, got {objective!r}")
    study = open_study(source, study_name).study
    frame = trials_frame(study)
    if objective == "knee":
        objectives = study_objectives(objective_names(study), frame)
        number = pareto.knee(frame, objectives, rtol) if objectives else None
    else:
        objectives = [objective]
        number = pareto.best_per_objective(frame, objectives)[objective]
    if number is None:
        scores = "scores" if objective == "knee" else f"{objective} score"
        raise LookupError(f"study {study.study_name!r} has no completed trial with finite "
                          f"{scores}")
    trial = next(t for t in study.get_trials(deepcopy=False) if t.number == number)
    config = trial.user_attrs.get("config")
    if config is None:
        raise LookupError(f"trial {number} of study {study.study_name!r} stores no 'config'")
    row = frame[frame["number"] == number].iloc[0]
    decisions = {c[2:]: row[c] for c in decision_columns(frame) if pd.notna(row[c])}
    scores = {fmt.title(c): fmt.value(c, row[c]) for c in SCORES if c in row and pd.notna(row[c])}
    notes = quality.notes(row, frame, frame[pareto.feasible_mask(frame, objectives)])
    return Chosen(int(number), config, decisions, scores, compiler_line(trial, study.get_trials(deepcopy=False)),
                  notes)


def compiler_line(trial, trials) -> str | None:
    """The chosen trial's compiler ("planned with jax 0.10.2, jaxlib 0.10.2, libtpu 0.0.52"), with
    the study's when the study's plans were compiled by several; None when the trial has no plan."""
    plan = plan_of(trial.user_attrs)
    if plan is None:
        return None
    line = compiler.planned_line(compiler.of_plan(plan))
    plans = [plan_of(t.user_attrs) for t in trials if not t.user_attrs.get("superseded")]
    return f"{line}; the study was {compiler.planned_with(plans)}" if compiler.mixed(plans) else line

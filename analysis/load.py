"""Open a stored study (run folder or storage URL) and flatten its trials into a DataFrame.

One row per trial. Columns:
  number, state, predicted, trial_dir, datetime_start, datetime_complete
  d.<decision>             one per decision (lists/dicts as compact JSON text)
  loss, mfu, memory_bytes, time_to_train  the objectives (trial.values where they are objectives);
                           time_to_train in seconds, the full run's (stored full_run) where not
  full_run_tokens, full_run_source  the tokens time_to_train counts, and where the count came from
  eval_loss, hfu, tokens_per_sec, step_time, measured_peak_bytes, steps   measured figures
  measured_peak_source     what measured_peak_bytes is (device peak, or process RSS on CPU)
  plan.<key>               the ahead-of-time plan figures
  planned_with             the compiler of the plan: "jax 0.10.2, jaxlib 0.10.2, libtpu 0.0.52",
                           "analytic (nothing compiled)", or "unknown" (stored before plans named it)
  failure_kind, failure_message
  outcome                  ok, a failure kind, or the Optuna state (running, pruned, ...)
  memory_budget_bytes      the per-device budget the trial's plan was held against
  math_key, loss_from_trial  the trial's math group, and the group trial whose loss it scores
  timing.<key>             plan_s, train_s, total_s
  env.<key>                jax, jaxlib, libtpu, device_kind, platform, peak_flops_per_device, ...
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

import optuna
import pandas as pd

# One URL handling for search and analysis (store/urls.py): masking, env:NAME, drivers.
from ..store import compiler
from ..store.outcome import MEASURED_KEYS, TrialOutcome, plan_of
from ..store.urls import ENV_PREFIX, driver_url, mask_url, scrub

Source = Union[str, os.PathLike, optuna.Study]

# Objective name in study.user_attrs["objectives"] -> DataFrame column.
OBJECTIVE_COLUMNS = {"loss": "loss", "mfu": "mfu", "memory": "memory_bytes", "time_to_train": "time_to_train"}
# Measured figure (store.outcome.Measured) -> DataFrame column: its own name, but the peak.
MEASURED_COLUMNS = {key: "measured_peak_bytes" if key == "peak_bytes" else key for key in MEASURED_KEYS}
# What measured_peak_bytes is: one device's peak where the platform reports it; on CPU the
# worker process's peak RSS, which a reused worker carries over from its earlier trials.
DEVICE_PEAK_SOURCE = "device peak (memory_stats)"
CPU_PEAK_SOURCE = "process peak RSS of the worker (CPU; grows across the trials a worker runs)"
SCORE_COLUMNS = ["loss", "mfu", "memory_bytes", "time_to_train", "eval_loss", "hfu", "tokens_per_sec",
                 "step_time", "measured_peak_bytes", "steps"]


@dataclass(frozen=True)
class OpenedStudy:
    study: optuna.Study
    run_dir: Path | None  # the run folder the caller named; None for a storage URL or a Study
    storage_display: str  # storage URL with any password masked


class StudyReadError(LookupError, ValueError):
    """The study's storage cannot be opened or read; one line, password masked."""


def _looks_like_url(text: str) -> bool:
    return re.match(r"^[a-zA-Z][\w+.-]*://", text) is not None or text.startswith(ENV_PREFIX)


def _load(storage: str, display: str, study_name: str | None) -> optuna.Study:
    """optuna.load_study through the search side's URL handling (env:NAME, the PostgreSQL
    driver); an unreachable or unreadable database is one line naming the storage."""
    try:
        url = driver_url(storage)
        names = optuna.get_all_study_names(url)
        if study_name is None:
            if len(names) != 1:
                raise StudyReadError(f"storage {display} holds {len(names)} studies ({names}); pass study_name")
            study_name = names[0]
        if study_name not in names:
            raise StudyReadError(f"storage {display} has no study {study_name!r}; studies: {names}")
        return optuna.load_study(study_name=study_name, storage=url)
    except StudyReadError:
        raise
    except Exception as e:  # driver missing, server down, not a database, unknown schema
        text = str(e).strip().splitlines()
        first = f"{type(e).__name__}: {text[0] if text else ''}"[:300]
        raise StudyReadError(f"cannot read storage {display}: {scrub(first, storage)}") from None


def open_study(source: Source, study_name: str | None = None) -> OpenedStudy:
    """Open a study from a run folder, a storage URL (+ study name) or a Study object."""
    if isinstance(source, optuna.Study):
        return OpenedStudy(source, None, "<optuna.Study object>")
    text = os.fspath(source)
    if _looks_like_url(text):
        display = mask_url(text)
        study = _load(text, display, study_name)
        return OpenedStudy(study, None, display)  # never a folder the storage names (trial_dir)
    run_dir = Path(text).resolve()
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run folder {run_dir} does not exist")
    meta_path = run_dir / "study.json"
    try:
        meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    except (OSError, ValueError) as e:
        raise StudyReadError(f"{meta_path} is unreadable ({type(e).__name__}); "
                             "delete it to use the run folder's study.db") from None
    storage = meta.get("storage") or f"sqlite:///{run_dir / 'study.db'}"
    if storage.startswith("sqlite:///") and not Path(storage[len("sqlite:///"):]).exists():
        raise FileNotFoundError(f"run folder {run_dir} has no study database "
                                f"({mask_url(storage)})")
    if "***" in storage:
        raise StudyReadError(f"{run_dir} uses storage {storage}; pass that storage URL (with its password, "
                             "or env:NAME) instead of the run folder")
    display = mask_url(storage)
    try:
        study = _load(storage, display, study_name or meta.get("study_name"))
    except StudyReadError as e:
        raise StudyReadError(f"run folder {run_dir}: {e}") from None
    return OpenedStudy(study, run_dir, display)


def _scalar(value: Any) -> Any:
    """Decision values as DataFrame cells: scalars kept, lists/dicts as compact JSON text."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def _finite_or_nan(value: Any) -> float:
    if value is None:
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def trial_row(trial: optuna.trial.FrozenTrial, objective_names: list[str]) -> dict:
    attrs = trial.user_attrs
    outcome = TrialOutcome.from_user_attrs(attrs)
    row: dict[str, Any] = {
        "number": trial.number,
        "state": trial.state.name,
        "predicted": outcome.predicted,
        "trial_dir": attrs.get("trial_dir"),
        "datetime_start": trial.datetime_start,
        "datetime_complete": trial.datetime_complete,
    }
    decisions = {**trial.params, **(attrs.get("decisions") or {})}
    for name, value in decisions.items():
        row[f"d.{name}"] = _scalar(value)

    measured = outcome.measured.to_dict() if outcome.measured else {}
    for key, value in measured.items():
        row[MEASURED_COLUMNS[key]] = _finite_or_nan(value)
    for column in SCORE_COLUMNS:
        row.setdefault(column, math.nan)
    memory_bytes = attrs.get("memory_bytes", outcome.memory_bytes)  # the stored objective, as stored
    if memory_bytes is not None:
        row["memory_bytes"] = _finite_or_nan(memory_bytes)
    full_run = outcome.full_run or {}  # how long the full run would take (search/trial/record.py)
    row["time_to_train"] = _finite_or_nan(full_run.get("seconds"))
    row["full_run_tokens"] = _finite_or_nan(full_run.get("tokens"))
    row["full_run_source"] = full_run.get("tokens_source")
    if trial.values is not None:  # the stored objective values are authoritative
        for name, value in zip(objective_names, trial.values, strict=False):  # names may differ from what was stored
            row[OBJECTIVE_COLUMNS.get(name, name)] = _finite_or_nan(value)

    for key, value in (outcome.plan.to_stored() if outcome.plan is not None else {}).items():  # a display format
        if key != compiler.KEY:  # one column of its own, planned_with
            row[f"plan.{key}"] = _scalar(value)  # nested figures (mesh_shape, roofline) as JSON text
    row["planned_with"] = compiler.describe(compiler.of_plan(outcome.plan)) if outcome.plan is not None else None
    platform = (outcome.env or {}).get("platform")
    if not math.isnan(row["measured_peak_bytes"]):  # what "measured peak" is on this platform
        row["measured_peak_source"] = CPU_PEAK_SOURCE if platform == "cpu" else DEVICE_PEAK_SOURCE
    row["failure_kind"] = outcome.kind.stored_text
    row["outcome"] = outcome_label(trial.state.name, row["failure_kind"])
    row["math_key"] = attrs.get("math_key")  # equal for configs that compute the same (search/tuning/steer.py)
    group = attrs.get("loss_group") or {}
    row["loss_from_trial"] = group.get("from_trial")  # the math group's trial whose loss this one scores
    row["memory_budget_bytes"] = _finite_or_nan((outcome.memory_budget or {}).get("bytes"))
    row["failure_message"] = outcome.message or None
    steered = outcome.steered or {}  # skipped after compiling as predicted dominated (--steer)
    row["steered_by"] = steered.get("dominated_by")
    for key, value in outcome.timings.items():
        row[f"timing.{key}"] = value
    for key, value in (outcome.env or {}).items():
        row[f"env.{key}"] = _scalar(value)
    return row


def outcome_label(state: str, failure_kind: str | None) -> str:
    """What became of a trial, in one word: its failure kind when it has one (a predicted_oom
    trial is COMPLETE in Optuna, with loss inf: never "ok"), "ok" for a completed trial, else its
    Optuna state in lower case (running, pruned, waiting, fail)."""
    if failure_kind:
        return failure_kind
    return "ok" if state == "COMPLETE" else state.lower()


def objective_names(study: optuna.Study) -> list[str]:
    """Objective names in the order of trial.values (from study.user_attrs["objectives"])."""
    objectives = study.user_attrs.get("objectives")
    if objectives:
        return [o["name"] for o in objectives]
    return [f"value_{i}" for i in range(len(study.directions))]


def trials_frame(study: optuna.Study) -> pd.DataFrame:
    names = objective_names(study)
    rows = [trial_row(t, names) for t in study.get_trials(deepcopy=False)]
    frame = pd.DataFrame(rows)
    if frame.empty:
        frame = pd.DataFrame(columns=["number", "state", "predicted", *SCORE_COLUMNS,
                                      "failure_kind", "failure_message", "outcome"])
    return frame.sort_values("number", ignore_index=True)


def loss_curves(study: optuna.Study) -> dict[int, list[tuple[int, float]]]:
    """number -> the training loss at each logged step of its short run ([[step, loss], ...],
    the stored `intermediate` values), for trials that trained and are not superseded; finite
    losses only."""
    curves = {}
    for trial in study.get_trials(deepcopy=False):
        attrs = trial.user_attrs
        if attrs.get("superseded") or not attrs.get("intermediate"):
            continue
        points = [(int(step), float(loss)) for step, loss in attrs["intermediate"]
                  if loss is not None and math.isfinite(float(loss))]
        if points:
            curves[trial.number] = points
    return curves


def load_trials(source: Source, study_name: str | None = None) -> pd.DataFrame:
    """All trials of a study as a DataFrame (see the module docstring for the columns)."""
    return trials_frame(open_study(source, study_name).study)


def decision_columns(frame: pd.DataFrame) -> list[str]:
    return [c for c in frame.columns if c.startswith("d.")]


def _unique(frame: pd.DataFrame, column: str) -> list:
    if column not in frame:
        return []
    return sorted({v for v in frame[column].dropna().tolist()}, key=str)


def _one_or_all(values: list) -> Any:
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def study_info(source: Source | OpenedStudy, study_name: str | None = None,
               frame: pd.DataFrame | None = None) -> dict:
    """Study-level facts for report headers.

    Environment figures (device kind, peak FLOP/s, versions) come from the trials; a value
    that differs across trials is returned as the sorted list of its values.
    """
    opened = source if isinstance(source, OpenedStudy) else open_study(source, study_name)
    study = opened.study
    if frame is None:
        frame = trials_frame(study)
    attrs = study.user_attrs
    objectives = attrs.get("objectives") or [
        {"name": n, "direction": d.name.lower()}
        for n, d in zip(objective_names(study), study.directions, strict=True)]
    completed = frame[frame["state"] == "COMPLETE"] if len(frame) else frame
    plan_only = bool(attrs.get("plan_only", False))
    info = {
        "study_name": study.study_name,
        "storage": opened.storage_display,
        "run_dir": str(opened.run_dir) if opened.run_dir else None,
        "objectives": objectives,
        "target": attrs.get("target"),
        "space_file": attrs.get("space_file"),
        "mfu_convention": attrs.get("mfu_convention"),
        "plan_only": plan_only,
        # Figures are predictions when the study is plan-only or every completed trial is.
        "predicted": plan_only or (len(completed) > 0 and bool(completed["predicted"].all())),
        "n_trials": int(len(frame)),
        "states": {k: int(v) for k, v in frame["state"].value_counts().items()}
        if len(frame) else {},
        "outcomes": {k: int(v) for k, v in frame["outcome"].value_counts().items()}
        if len(frame) and "outcome" in frame else {},
        "skipped": int(frame["steered_by"].notna().sum()) if "steered_by" in frame else 0,
    }
    # the compiler of the plans, one line; a study that mixes versions says so (store/compiler.py)
    info["planned_with"] = compiler.planned_with(plan_of(t.user_attrs) for t in study.get_trials(deepcopy=False)
                                                 if not t.user_attrs.get("superseded"))
    for key in ("device_kind", "platform", "num_devices", "jax", "jaxlib", "libtpu",
                "peak_flops_per_device", "peak_flops_source", "xla_flags"):
        info[key] = _one_or_all(_unique(frame, f"env.{key}"))
    return info

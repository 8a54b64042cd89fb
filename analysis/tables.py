"""The tables a report shows, as DataFrames derived from the trials DataFrame (pure)."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd

from .load import decision_columns

# dropped_fraction beside MFU: a mixture of experts' dropped routes raise MFU and cost quality
# (analysis/quality.py); a dense study has no such column, so its tables are as before
SCORES = ["loss", "time_to_train", "mfu", "dropped_fraction", "memory_bytes", "hfu", "tokens_per_sec", "step_time",
          "eval_loss"]


def _present(frame: pd.DataFrame, columns: list[str]) -> list[str]:
    """Columns that exist and hold at least one value."""
    return [c for c in columns if c in frame and frame[c].notna().any()]


def trial_table(frame: pd.DataFrame, on_front: pd.Series) -> pd.DataFrame:
    """Every trial: its outcome (ok or the failure kind), decisions, scores, compiled peak,
    Pareto membership, and the compiler of its plan where the study's plans had several."""
    table = frame.assign(on_front=on_front.reindex(frame.index, fill_value=False))
    if table["predicted"].any() and not table["predicted"].all():
        table["figures"] = np.where(table["predicted"], "predicted", "measured")
    columns = (["number", "outcome", *decision_columns(frame)]
               + _present(table, [*SCORES, "load_balance_loss", "plan.peak_bytes"]) + _pipelined(table)
               + ["on_front"] + (["figures"] if "figures" in table else []) + _compilers(table))
    return table[columns]


def _compilers(frame: pd.DataFrame) -> list[str]:
    """The planned_with column where the trials' plans were made by more than one compiler."""
    column = "planned_with"
    return [column] if column in frame and frame[column].dropna().nunique() > 1 else []


def _pipelined(frame: pd.DataFrame) -> list[str]:
    """The pipeline bubble column where some trial is pipelined (a stage axis > 1)."""
    column = "plan.pipeline_bubble"
    return [column] if column in frame and (pd.to_numeric(frame[column], errors="coerce") > 0).any() else []


def pareto_table(frame: pd.DataFrame, on_front: pd.Series) -> pd.DataFrame:
    front = frame[on_front.reindex(frame.index, fill_value=False)]
    columns = ["number", *decision_columns(frame), *_present(front, SCORES)]
    return front.sort_values("number")[columns]


def best_table(frame: pd.DataFrame, best: dict[str, int | None],
               knee: int | None) -> pd.DataFrame:
    """One row per objective (and the knee): the chosen trial with its scores and decisions."""
    picks = [(f"best {name}", number) for name, number in best.items()]
    picks.append(("knee", knee))
    rows = []
    by_number = frame.set_index("number")
    for label, number in picks:
        if number is None:
            continue
        row = by_number.loc[number]
        rows.append({"choice": label, "number": number,
                     **{c: row[c] for c in _present(frame, SCORES)},
                     **{c: row[c] for c in decision_columns(frame)}})
    return pd.DataFrame(rows)


def failures_by_kind(frame: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Failed trials grouped by failure kind, largest group first."""
    failed = frame[(frame["state"] == "FAIL") | frame["failure_kind"].notna()]
    if failed.empty:
        return {}
    kinds = failed["failure_kind"].fillna("unknown")
    columns = ["number", *decision_columns(frame),
               *_present(failed, ["plan.peak_bytes"]), "failure_message"]
    groups = {kind: group[columns] for kind, group in failed.groupby(kinds)}
    return dict(sorted(groups.items(), key=lambda item: (-len(item[1]), item[0])))


# (predicted column, measured column) pairs compared side by side.
PREDICTION_PAIRS = [("plan.predicted_step_time", "step_time"),
                    ("plan.predicted_mfu", "mfu"),
                    ("plan.peak_bytes", "measured_peak_bytes")]


def _decisions_key(frame: pd.DataFrame) -> pd.Series:
    columns = decision_columns(frame)
    return frame[columns].astype(str).agg("|".join, axis=1) if columns else \
        pd.Series("", index=frame.index)


def predicted_vs_measured(frame: pd.DataFrame) -> pd.DataFrame:
    """Predicted beside measured figures for configs that have both, with measured/predicted.

    A measured trial's predictions are its own plan figures; where a plan-only ("predicted")
    trial has the same decisions, its plan figures are used instead. Empty when no config
    has both.
    """
    # trained trials only: a screened-out one (predicted_oom) is COMPLETE with MFU 0 but never ran
    trained = pd.to_numeric(frame["steps"], errors="coerce").fillna(0) > 0 if "steps" in frame else True
    measured = frame[(frame["state"] == "COMPLETE") & ~frame["predicted"] & trained].copy()
    predicted = frame[(frame["state"] == "COMPLETE") & frame["predicted"]]
    if measured.empty:
        return pd.DataFrame()
    if not predicted.empty:
        by_key = predicted.assign(_key=_decisions_key(predicted)).drop_duplicates("_key")
        by_key = by_key.set_index("_key")
        keys = _decisions_key(measured)
        for plan_column, _ in PREDICTION_PAIRS:
            if plan_column in by_key:
                matched = keys.map(by_key[plan_column])
                own = measured[plan_column] if plan_column in measured else np.nan
                measured[plan_column] = matched.where(matched.notna(), own)
    columns = ["number", *decision_columns(frame)]
    if "env.device_kind" in measured:  # predictions hold for one device kind at a time
        columns.append("env.device_kind")
    # a CPU's "measured peak" is the process's peak RSS, not one device's bytes: no pair
    per_device_peak = measured["env.platform"] != "cpu" if "env.platform" in measured else True
    has_pair = pd.Series(False, index=measured.index)
    for plan_column, measured_column in PREDICTION_PAIRS:
        if plan_column not in measured or measured_column not in measured:
            continue
        guess = pd.to_numeric(measured[plan_column], errors="coerce")
        actual = pd.to_numeric(measured[measured_column], errors="coerce")
        both = guess.notna() & actual.notna()
        if measured_column == "measured_peak_bytes":
            both &= per_device_peak
        if not both.any():
            continue
        has_pair |= both
        ratio = f"ratio {measured_column}"
        measured[ratio] = (actual / guess.where(guess != 0)).where(both)
        columns += [plan_column, measured_column, ratio]
    if len(columns) == 1 + len(decision_columns(frame)):
        return pd.DataFrame()
    return measured[has_pair][columns]


STEP_NOTE = ("Where each front trial's predicted step goes (the planner's roofline, search/planning/roofline): the ops "
             "at their roofline rates, then the communication no scheduled work hides, by link: ICI within a slice, "
             "DCN between slices, host (offloaded buffers over PCIe). The parts add up to the predicted step.")
_LINKS = {"ici": "step.exposed_ici_s", "dcn": "step.exposed_dcn_s", "host": "step.exposed_host_s"}


def link_totals(roof: dict) -> dict[str, dict[str, float]]:
    """A stored roofline's collectives summed per link ("ici", "dcn", "host"): the bytes each device
    moves per step, their seconds, and the seconds no scheduled work hides."""
    totals: dict[str, dict[str, float]] = {}
    for c in roof.get("collectives") or []:
        total = totals.setdefault(c.get("link"), {"bytes": 0.0, "seconds": 0.0, "exposed_seconds": 0.0})
        for key in total:
            total[key] += float(c.get(key) or 0.0)
    return totals


def step_parts(roofline_text) -> dict | None:
    """A stored roofline (JSON text, search/planning/roofline/model.py Roofline.to_dict) split into the
    on-chip seconds, the exposed seconds per link and the collective exposed the longest; None
    where the plan holds no roofline (an analytic plan, a roofline that failed)."""
    if not isinstance(roofline_text, str):
        return None
    try:
        roof = json.loads(roofline_text)
        if not isinstance(roof, dict) or roof.get("roofline_s") is None or roof.get("step_time_s") is None:
            return None
        totals = link_totals(roof)
        parts = {"step.on_chip_s": float(roof["roofline_s"]),
                 **{column: totals.get(link, {}).get("exposed_seconds", 0.0) for link, column in _LINKS.items()}}
        largest = None
        for c in roof.get("collectives") or []:
            exposed = float(c.get("exposed_seconds") or 0.0)
            if c.get("link") not in _LINKS or exposed <= 0:
                continue
            if largest is None or exposed > largest[0]:
                over = f" over {'/'.join(map(str, c['axes']))}" if c.get("axes") else ""
                largest = (exposed, f"{c['kind']}{over} ({c['link']}), {exposed:.3g} s")
    except (ValueError, TypeError, KeyError, AttributeError):  # a stored figure that is not one: no parts
        return None
    parts["step.largest_exposed"] = largest[1] if largest else "none"
    return parts


def step_breakdown(frame: pd.DataFrame, on_front: pd.Series) -> pd.DataFrame:
    """One row per front trial whose plan has a roofline: its predicted step and the parts above."""
    if "plan.roofline" not in frame:
        return pd.DataFrame()
    front = frame[on_front.reindex(frame.index, fill_value=False)].sort_values("number")
    rows = []
    for record in front.to_dict("records"):
        parts = step_parts(record["plan.roofline"])
        if parts is not None:
            rows.append({"number": record["number"],
                         "plan.predicted_step_time": record.get("plan.predicted_step_time", np.nan), **parts})
    return pd.DataFrame(rows)


# What a decision can move, by its role. time to train moves with both: the math sets the full
# run's tokens and each step's FLOPs, the layout how fast a step runs.
MATH_MOVES = "loss, time to train, MFU, memory: changes the math"
LAYOUT_MOVES = "time to train, MFU, memory: layout only (the loss is its math group's)"
ROLES_NOTE = ("What each decision can move (from the stored math groups: trials of one model on the same "
              "batches score one loss; time to train moves with the math, which sets the full run's tokens "
              "and each step's FLOPs, and with the layout, which sets how fast a step runs):")


def decision_roles(frame: pd.DataFrame) -> pd.DataFrame:
    """Which objectives each decision can move, from the stored math keys: a decision whose
    values, all other decisions fixed, never change the math (the same model on the same
    batches: mesh, remat, kernels, flags) moves time to train, MFU and memory, the loss being
    its math group's (LAYOUT_MOVES); one that changes it moves the loss too (MATH_MOVES). Empty
    without math keys (plan-only or older studies)."""
    if "math_key" not in frame or frame["math_key"].isna().all():
        return pd.DataFrame()
    done = frame[frame["math_key"].notna()]
    columns = decision_columns(frame)
    rows = []
    for decision in columns:
        others = [c for c in columns if c != decision]
        groups = done.groupby([done[c].astype(str) for c in others]) if others else [(None, done)]
        varied = changes = False
        for _, group in groups:
            if group[decision].astype(str).nunique() > 1:
                varied = True
                changes |= group["math_key"].nunique() > 1
        role = (MATH_MOVES if changes else LAYOUT_MOVES if varied else
                "not varied with the other decisions fixed")
        rows.append({"decision": decision[2:], "moves": role})
    return pd.DataFrame(rows)



def math_group_labels(frame: pd.DataFrame) -> dict[str, str]:
    """math_key -> a label naming what sets that group apart: the decisions constant within
    every group that differ between groups ("model_size=small, per_device_batch=2"), then the
    global batch when those do not tell the groups apart (a per-device batch on two meshes), and
    the group's first trial as a last resort; each with the group's trial count."""
    done = frame[frame["math_key"].notna()] if "math_key" in frame else frame.iloc[0:0]
    if done.empty:
        return {}
    groups = {key: group for key, group in done.groupby("math_key", sort=False)}
    candidates = [*decision_columns(frame), "plan.global_batch"]
    parts: dict[str, list[str]] = {key: [] for key in groups}

    def distinct() -> bool:
        labels = [", ".join(p) for p in parts.values()]
        return len(set(labels)) == len(labels) and all(labels)

    for column in candidates:
        if distinct() or column not in done:
            continue
        values = {key: group[column].astype(str).unique() for key, group in groups.items()}
        if all(len(v) == 1 for v in values.values()) and len({v[0] for v in values.values()}) > 1:
            name = "global batch" if column == "plan.global_batch" else column[2:]
            for key, v in values.items():
                parts[key].append(f"{name}={v[0]}")
    if len(groups) == 1:
        parts = {key: ["one math group"] for key in groups}
    elif not distinct():
        for key, group in groups.items():
            parts[key].append(f"group of trial {int(group['number'].min())}")
    return {key: f"{', '.join(parts[key])} ({len(group)} trial{'s' if len(group) != 1 else ''})"
            for key, group in groups.items()}


def time_to_train_line(frame: pd.DataFrame, predicted: bool) -> str | None:
    """What time to train is, with the full run's token count and where it came from; None when
    no trial has the figure."""
    if "full_run_source" not in frame or frame["full_run_source"].isna().all():
        return None
    rows = frame[frame["full_run_source"].notna()]
    step = "predicted" if predicted else "measured"
    if rows["full_run_source"].str.startswith("train_tokens").all():
        tokens = ", ".join(f"{int(t):,}" for t in sorted(rows["full_run_tokens"].unique()))
        count = f"{tokens} tokens (STUDY train_tokens)"
    else:
        count = ("20 tokens per parameter of each trial's model (Chinchilla, Hoffmann et al. 2022; "
                 "set STUDY train_tokens= for another count)")
    return (f"time to train = the full run's tokens / throughput (global batch x seq_len tokens per {step} "
            f"step time), on the trial's target; full run = {count}")

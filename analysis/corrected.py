"""Predicted, corrected and measured MFU side by side (pure, over the trials DataFrame).

The correction is store/correction.py's model of log(measured / predicted MFU) over plan
features, fit on the study's measured trials: the one steering uses (search/tuning/steer.py).
A trial that was not measured (skipped as predicted dominated, pruned, failed after compiling)
gets the model fit on every measured trial; a measured trial gets the model fit on the others
(leave-one-out), so its corrected figure never saw its own measurement. Each corrected figure
comes with the model's 90% prediction interval of the measured MFU (low, high).
"""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from ..store import correction
from ..store.plan import Plan
from .load import decision_columns

COLUMN = "corrected_mfu"
LOW, HIGH = "corrected_mfu_low", "corrected_mfu_high"  # the model's 90% prediction interval
LEVEL = 0.9
_NESTED = ("plan.roofline", "plan.mesh_shape")  # stored as JSON text in the frame (load._scalar)


def _plan(row: pd.Series) -> Plan:
    """The plan of a frame row (its plan.<key> columns are the stored plan's keys), nested figures
    parsed back."""
    plan: dict = {}
    for column, value in row.items():
        if not isinstance(column, str) or not column.startswith("plan."):
            continue
        if column in _NESTED and isinstance(value, str):
            value = json.loads(value)
        elif isinstance(value, float) and math.isnan(value):
            continue
        plan[column[len("plan."):]] = value
    return Plan.from_stored(plan) or Plan()


def _measured(frame: pd.DataFrame) -> pd.Series:
    """Trained, measured (not plan-only) trials with a finite MFU."""
    steps = pd.to_numeric(frame["steps"], errors="coerce").fillna(0) if "steps" in frame else 1
    mfu = pd.to_numeric(frame["mfu"], errors="coerce")
    return (frame["state"] == "COMPLETE") & ~frame["predicted"].astype(bool) & (steps > 0) & mfu.gt(0)


def corrected_table(frame: pd.DataFrame) -> tuple[pd.DataFrame, str | None]:
    """(number, decisions, outcome, predicted MFU, corrected MFU, measured MFU) for every
    trial of a measured study with a predicted MFU, and a line saying what the model is and
    how far off each column is on the measured trials; empty below the model's minimum."""
    if "plan.predicted_mfu" not in frame or frame.empty:
        return pd.DataFrame(), None
    predicted = pd.to_numeric(frame["plan.predicted_mfu"], errors="coerce")
    rows = frame[predicted.gt(0) & ~frame["predicted"].astype(bool)]
    is_measured = _measured(rows)
    measured = rows[is_measured]
    plans = [_plan(r) for _, r in measured.iterrows()]
    logs = [correction.log_ratio(m, p) for m, p in zip(measured["mfu"], measured["plan.predicted_mfu"], strict=True)]
    model = correction.fit(plans, logs)
    if model is None:
        return pd.DataFrame(), None
    figures = {name: pd.Series(np.nan, index=rows.index) for name in (COLUMN, LOW, HIGH)}

    def put(index, fitted: correction.Correction | None, plan: Plan, predicted: float) -> None:
        value = fitted.corrected(plan, predicted) if fitted else None
        span = fitted.interval(plan, predicted, LEVEL) if fitted else None
        if value is not None and span is not None:
            figures[COLUMN][index] = value
            figures[LOW][index], figures[HIGH][index] = span

    loo = correction.leave_one_out_models(plans, logs)
    for index, plan, fitted in zip(measured.index, plans, loo, strict=True):
        put(index, fitted, plan, float(plan.predicted_mfu or 0.0))
    for index, row in rows[~is_measured].iterrows():
        put(index, model, _plan(row), float(row["plan.predicted_mfu"]))
    table = rows.assign(**figures)
    table["mfu"] = pd.to_numeric(table["mfu"], errors="coerce").where(is_measured)
    columns = ["number", *decision_columns(frame), "outcome", "plan.predicted_mfu", COLUMN, LOW, HIGH, "mfu"]
    return table[columns].sort_values("number"), _note(model, table[is_measured])


def _note(model: correction.Correction, measured: pd.DataFrame) -> str:
    """What the correction is and its leave-one-out error against the roofline's."""
    both = measured[measured[COLUMN].notna()]
    text = (f"Corrected MFU = predicted x exp(the {model.describe()}), with its {LEVEL:.0%} prediction "
            "interval (low, high); on measured trials, the model fit on the other trials (leave-one-out).")
    if len(both):
        actual = both["mfu"].astype(float)
        err_pred = float(np.mean(np.abs(both["plan.predicted_mfu"].astype(float) / actual - 1)))
        err_corr = float(np.mean(np.abs(both[COLUMN].astype(float) / actual - 1)))
        inside = float(np.mean((both[LOW] <= actual) & (actual <= both[HIGH])))
        text += (f" Mean |figure / measured - 1| over {len(both)} measured trials: predicted {err_pred:.1%}, "
                 f"corrected {err_corr:.1%}; measured inside the interval: {inside:.0%}.")
    return text

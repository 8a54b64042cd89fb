"""Predictions that learn from measurements: a linear model of log(measured / predicted MFU)
over a few features of the compiled plan, with its prediction interval.

The roofline's predicted MFU is off by a factor that depends on the layout (how much of the
step is communication, how large each device's share of the batch is, how much is
recomputed). A study that has measured some trials fits

    log(measured / predicted) = b0 + b . z(plan) + e,   e ~ N(0, s^2)

by ridge regression on standardized features z (the intercept is not penalised), and for a
point it has not run it gives the corrected prediction predicted x exp(b0 + b . z) and the
standard prediction interval of the linear model: mean +- t(n - p - 1) x s x sqrt(1 + h),
h = z1' (Z1'Z1 + L)^-1 z1 (z1: the features with a leading 1; L: the ridge on features only).

Features enter in a fixed order (FEATURES) and only as many as the measured trials afford:
p <= (n - 3) / 2, so the residual keeps at least p + 2 degrees of freedom (the first feature at
5 trials, the second at 7, ...); a feature constant over the measured trials tells nothing and
is left out. With no feature the model is the global
ratio: the intercept alone is the mean log ratio, and the interval is the one-sided bound
steering used before (exp(mean + t(n - 1) x sd x sqrt(1 + 1/n))).

Shared by search (steering, search/tuning/steer.py) and analysis (the report's corrected
column), so it lives here; it imports numpy and scipy (Student's t) and nothing of paxsearch but
store/plan.py's Plan, whose figures it reads.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from .plan import Plan

MIN_TRIALS = 3  # measured trials below which there is no model at all (not even the global ratio)
RIDGE = 0.1  # penalty on standardized feature coefficients (keeps near-collinear features stable)


def _roofline(plan: Plan) -> Mapping:
    return plan.roofline or {}  # the roofline's own schema (search/planning/roofline/)


def _comm_share(plan: Plan) -> float | None:
    """Predicted communication time / (communication + on-chip roofline time)."""
    r = _roofline(plan)
    comm, chip = r.get("comm_s"), r.get("roofline_s")
    if comm is None or chip is None or comm + chip <= 0:
        return None
    return float(comm) / float(comm + chip)


def _log_device_tokens(plan: Plan) -> float | None:
    """log(tokens of one step on one device): the per-device batch x sequence length."""
    tokens, devices = plan.tokens_per_step, plan.num_devices
    return math.log(tokens / devices) if tokens and devices else None


def _log_step_time(plan: Plan) -> float | None:
    step = plan.predicted_step_time
    return math.log(step) if step and step > 0 else None


def _log_tensor(plan: Plan) -> float | None:
    """log2 of the tensor-parallel axis size."""
    mesh = plan.mesh_shape
    return math.log2(mesh.get("tensor", 1)) if isinstance(mesh, Mapping) and mesh.get("tensor") else None


def _log_recompute(plan: Plan) -> float | None:
    """log(executed FLOPs / model FLOPs): what rematerialization (and other extra work) adds."""
    executed = _roofline(plan).get("flops_per_step")
    model, devices = plan.model_flops_per_step, plan.num_devices
    if not executed or not model or not devices:
        return None
    return math.log(executed * devices / model)


# In the order they enter the model as measured trials accrue: first the predicted step time
# (fixed per-step costs the roofline leaves out, dispatch, launches, synchronisation, weigh most
# where the predicted step is shortest), then the share of communication (the collective model
# is the roofline's least measured part), then each device's share of the batch (small matmuls
# run below the peak the roofline assumes), tensor parallelism and recomputation.
FEATURES: dict[str, Callable[[Plan], float | None]] = {
    "log_step_time": _log_step_time,
    "comm_share": _comm_share,
    "log_device_tokens": _log_device_tokens,
    "log_tensor": _log_tensor,
    "log_recompute": _log_recompute,
}


def log_ratio(measured_mfu, predicted_mfu) -> float | None:
    """log(measured / predicted), or None when either is missing, not finite or not positive."""
    try:
        m, p = float(measured_mfu), float(predicted_mfu)
    except (TypeError, ValueError):
        return None
    if not (math.isfinite(m) and math.isfinite(p)) or m <= 0 or p <= 0:
        return None
    return math.log(m / p)


def t_quantile(q: float, dof: int) -> float:
    from scipy import stats

    return float(stats.t.ppf(q, dof))


@dataclass(frozen=True)
class Correction:
    """A fitted model (JSON-able through to_dict / from_dict, so a worker can apply it).

    names: the features used (empty: the global ratio); center, scale: their standardization;
    coef: [intercept, feature coefficients...]; inv: (Z1'Z1 + L)^-1; s: residual sd; dof: n - p - 1."""

    names: tuple[str, ...]
    center: tuple[float, ...]
    scale: tuple[float, ...]
    coef: tuple[float, ...]
    inv: tuple[tuple[float, ...], ...]
    s: float
    dof: int
    n: int

    @property
    def is_global(self) -> bool:
        return not self.names

    def row(self, plan: Plan) -> np.ndarray | None:
        """The standardized feature row of `plan` with its leading 1, or None when the plan
        lacks a feature the model uses."""
        values = [FEATURES[name](plan) for name in self.names]
        if any(v is None or not math.isfinite(v) for v in values):
            return None
        z = (np.asarray(values, dtype=float) - np.asarray(self.center)) / np.asarray(self.scale)
        return np.concatenate([[1.0], z])

    def log_interval(self, row: np.ndarray) -> tuple[float, float]:
        """(mean, predictive sd) of a new trial's log ratio at this feature row."""
        mean = float(np.dot(self.coef, row))
        h = float(row @ np.asarray(self.inv) @ row)
        return mean, self.s * math.sqrt(1.0 + h)

    def predict(self, plan: Plan) -> tuple[float, float] | None:
        """(mean, predictive sd) of log(measured / predicted) for `plan`; None when it lacks a feature."""
        row = self.row(plan)
        return None if row is None else self.log_interval(row)

    def corrected(self, plan: Plan, predicted_mfu: float) -> float | None:
        """The corrected prediction: predicted x exp(mean log ratio) (the median, not the mean)."""
        out = self.predict(plan)
        return None if out is None else predicted_mfu * math.exp(out[0])

    def interval(self, plan: Plan, predicted_mfu: float, level: float = 0.9) -> tuple[float, float] | None:
        """The two-sided `level` prediction interval of the measured MFU of `plan`, predicted
        `predicted_mfu`: predicted x exp(mean -+ t(dof) x predictive sd)."""
        out = self.predict(plan)
        if out is None:
            return None
        mean, sd = out
        t = t_quantile(0.5 + level / 2, self.dof)
        return predicted_mfu * math.exp(mean - t * sd), predicted_mfu * math.exp(mean + t * sd)

    def upper_ratio(self, plan: Plan, risk: float) -> float | None:
        """The upper one-sided (1 - risk) prediction bound of a new trial's measured / predicted."""
        out = self.predict(plan)
        if out is None:
            return None
        mean, sd = out
        return math.exp(mean + t_quantile(1 - risk, self.dof) * sd)

    def to_dict(self) -> dict:
        return {"names": list(self.names), "center": list(self.center), "scale": list(self.scale),
                "coef": list(self.coef), "inv": [list(r) for r in self.inv], "s": self.s, "dof": self.dof,
                "n": self.n}

    @classmethod
    def from_dict(cls, d: dict) -> Correction:
        return cls(tuple(d["names"]), tuple(d["center"]), tuple(d["scale"]), tuple(d["coef"]),
                   tuple(tuple(r) for r in d["inv"]), float(d["s"]), int(d["dof"]), int(d["n"]))

    def describe(self) -> str:
        if self.is_global:
            return f"global ratio over {self.n} trials"
        return f"linear model of log(measured/predicted) on {', '.join(self.names)} over {self.n} trials"


def fit(plans: Sequence[Plan], log_ratios: Sequence[float], *, max_features: int | None = None,
        ridge: float = RIDGE) -> Correction | None:
    """The model of `log_ratios` (one per plan) over the plans' features; None below
    MIN_TRIALS. Features are taken in FEATURES order while p <= (n - 3) / 2 (the global ratio
    when none fits: n <= 4, n <= p + 2 for p = 1 or 2), skipping any a plan lacks or that is
    constant over the plans."""
    y = np.asarray(log_ratios, dtype=float)
    n = len(y)
    if n < MIN_TRIALS:
        return None
    room = (n - MIN_TRIALS) // 2 if max_features is None else min(max_features, n - MIN_TRIALS)
    names: list[str] = []
    columns: list[np.ndarray] = []
    for name, feature in FEATURES.items():
        if len(names) >= room:
            break
        values = [feature(p) for p in plans]
        if any(v is None or not math.isfinite(v) for v in values):
            continue
        col = np.asarray(values, dtype=float)
        if col.std() <= 1e-9 * max(1.0, abs(col.mean())):
            continue
        names.append(name)
        columns.append(col)
    center = tuple(float(c.mean()) for c in columns)
    scale = tuple(float(c.std()) for c in columns)
    z = np.column_stack([np.ones(n)] + [(c - m) / s for c, m, s in zip(columns, center, scale, strict=True)])
    penalty = np.diag([0.0] + [ridge] * len(names))
    inv = np.linalg.inv(z.T @ z + penalty)
    coef = inv @ z.T @ y
    dof = n - len(names) - 1
    s = float(np.sqrt(np.sum((y - z @ coef) ** 2) / dof))
    return Correction(tuple(names), center, scale, tuple(float(c) for c in coef),
                      tuple(tuple(float(v) for v in r) for r in inv), s, dof, n)


def leave_one_out_models(plans: Sequence[Plan], log_ratios: Sequence[float], **kw) -> list[Correction | None]:
    """For each measured trial, the model fit on all the others (None where they are too few)."""
    return [fit([p for j, p in enumerate(plans) if j != i], [r for j, r in enumerate(log_ratios) if j != i], **kw)
            for i in range(len(plans))]


def leave_one_out(plans: Sequence[Plan], log_ratios: Sequence[float], **kw) -> list[float | None]:
    """For each measured trial, the mean log ratio the model fit on all the others predicts
    for it (None where the others are too few, or its plan lacks a feature)."""
    out: list[float | None] = []
    for plan, model in zip(plans, leave_one_out_models(plans, log_ratios, **kw), strict=True):
        pred = model.predict(plan) if model else None
        out.append(pred[0] if pred else None)
    return out

"""A plan-only trial's compile as plain data, and the outcome it gives against a memory budget.

    plan = refused(oom, target)           # the compiler refused the step for memory: its Plan
    outcome = outcome_of(kind, plan, message, target, budget_bytes)   # kind: "plan" | "refused"

The same (kind, plan, message) comes from a compile in a worker (search/trial/execute.py
plan_outcome, compilation.plan_point) or
from the persistent plan cache in the driver (screen.py, plan_cache.py), so a cached plan is
held against this study's budget exactly as a fresh one is.
"""
from __future__ import annotations

from ...store.outcome import Kind, TrialOutcome
from ...store.plan import COMPILED, Plan
from . import plans, topology
from .targets import Target, memory_limit, plan_result_fields


def refused(oom: topology.PredictedOOM, target: Target) -> Plan:
    """The plan of a step the TPU compiler refused for memory (compilation.plan_point raised `oom`):
    the bytes it named stand for the peak."""
    return plans.refused(oom.required_bytes or oom.available_bytes, oom.source, target.hbm_bytes_per_device,
                         oom.plan_method or COMPILED)


def result_fields(target: Target, budget_bytes: int | None) -> dict:
    """The TrialOutcome fields of every plan-only trial of `target`."""
    return {"predicted": True, **plan_result_fields(target, budget_bytes)}


def outcome_of(kind: str, plan: Plan, message: str, target: Target, budget_bytes: int | None) -> TrialOutcome:
    """The trial's outcome: a refused step is predicted_oom with the compiler's message; a
    plan is held against `budget_bytes` when given (below the HBM), else against the HBM."""
    fields = result_fields(target, budget_bytes)
    if kind == "refused":
        return TrialOutcome.failure(Kind.PREDICTED_OOM, message, plan=plan, **fields)
    limit, what = memory_limit(plan.hbm_bytes, budget_bytes)
    try:
        if limit is not None:
            topology.check_fits(plan.peak_bytes or 0, limit, what)
    except topology.PredictedOOM as oom:
        return TrialOutcome.failure(Kind.PREDICTED_OOM, str(oom), plan=plan, **fields)
    return TrialOutcome(plan=plan, **fields)

"""Settle a plan-only trial without compiling when the study already knows its answer.

Before a plan-only trial (a TPU target on a machine without TPUs) goes to a worker, the
driver asks, in this order:
  1. analytic pre-screen: parameters, gradients and AdamW moments alone exceed the chip's
     HBM (analytic.prescreen) -> predicted_oom, nothing compiled;
  2. duplicate: a finished trial has the same plan key (same compiled step: model, mesh,
     global batch, remat) -> its plan and outcome, nothing compiled;
  3. plan cache: another study (or an earlier run) compiled the same step with the same
     versions, flags and code (plan_cache.py) -> its plan, held against this study's budget;
  4. dominated: a finished trial with the same shape key and a global batch no larger was
     predicted_oom -> predicted_oom (a larger batch needs at least as much memory).
Each settled result's Plan names where its answer came from (`screen`) and its `plan_method`:
"analytic", "study" (2 and 4) or "cache"; a compiled plan's is "compiled". Its `compiler`
(store/compiler.py) is None for the analytic one (nothing compiled), the earlier trial's for 2
and 4 (not stored when that trial's plan names none), the cached plan's for 3. The plans are
built in plans.py.
"""
from __future__ import annotations

from typing import Any

import optuna
from optuna.trial import TrialState

from ...store.outcome import Kind, TrialOutcome
from ...store.plan import ANALYTIC, STUDY, Plan
from ..study.storage import is_superseded
from . import compiled, plan_cache, plans
from .analytic import prescreen
from .keys import plan_keys
from .targets import Target, plan_result_fields


def keys_attrs(cfg, target: Target) -> dict:
    """User attributes that let later trials reuse this one's plan."""
    key, shape_key, batch = plan_keys(cfg, target)
    return {"plan_key": key, "shape_key": shape_key, "global_batch": batch}


def _finished(trials) -> list[optuna.trial.FrozenTrial]:
    return [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.FAIL) and not is_superseded(t)
            and t.user_attrs.get("plan_key")]


def screen(cfg, target: Target, keys: dict, trials, budget: int | None) -> TrialOutcome | None:
    """The trial's outcome when it is settled here, else None (compile it).
    `target` is the study's; under slices=auto each trial is screened on its own slice count."""
    target = target.for_config(cfg)
    fields = {"predicted": True, **plan_result_fields(target, budget)}
    where: dict[str, Any] = {"target": target.name, "num_slices": target.num_slices,
                             "hbm_bytes": target.hbm_bytes_per_device}
    oom = prescreen(cfg, target, budget)
    if oom is not None:
        plan = plans.bound(oom.required_bytes or 0, "lower bound: parameters, gradients, AdamW moments", **where,
                           screen="analytic", method=ANALYTIC)
        return TrialOutcome.failure(Kind.PREDICTED_OOM, str(oom), plan=plan, **fields)
    done = _finished(trials)
    for t in done:
        if t.user_attrs["plan_key"] == keys["plan_key"] and t.user_attrs.get("plan"):
            stored = TrialOutcome.from_user_attrs(t.user_attrs)
            assert stored.plan is not None
            return TrialOutcome(kind=stored.kind, message=stored.message,
                                plan=plans.duplicate(stored.plan, t.number), **fields)
    cached = from_cache(cfg, target, budget)
    if cached is not None:
        return cached
    for t in done:
        a = t.user_attrs
        if (a["shape_key"] == keys["shape_key"] and Kind.stored(a.get("failure_kind")) is Kind.PREDICTED_OOM
                and int(a.get("global_batch") or 0) <= keys["global_batch"] and a.get("memory_bytes")):
            # the bound is that trial's plan: so is its compiler
            plan = plans.bound(a["memory_bytes"], f"lower bound: trial {t.number}'s peak at a smaller batch",
                               **where, screen=f"dominated by trial {t.number}", method=STUDY,
                               compiler_of=Plan.from_stored(a.get("plan")))
            return TrialOutcome.failure(
                Kind.PREDICTED_OOM, f"predicted OOM (not compiled): trial {t.number} with global batch "
                                    f"{a['global_batch']} <= {keys['global_batch']} and the same model, mesh "
                                    f"and remat did not fit ({a.get('failure_message', '')[:160]})",
                plan=plan, **fields)
    return None


def from_cache(cfg, target: Target, budget: int | None) -> TrialOutcome | None:
    """The outcome of `cfg`'s plan from the persistent plan cache, held against `budget`, with
    the environment it was compiled in; None when the cache is off or has no valid entry."""
    where = plan_cache.folder()
    record = plan_cache.load(where, plan_cache.cache_key(cfg, target)) if where is not None else None
    if record is None:
        return None
    # the target is this trial's (the key holds it), whatever the file says
    plan = plans.cached(plan_cache.record_plan(record), target.name, target.num_slices)
    outcome = compiled.outcome_of(record["kind"], plan, record["message"], target, budget)
    if record["env"]:  # the stored env, as the driver makes it of a worker's (with_env keeps working after)
        outcome = outcome.replace(env=outcome.with_env(record["env"]).env)
    return outcome

"""Settle a plan-only trial without compiling when the study already knows its answer.

Before a plan-only trial (a TPU target on a machine without TPUs) goes to a worker, the
driver asks, in this order:
  1. analytic pre-screen: parameters, gradients and AdamW moments alone exceed the chip's
     HBM (targets.prescreen) -> predicted_oom, nothing compiled;
  2. duplicate: a finished trial has the same plan key (same compiled step: model, mesh,
     global batch, remat) -> its plan and outcome, nothing compiled;
  3. plan cache: another study (or an earlier run) compiled the same step with the same
     versions, flags and code (plan_cache.py) -> its plan, held against this study's budget;
  4. dominated: a finished trial with the same shape key and a global batch no larger was
     predicted_oom -> predicted_oom (a larger batch needs at least as much memory).
Each settled result names where its answer came from ("screen" in the plan dict) and its
`plan_method`: "analytic", "study" (2 and 4) or "cache"; a compiled plan's is "compiled". Its
"compiler" (store/compiler.py) is None for the analytic one (nothing compiled), the earlier
trial's for 2 and 4 (absent when that trial's plan names none), the cached plan's for 3.
"""
from __future__ import annotations

import optuna
from optuna.trial import TrialState

from ...store import compiler
from ...store.outcome import Kind, TrialOutcome
from ..study.storage import is_superseded
from . import compiled, plan_cache
from .targets import Target, plan_keys, plan_result_fields, prescreen


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
    where = {"hbm_bytes": target.hbm_bytes_per_device, "predicted": True, "target": target.name,
             "num_slices": target.num_slices}
    oom = prescreen(cfg, target, budget)
    if oom is not None:
        plan = {"peak_bytes": oom.required_bytes, **where, "screen": "analytic", "plan_method": "analytic",
                compiler.KEY: compiler.NOT_COMPILED,
                "peak_bytes_source": "lower bound: parameters, gradients, AdamW moments"}
        return TrialOutcome.failure(Kind.PREDICTED_OOM, str(oom), plan=plan, **fields)
    done = _finished(trials)
    for t in done:
        if t.user_attrs["plan_key"] == keys["plan_key"] and t.user_attrs.get("plan"):
            stored = TrialOutcome.from_user_attrs(t.user_attrs)
            plan = {**t.user_attrs["plan"], "screen": f"duplicate of trial {t.number}", "plan_method": "study"}
            return TrialOutcome(kind=stored.kind, message=stored.message, plan=plan, **fields)
    cached = from_cache(cfg, target, budget)
    if cached is not None:
        return cached
    for t in done:
        a = t.user_attrs
        if (a["shape_key"] == keys["shape_key"] and Kind.stored(a.get("failure_kind")) is Kind.PREDICTED_OOM
                and int(a.get("global_batch") or 0) <= keys["global_batch"] and a.get("memory_bytes")):
            plan = {"peak_bytes": a["memory_bytes"], **where, "screen": f"dominated by trial {t.number}",
                    "plan_method": "study",
                    "peak_bytes_source": f"lower bound: trial {t.number}'s peak at a smaller batch"}
            if compiler.KEY in (a.get("plan") or {}):  # the bound is that trial's plan: so is its compiler
                plan[compiler.KEY] = a["plan"][compiler.KEY]
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
    # a record written before plans named their compiler: the key holds this machine's versions
    plan = {compiler.KEY: compiler.made_here(), **record["plan"], "target": target.name,
            "num_slices": target.num_slices, "screen": "plan cache", "plan_method": "cache"}
    outcome = compiled.outcome_of(record["kind"], plan, record["message"], target, budget)
    if record["env"]:  # the stored env, as the driver makes it of a worker's (with_env keeps working after)
        outcome = outcome.replace(env=outcome.with_env(record["env"]).env)
    return outcome

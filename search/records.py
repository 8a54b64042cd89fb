"""What a finished trial stores: objective values, state and user attributes (pure functions).

State and values by outcome:
- trained: COMPLETE, values from the measured loss / MFU and the compiled peak bytes.
- predicted_oom: COMPLETE with the constraint violated (loss +inf, MFU 0, the predicted
  memory), so that constraint-aware samplers (TPE, NSGA-II, GP) learn the infeasible region;
  it carries failure_kind "predicted_oom" and ran no step.
- pruned by the pruner, or skipped as predicted dominated (user attr "steered"): PRUNED.
  Every other failure: FAIL with failure_kind/failure_message.
"""
from __future__ import annotations

import math

from optuna.trial import TrialState

from . import failures, steer
from .settings import format_bytes

MEASURED_KEYS = ("loss", "eval_loss", "mfu", "hfu", "tokens_per_sec", "step_time", "peak_bytes", "steps")


def objective_values(objectives, plan: dict | None, measured: dict | None, predicted_oom: bool,
                     predicted: bool = False) -> list[float] | None:
    """trial.values in the order of `objectives`, or None when a score is missing. A
    plan-only trial (`predicted`) scores MFU with the plan's predicted MFU."""
    out = []
    for name in objectives:
        if name == "memory":
            v = plan.get("peak_bytes") if plan else None
        elif predicted_oom:
            v = math.inf if name == "loss" else 0.0
        elif predicted:
            v = (plan or {}).get(f"predicted_{name}")
        elif name == "loss":  # held-out eval loss when the trial evaluated, else its last training loss
            m = measured or {}
            v = m.get("eval_loss") if m.get("eval_loss") is not None else m.get("loss")
        else:
            v = (measured or {}).get(name)
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return None
        out.append(float(v))
    return out


def outcome(objectives, result: dict) -> tuple[TrialState, list[float] | None, dict]:
    """(state, values, extra user attrs) of a worker result."""
    kind = result.get("failure_kind")
    plan, measured = result.get("plan"), result.get("measured")
    attrs: dict = {}
    if result.get("pruned"):  # by the pruner, or skipped as predicted dominated (search/steer.py)
        return TrialState.PRUNED, None, {"pruned": True}
    predicted = bool(result.get("predicted"))
    if kind == failures.PREDICTED_OOM and plan:
        return TrialState.COMPLETE, objective_values(objectives, plan, measured, True, predicted), attrs
    if kind:
        return TrialState.FAIL, None, attrs
    values = objective_values(objectives, plan, measured, False, predicted)
    if values is None:
        attrs = {"failure_kind": failures.CRASH, "failure_message": "the trial finished without a score"}
        return TrialState.FAIL, None, attrs
    return TrialState.COMPLETE, values, attrs


def trial_attrs(result: dict, worker_env: dict | None, timings: dict) -> dict:
    """User attributes from a worker result (decisions/config are stored at ask time)."""
    plan, measured = result.get("plan"), result.get("measured")
    counters = result.get("counters") or {"train_calls": 0, "steps_run": 0}
    if measured is None:  # no training finished: no scores, and the steps it got through
        measured = dict.fromkeys(MEASURED_KEYS) | {"steps": int(counters.get("steps_run", 0))}
    attrs = {
        "plan": plan,
        "measured": measured,
        "memory_bytes": plan.get("peak_bytes") if plan else None,
        "timings": timings,
        "counters": counters,
        "predicted": bool(result.get("predicted")),
    }
    if result.get("memory_budget"):
        attrs["memory_budget"] = result["memory_budget"]
        if plan:
            attrs["constraint"] = [float(plan["peak_bytes"] - result["memory_budget"]["bytes"])]
    if result.get("steered"):
        attrs["steered"] = result["steered"]
    if result.get("intermediate"):
        attrs["intermediate"] = result["intermediate"]
    if worker_env is not None:
        peak = result.get("peak_flops") or {}
        attrs["env"] = {k: worker_env.get(k) for k in ("jax", "jaxlib", "libtpu", "device_kind", "platform",
                                                       "num_devices", "xla_flags", "process_count",
                                                       "flag_set", "libtpu_init_args")}
        attrs["env"]["peak_flops_per_device"] = peak.get("value")
        attrs["env"]["peak_flops_source"] = peak.get("source")
        attrs["env"].update(result.get("device") or {})  # plan-only: the target's devices, not the worker's
    if result.get("failure_kind"):
        attrs["failure_kind"] = result["failure_kind"]
        attrs["failure_message"] = result.get("failure_message") or ""
    return attrs


def timings(result: dict, total_s: float) -> dict:
    t = result.get("timings") or {}
    plan_s, train_s = float(t.get("plan_s", 0.0)), float(t.get("train_s", 0.0))
    return {"plan_s": round(plan_s, 4), "train_s": round(train_s, 4), "total_s": round(total_s, 4),
            "overhead_s": round(max(0.0, total_s - plan_s - train_s), 4)}


def trial_line(number: int, state: TrialState, decisions: dict, attrs: dict, total_s: float) -> str:
    """One line per finished trial."""
    d = " ".join(f"{k}={v}" for k, v in decisions.items())
    kind = attrs.get("failure_kind")
    m = attrs.get("measured") or {}
    label = kind or ("skipped" if attrs.get("steered") else state.name.lower())
    parts = [f"#{number:<3d} {label:13s} {d}"]
    plan = attrs.get("plan") or {}
    if attrs.get("steered"):
        parts.append(f"{steer.describe(attrs['steered'])}; mem {format_bytes(attrs.get('memory_bytes'))} (compiled)")
    elif kind == failures.PREDICTED_OOM:
        how = f" ({plan['screen']}, not compiled)" if plan.get("screen") else ""
        parts.append(f"plan {format_bytes(attrs.get('memory_bytes'))} > budget{how}")
    elif attrs.get("predicted") and not kind:
        mfu, step = plan.get("predicted_mfu"), plan.get("predicted_step_time")
        how = f" ({plan['screen']})" if plan.get("screen") else ""
        parts.append(f"PREDICTED{how} mfu {'-' if mfu is None else f'{100 * mfu:.1f}%'}  "
                     f"step {'-' if step is None else f'{1e3 * step:.0f} ms'}  "
                     f"mem {format_bytes(attrs.get('memory_bytes'))} (compiled)")
    elif m.get("loss") is not None:  # the loss the objective scores: held-out eval loss when there is one
        loss = f"eval loss {m['eval_loss']:.3f}" if m.get("eval_loss") is not None else f"loss {m['loss']:.3f}"
        parts.append(f"{loss}  mfu {100 * (m.get('mfu') or 0):.2f}%  "
                     f"mem {format_bytes(attrs.get('memory_bytes'))}  step {1e3 * (m.get('step_time') or 0):.0f} ms")
    elif kind:
        parts.append((attrs.get("failure_message") or "")[:100])
    parts.append(f"{total_s:.1f} s")
    return " | ".join(parts)

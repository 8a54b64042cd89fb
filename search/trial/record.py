"""What a finished trial stores: objective values and state, and its line on the terminal (pure functions).

State and values by outcome:
- trained: COMPLETE, values from the measured loss / MFU / step time and the compiled peak bytes.
- predicted_oom: COMPLETE with the constraint violated (loss +inf, MFU 0, time_to_train +inf,
  the predicted memory), so that constraint-aware samplers (TPE, NSGA-II, GP) learn the infeasible region;
  it carries failure_kind "predicted_oom" and ran no step.
- pruned by the pruner, or skipped as predicted dominated (user attr "steered"): PRUNED.
  Every other failure: FAIL with failure_kind/failure_message.
The stored user attributes are the outcome's storage form (store/outcome.py).
"""
from __future__ import annotations

import math

from optuna.trial import TrialState

from ...store.outcome import Kind, TrialOutcome
from ...store.plan import Plan
from ...store.units import format_bytes, format_duration
from ..study.settings import TOKENS_PER_PARAM
from ..tuning import steer

# how the line names where a plan's memory came from (method.plan_method, screen.py)
_MEMORY_SOURCE = {"analytic": "(analytic, lower bound)", "hlo_passes": "(HLO passes)"}


def full_run(outcome: TrialOutcome, train_tokens: int | None = None) -> dict | None:
    """How long the full run would take on the trial's target: its tokens over the trial's
    throughput, tokens per step (global batch x seq_len) / step time, the step time measured
    (a trained trial) or predicted by the plan (a plan-only trial). The full run's tokens are
    `train_tokens` (STUDY train_tokens=), else TOKENS_PER_PARAM per parameter of the model
    (Chinchilla). None without a plan, a token count or a step time."""
    plan, measured = outcome.plan or Plan(), outcome.measured
    params = plan.param_count
    tokens = train_tokens if train_tokens else (TOKENS_PER_PARAM * int(params) if params else None)
    per_step = plan.tokens_per_step
    step_time = plan.predicted_step_time if outcome.predicted else (measured.step_time if measured else None)
    if not tokens or not per_step or step_time is None or not math.isfinite(step_time) or step_time <= 0:
        return None
    tokens_per_sec = float(per_step) / float(step_time)
    source = ("train_tokens setting" if train_tokens else
              f"{TOKENS_PER_PARAM} tokens per parameter (Chinchilla) x {int(params or 0):,} parameters")
    return {"tokens": int(tokens), "tokens_source": source, "tokens_per_sec": tokens_per_sec,
            "seconds": tokens / tokens_per_sec, "step_time": "predicted" if outcome.predicted else "measured"}


def objective_values(objectives, outcome: TrialOutcome, train_tokens: int | None = None) -> list[float] | None:
    """trial.values in the order of `objectives`, or None when a score is missing. A
    predicted_oom trial scores loss +inf, MFU 0 and time_to_train +inf; a plan-only trial
    (`predicted`) scores MFU with the plan's predicted MFU, time_to_train with its predicted
    step time. time_to_train: full_run's seconds (train_tokens: the full run's tokens, None
    for TOKENS_PER_PARAM per parameter)."""
    plan, measured = outcome.plan or Plan(), outcome.measured
    predicted = {"mfu": plan.predicted_mfu, "step_time": plan.predicted_step_time,
                 "tokens_per_sec": plan.predicted_tokens_per_sec}
    out = []
    v: float | int | None
    for name in objectives:
        if name == "memory":
            v = outcome.memory_bytes
        elif outcome.kind is Kind.PREDICTED_OOM:  # never runs: infinitely long, no MFU
            v = 0.0 if name == "mfu" else math.inf
        elif name == "time_to_train":
            v = (full_run(outcome, train_tokens) or {}).get("seconds")
        elif outcome.predicted:
            v = predicted.get(name)
        elif measured is None:
            v = None
        elif name == "loss":  # held-out eval loss when the trial evaluated, else its last training loss
            v = measured.score_loss
        else:
            v = getattr(measured, name, None)
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return None
        out.append(float(v))
    return out


def settle(objectives, outcome: TrialOutcome, train_tokens: int | None = None
           ) -> tuple[TrialState, list[float] | None, TrialOutcome]:
    """(Optuna state, values, the outcome as stored) of a finished trial. Every trial with a
    plan and a step time that did not fail stores its full_run figures (time_to_train an
    objective or not); train_tokens: the study's setting (None: TOKENS_PER_PARAM per parameter)."""
    if outcome.pruned:  # by the pruner, or skipped as predicted dominated (search/tuning/steer.py)
        return TrialState.PRUNED, None, outcome
    if not outcome.kind.failed:
        outcome = outcome.replace(full_run=full_run(outcome, train_tokens))
    if outcome.kind is Kind.PREDICTED_OOM and outcome.plan is not None:
        return TrialState.COMPLETE, objective_values(objectives, outcome, train_tokens), outcome
    if outcome.kind.failed:
        return TrialState.FAIL, None, outcome
    values = objective_values(objectives, outcome, train_tokens)
    if values is None:
        return TrialState.FAIL, None, outcome.failed_as(Kind.CRASH, "the trial finished without a score")
    return TrialState.COMPLETE, values, outcome


PLAN_PHASES = ("lower_s", "compile_s", "flop_probes_s", "hlo_text_s", "predict_s")


def driver_timings(outcome: TrialOutcome, total_s: float) -> dict:
    """The stored timings: the worker's plan and train seconds, the driver's total, the
    harness overhead between them, and where the plan's seconds went (PLAN_PHASES: lowering,
    XLA's compile, the FLOP probes, the optimized HLO's text, the roofline's prediction) when
    the worker measured them."""
    t = outcome.timings
    plan_s, train_s = float(t.get("plan_s", 0.0)), float(t.get("train_s", 0.0))
    start_s = float(t.get("worker_start_s", 0.0))  # starting the worker (opening the devices), apart
    phases = {k: round(float(t[k]), 4) for k in PLAN_PHASES if k in t}
    started = {"worker_start_s": round(start_s, 4)} if "worker_start_s" in t else {}
    return {"plan_s": round(plan_s, 4), "train_s": round(train_s, 4), "total_s": round(total_s, 4), **started,
            "overhead_s": round(max(0.0, total_s - plan_s - train_s - start_s), 4), **phases}


def trial_line(number: int, state: TrialState, decisions: dict, outcome: TrialOutcome, total_s: float) -> str:
    """One line per finished trial."""
    d = " ".join(f"{k}={v}" for k, v in decisions.items())
    kind = outcome.kind
    label = kind.value if kind.failed else ("skipped" if outcome.steered else state.name.lower())
    parts = [f"#{number:<3d} {label:13s} {d}"]
    plan, m, mem = outcome.plan or Plan(), outcome.measured, format_bytes(outcome.memory_bytes)
    if outcome.steered:
        parts.append(f"{steer.describe(outcome.steered)}; mem {mem} (compiled)")
    elif kind is Kind.PREDICTED_OOM:
        how = f" ({plan.screen}, not compiled)" if plan.screen else ""
        parts.append(f"plan {mem} > budget{how}")
    elif outcome.predicted and not kind.failed:
        mfu, step = plan.predicted_mfu, plan.predicted_step_time
        how = f" ({plan.screen})" if plan.screen else ""
        parts.append(f"PREDICTED{how} mfu {'-' if mfu is None else f'{100 * mfu:.1f}%'}  "
                     f"step {'-' if step is None else f'{1e3 * step:.0f} ms'}  mem {mem} "
                     + _MEMORY_SOURCE.get(str(plan.plan_method), "(compiled)")
                     + _full_run(outcome) + _round_trips(plan))
    elif m is not None and m.loss is not None:  # the loss the objective scores: held-out eval loss when there is one
        loss = f"eval loss {m.eval_loss:.3f}" if m.eval_loss is not None else f"loss {m.loss:.3f}"
        dropped = "" if m.dropped_fraction is None else f"  dropped {m.dropped_fraction:.1%}"  # a MoE's, beside MFU
        parts.append(f"{loss}  mfu {100 * (m.mfu or 0):.2f}%{dropped}  mem {mem}  "
                     f"step {1e3 * (m.step_time or 0):.0f} ms" + _full_run(outcome))
    elif kind.failed:
        parts.append(outcome.message[:100])
    start_s = float(outcome.timings.get("worker_start_s", 0.0))
    parts.append(f"{total_s:.1f} s" + (f" (worker start {start_s:.1f} s)" if start_s >= 0.5 else ""))
    return " | ".join(parts)


def _round_trips(plan: Plan) -> str:
    """"  host round trip 2 x 8.6 GB ..." when the compiled step copies offloaded buffers from host
    memory to HBM and back only to relay them out (search/planning/roofline/host.host_round_trips)."""
    roof = plan.roofline or {}  # the roofline's own schema (search/planning/roofline/)
    n, moved = roof.get("host_round_trips") or 0, roof.get("host_round_trip_bytes") or 0.0
    if not n:
        return ""
    return (f"  host round trip {n} x {moved / n / 1e9:.1f} GB for a relayout (libtpu 0.0.52's collective "
            "pipeliner: flags +no_collective_pipeliner removes it)")


def _full_run(outcome: TrialOutcome) -> str:
    """"  full run 3.2 d" (time_to_train) where the trial has the figure."""
    seconds = (outcome.full_run or {}).get("seconds")
    return "" if seconds is None else f"  full run {format_duration(seconds)}"

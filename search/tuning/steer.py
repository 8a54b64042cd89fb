"""Steering a measured study by the planner's predictions (STUDY steer="predicted", --steer).

Every measured trial is compiled ahead of time and the roofline predicts its MFU before any
step runs (search/trial/execute.py). With steering, a trial whose prediction says it cannot
beat a finished trial on any objective is skipped after compiling: it ends PRUNED with the
reason under its `steered` user attribute, and no step is trained.

Point p is predicted dominated by a finished trial q when, for every objective:
  - mfu: q's measured MFU > p's optimistic MFU = p's predicted MFU x R(p). R(p) is the upper
    bound of a one-sided (1 - RISK) prediction interval for p's measured / predicted MFU ratio,
    learned from the study's finished trials (store/correction.py): a linear model of the log
    ratio over features of the compiled plan (predicted step time, communication share, tokens
    per device, tensor-parallel size, recomputation), so a layout the roofline underestimates
    gets a wider margin and one it overestimates a narrower one. Features enter only as the
    measured trials afford them (p <= (n - 3) / 2); with none the bound is the global
    ratio's (log-normal: exp(mean + t(n-1) x sd x sqrt(1 + 1/n)) of the log ratios), which is
    what `steer global` uses for every point; `steer predicted` (or its earlier name `learned`)
    uses the model. The model replaced the global bound as the rule of `predicted` once it
    reached the best config in fewer trainings and skipped it less (benchmarks/RESULTS.md,
    "Predictions that learn from measurements").
    No fixed factor: R is read from the study, it is wide while few trials have been measured
    (Student's t), and nothing is skipped before MIN_MEASURED trials have both figures. (The
    largest ratio seen is not a bound: a new trial exceeds the largest of n with probability
    1/(n+1).);
  - memory: q's compiled peak bytes <= p's (compiled memory is exact, not predicted);
  - loss: q trained the same math (math_key: the same model, data, optimizer, global batch
    and steps; only the layout differs: mesh, remat, attention kernel, activation sharding,
    compiler flags, gradient accumulation, vocab tiling, ZeRO-1 and offload; for a MoE model
    with capacity-based experts the mesh and per-device batch are math, since each device's
    capacity drops its own overflow), so its loss stands for p's; a trial of other math never
    dominates.
and it is strictly better on at least one (on MFU, by construction of the test above).

The driver sends the references (finished trials of the same math, or all of them when loss
is not an objective) with the job; the worker decides after compiling, and in a trial of
several processes process 0's verdict is every process's (search/trial/execute.py). Skipped
trials do not count towards the trial budget, up to one skip per budgeted trial (the rest
count), so a run is bounded.
"""
from __future__ import annotations

import hashlib
import json
import math

from ...store import correction
from ...store.outcome import kind_of, plan_of
from ...store.plan import Plan

MIN_MEASURED = 3  # finished trials with measured and predicted MFU before anything is skipped
RISK = 0.05  # one-sided: the chance a new trial's measured/predicted ratio is above the bound

# Fields that change how a step is laid out and run, not what it computes. `per_device_batch`
# and `global_batch` are replaced by the global batch the mesh gives.
_LAYOUT_FIELDS = ("mesh", "per_device_batch", "global_batch", "remat", "flags", "warmup_steps_for_timing",
                  "checkpoint", "log", "distributed", "run_dir", "grad_accum_steps", "offload_params", "pipeline")
_LAYOUT_MODEL_FIELDS = ("scan_layers", "attention", "attention_block", "vocab_tiles")
_LAYOUT_OPTIMIZER_FIELDS = ("zero1", "offload_state")  # where the moments live, not what they are


def math_key(cfg, num_devices: int) -> str:
    """A digest of what `cfg` computes on `num_devices` devices: equal for two configs that
    train the same model on the same batches with the same optimizer for the same steps."""
    from ...trainer import config as config_lib
    from ...trainer import mesh as mesh_lib
    from ...trainer import moe

    d = config_lib.to_dict(cfg)
    split_is_math = moe.drops_per_device(cfg.model)  # then the mesh and per-device batch are math
    for name in _LAYOUT_FIELDS:
        if not (split_is_math and name in ("mesh", "per_device_batch")):
            d.pop(name, None)
    for name in _LAYOUT_MODEL_FIELDS:
        d["model"].pop(name, None)
    for name in _LAYOUT_OPTIMIZER_FIELDS:
        d["optimizer"].pop(name, None)
    d["global_batch"] = int(mesh_lib.global_batch_size(cfg, num_devices))
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


# Relative difference between two layouts' losses above which the layout changed the math (a
# bug worth seeing): the trial then keeps its own loss instead of its math group's.
LOSS_TOLERANCE = 1e-3


def group_loss(trials, key: str | None, number: int, loss_index: int) -> tuple[int, float] | None:
    """(trial number, loss) of the math group's reference: the lowest-numbered finished,
    measured trial of math `key` (other than `number`) whose loss is its own, not inherited.
    Trials of one math group train the same model on the same batches (math_key), so their
    losses differ only by float32 summation order; the group's loss is measured once."""
    if key is None:
        return None
    refs = [t for t in trials if t.number != number and _scored(t) and t.user_attrs.get("math_key") == key
            and (t.user_attrs.get("loss_group") or {}).get("from_trial") is None
            and t.values and math.isfinite(t.values[loss_index])]
    if not refs:
        return None
    ref = min(refs, key=lambda t: t.number)
    return ref.number, float(ref.values[loss_index])


def _scored(t) -> bool:
    """A finished, measured trial with scores (not a failure, a copy or a prediction)."""
    from optuna.trial import TrialState  # imported here: workers use dominated() alone

    return (t.state == TrialState.COMPLETE and not kind_of(t.user_attrs).failed
            and not t.user_attrs.get("superseded") and not t.user_attrs.get("predicted"))


def ratio_bound(ratios) -> float:
    """The upper (1 - RISK) prediction bound of a new trial's measured / predicted ratio, the
    same for every point (the global ratio: the correction model with no feature)."""
    logs = [math.log(r) for r in ratios]
    n = len(logs)
    mean = sum(logs) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (n - 1))
    return math.exp(mean + correction.t_quantile(1 - RISK, n - 1) * sd * math.sqrt(1 + 1 / n))


def measured_ratios(trials) -> tuple[list[Plan], list[float]]:
    """(plans, log measured / predicted MFU) of the finished trials that have both figures."""
    plans, logs = [], []
    for t in trials:
        if not _scored(t):
            continue
        plan = plan_of(t.user_attrs) or Plan()
        log = correction.log_ratio((t.user_attrs.get("measured") or {}).get("mfu"), plan.predicted_mfu)
        if log is not None:
            plans.append(plan)
            logs.append(log)
    return plans, logs


def steer_job(objectives, plans: list[Plan], logs: list[float], references: list[dict],
              rule: str = "predicted") -> dict | None:
    """What a worker needs to decide, from the measured trials' plans and log measured / predicted
    MFU ratios and the references a trial may be dominated by (None: nothing may be skipped yet,
    below MIN_MEASURED ratios or with no reference). `rule`: the study's steer setting; "global"
    sends the global ratio alone, "predicted" (and its earlier name "learned") the correction
    model too, once the measured trials afford a feature."""
    if len(logs) < max(2, MIN_MEASURED) or not references:
        return None
    out = {"objectives": list(objectives), "ratio": ratio_bound([math.exp(x) for x in logs]),
           "ratio_trials": len(logs), "references": references}
    if rule != "global":
        model = correction.fit(plans, logs)
        if model is not None and not model.is_global:
            out["correction"] = model.to_dict()
    return out


def job_steer(trials, objectives, key: str | None, rule: str = "predicted") -> dict | None:
    """steer_job over the study's trials. `key`: the trial's math_key (references of another
    math are left out when loss is an objective)."""
    refs = []
    for t in trials:
        if not _scored(t) or ("loss" in objectives and t.user_attrs.get("math_key") != key):
            continue
        mfu = (t.user_attrs.get("measured") or {}).get("mfu")
        memory = t.user_attrs.get("memory_bytes")
        if mfu is None or memory is None:
            continue
        refs.append({"number": t.number, "mfu": float(mfu), "memory_bytes": int(memory)})
    return steer_job(objectives, *measured_ratios(trials), refs, rule)


def bound_for(steer: dict, plan: Plan) -> tuple[float, str]:
    """(R for this plan, what it is): the correction model's bound, else the global ratio."""
    if steer.get("correction"):
        model = correction.Correction.from_dict(steer["correction"])
        r = model.upper_ratio(plan, RISK)
        if r is not None:
            return r, model.describe()
    return steer["ratio"], f"global ratio over {steer['ratio_trials']} trials"


def dominated(steer: dict | None, plan: Plan) -> dict | None:
    """The reason a compiled trial (its plan, with predicted_mfu and peak_bytes) is
    predicted dominated, or None when it must be measured."""
    if not steer:
        return None
    objectives = steer["objectives"]
    predicted = plan.predicted_mfu
    if "mfu" in objectives and (predicted is None or not math.isfinite(predicted)):
        return None  # no prediction: it must be measured
    r, source = bound_for(steer, plan)
    optimistic = predicted * r if predicted is not None else None
    best = None
    for ref in steer["references"]:
        if "memory" in objectives and ref["memory_bytes"] > (plan.peak_bytes or 0):
            continue
        if "mfu" in objectives:
            if not ref["mfu"] > optimistic:
                continue
        elif not ("memory" in objectives and ref["memory_bytes"] < (plan.peak_bytes or 0)):
            continue  # loss alone ties; loss and memory need strictly less memory
        if best is None or ref["mfu"] > best["mfu"]:
            best = ref
    if best is None:
        return None
    out = {"dominated_by": best["number"], "reference_mfu": best["mfu"],
           "reference_memory_bytes": best["memory_bytes"], "ratio": r, "ratio_source": source,
           "ratio_trials": steer["ratio_trials"]}
    if optimistic is not None:
        out.update(predicted_mfu=predicted, optimistic_mfu=optimistic)
    return out


def describe(steered: dict) -> str:
    """One line: why a trial was skipped."""
    parts = [f"predicted dominated by #{steered['dominated_by']}"]
    if steered.get("optimistic_mfu") is not None:
        source = steered.get("ratio_source") or f"measured/predicted over {steered['ratio_trials']} trials"
        parts.append(f"optimistic MFU {100 * steered['optimistic_mfu']:.1f}% (predicted "
                     f"{100 * steered['predicted_mfu']:.1f}% x {steered['ratio']:.2f}, "
                     f"the {100 * (1 - RISK):.0f}% bound of the {source}) < measured "
                     f"{100 * steered['reference_mfu']:.1f}%")
    return "skipped: " + "; ".join(parts)


def counted(active) -> int:
    """Trials that count towards the budget: skipped ones only past one per counted trial."""
    skipped = sum(1 for t in active if t.user_attrs.get("steered"))
    rest = len(active) - skipped
    return rest + max(0, skipped - rest)

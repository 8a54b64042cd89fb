"""What one trial came to: the typed record both sides of the study read and write.

A worker builds a `TrialOutcome`, sends it to its driver in the wire form (`to_wire`, one
JSON line over the worker pipe, or a key of a slice gang's key-value store), and the driver
stores it in the storage form (`to_user_attrs`, Optuna user attributes). The report reads
it back with `from_user_attrs`. Both forms keep the keys and strings that studies stored
before this record existed, so old studies still read.

The plan is store/plan.py's Plan; its stored form is written and read here, at the boundary.
Imports neither JAX, Optuna nor anything of paxsearch outside store/.
"""
from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass, field
from typing import Any

from .plan import Plan


class Kind(str, enum.Enum):
    """How a trial ended. The values are the `failure_kind` strings stored since the first
    release; OK is stored as no failure_kind at all."""

    OK = "ok"
    INVALID = "invalid"  # static checks failed (mesh, divisibility, unknown names)
    PREDICTED_OOM = "predicted_oom"  # the compiled plan exceeds the memory budget (no step run)
    COMPILE_ERROR = "compile_error"  # XLA could not compile the step
    RUNTIME_OOM = "runtime_oom"  # out of memory while training (or the worker was OOM-killed)
    NAN_LOSS = "nan_loss"  # training diverged
    TIMEOUT = "timeout"  # the trial ran past its wall-clock limit; its process group was killed
    INTERRUPTED = "interrupted"  # the driver was interrupted (Ctrl-C) or shut down: queued again
    CRASH = "crash"  # the worker died or raised something unexpected
    HOST_LOST = "host_lost"  # another host of a slice gang stopped answering mid-trial

    @property
    def failed(self) -> bool:
        return self is not Kind.OK

    @property
    def same_on_every_host(self) -> bool:
        """Whether every host of a slice gang reaches this kind alike for the same config (the
        config decides it: the checks, the compiler, the math). Any other kind on one host is
        that host's own (its process died, ran out of memory, lost its partner)."""
        return self in _SAME_ON_EVERY_HOST

    @property
    def runs_again(self) -> bool:
        """Not the config's doing: the trial is superseded and its config queued again."""
        return self in (Kind.HOST_LOST, Kind.INTERRUPTED)

    @classmethod
    def stored(cls, text: str | None) -> Kind:
        """The kind of a stored failure_kind (None or "" for a trial that did not fail)."""
        return cls(text) if text else cls.OK

    @property
    def stored_text(self) -> str | None:
        return None if self is Kind.OK else self.value


_SAME_ON_EVERY_HOST = frozenset({Kind.OK, Kind.INVALID, Kind.PREDICTED_OOM, Kind.COMPILE_ERROR, Kind.NAN_LOSS})
FAILURE_KINDS = tuple(k for k in Kind if k.failed)


@dataclass(frozen=True)
class Measured:
    """What a short training measured (process 0's view); None where it has no figure."""

    loss: float | None = None
    eval_loss: float | None = None
    mfu: float | None = None
    hfu: float | None = None
    tokens_per_sec: float | None = None
    step_time: float | None = None
    peak_bytes: int | None = None  # device peak (memory_stats), or the worker's peak RSS on CPU
    steps: int = 0
    # a mixture of experts' last logged interval (trainer StepMetrics): the share of routes dropped
    # over capacity and the load-balancing loss; None (and not stored) for a dense model
    dropped_fraction: float | None = None
    load_balance_loss: float | None = None

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        for key in MOE_KEYS:  # a dense trial stores what it stored before MoE existed
            if d[key] is None:
                del d[key]
        return d

    @classmethod
    def from_dict(cls, d: dict | None) -> Measured | None:
        if d is None:
            return None
        known = {k: d[k] for k in MEASURED_KEYS if k in d}
        return dataclasses.replace(cls(), **known)

    @property
    def score_loss(self) -> float | None:
        """The loss the objective scores: the held-out eval loss when the trial evaluated."""
        return self.eval_loss if self.eval_loss is not None else self.loss


MEASURED_KEYS = tuple(f.name for f in dataclasses.fields(Measured))
MOE_KEYS = ("dropped_fraction", "load_balance_loss")


@dataclass(frozen=True)
class Counters:
    train_calls: int = 0
    steps_run: int = 0

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict | None) -> Counters:
        d = d or {}
        return cls(int(d.get("train_calls", 0)), int(d.get("steps_run", 0)))


# The environment keys a stored trial carries (from its worker, or the plan target's devices).
ENV_KEYS = ("jax", "jaxlib", "libtpu", "device_kind", "platform", "num_devices", "xla_flags", "process_count",
            "flag_set", "libtpu_init_args")


@dataclass(frozen=True)
class TrialOutcome:
    """One trial's end: its kind, and every figure it got to before that.

    plan: the Plan (store/plan.py: the compile's figures, the roofline's predicted figures, the
    target), or None when no step was compiled. measured: None when no training finished.
    timings: seconds by phase (a worker's plan_s / train_s / worker_s; the stored form the
    driver's plan_s / train_s / total_s / overhead_s). env: the stored environment (set by
    the driver with `with_env`); peak_flops and device are what a worker sends towards it."""

    kind: Kind = Kind.OK
    message: str = ""
    plan: Plan | None = None
    measured: Measured | None = None
    timings: dict = field(default_factory=dict)
    counters: Counters = Counters()
    predicted: bool = False  # figures are the roofline's predictions (a plan-only trial)
    pruned: bool = False  # by the pruner, or skipped as predicted dominated (steered)
    steered: dict | None = None
    intermediate: list | None = None  # [[step, loss], ...] of the short training
    memory_budget: dict | None = None  # {"bytes": int | None, "source": str}
    full_run: dict | None = None  # how long the full run would take (search/trial/record.py full_run)
    peak_flops: dict | None = None  # {"value": float | None, "source": str} (wire form only)
    device: dict | None = None  # a plan-only trial's target devices (wire form only)
    env: dict | None = None

    # ----- building -----
    @classmethod
    def failure(cls, kind: Kind, message: str, **fields: Any) -> TrialOutcome:
        return cls(kind=kind, message=message, **fields)

    def failed_as(self, kind: Kind, message: str) -> TrialOutcome:
        """This outcome, ended as `kind` (the figures it got to are kept)."""
        return dataclasses.replace(self, kind=kind, message=message)

    def replace(self, **fields: Any) -> TrialOutcome:
        return dataclasses.replace(self, **fields)

    def with_env(self, worker_env: dict | None) -> TrialOutcome:
        """The stored environment: the worker's, its peak FLOP/s, and for a plan-only trial the
        target's devices in place of the worker's CPU."""
        if worker_env is None:
            return self
        peak = self.peak_flops or {}
        env = {k: worker_env.get(k) for k in ENV_KEYS}
        env["peak_flops_per_device"] = peak.get("value")
        env["peak_flops_source"] = peak.get("source")
        env.update(self.device or {})
        return dataclasses.replace(self, env=env, peak_flops=None, device=None)

    # ----- the wire form (worker -> driver, gang hosts -> host 0) -----
    def to_wire(self) -> dict:
        d: dict = {"type": "result", "counters": self.counters.to_dict(), "timings": dict(self.timings),
                   "plan": self.plan.to_stored() if self.plan is not None else None,
                   "measured": self.measured.to_dict() if self.measured else None,
                   "pruned": self.pruned, "predicted": self.predicted}
        for key in ("steered", "intermediate", "memory_budget", "peak_flops", "device", "env"):
            if getattr(self, key) is not None:
                d[key] = getattr(self, key)
        if self.kind.failed:
            d["failure_kind"], d["failure_message"] = self.kind.value, self.message
        return d

    @classmethod
    def from_wire(cls, d: dict) -> TrialOutcome:
        return cls(kind=Kind.stored(d.get("failure_kind")), message=d.get("failure_message") or "",
                   plan=Plan.from_stored(d.get("plan")), measured=Measured.from_dict(d.get("measured")),
                   timings=dict(d.get("timings") or {}), counters=Counters.from_dict(d.get("counters")),
                   predicted=bool(d.get("predicted")), pruned=bool(d.get("pruned")), steered=d.get("steered"),
                   intermediate=d.get("intermediate"), memory_budget=d.get("memory_budget"),
                   peak_flops=d.get("peak_flops"), device=d.get("device"), env=d.get("env"))

    # ----- the storage form (Optuna user attributes) -----
    @property
    def memory_bytes(self) -> int | None:
        """The per-device bytes the memory objective scores: the plan's compiled peak."""
        return self.plan.peak_bytes if self.plan is not None else None

    def to_user_attrs(self) -> dict:
        """The user attributes this outcome stores (None values are not stored). Decisions and
        the config are stored when the trial is asked for, not here."""
        measured = self.measured or Measured(steps=self.counters.steps_run)  # no scores, and the steps it got
        plan = self.plan.to_stored() if self.plan is not None else None
        attrs: dict = {"plan": plan, "measured": measured.to_dict(), "memory_bytes": self.memory_bytes,
                       "timings": dict(self.timings), "counters": self.counters.to_dict(),
                       "predicted": self.predicted, "memory_budget": self.memory_budget or None,
                       "steered": self.steered or None, "intermediate": self.intermediate or None, "env": self.env,
                       "full_run": self.full_run or None}
        if self.memory_budget and self.memory_bytes is not None and self.memory_budget.get("bytes") is not None:
            attrs["constraint"] = [float(self.memory_bytes - self.memory_budget["bytes"])]
        if self.pruned:
            attrs["pruned"] = True
        if self.kind.failed:
            attrs["failure_kind"], attrs["failure_message"] = self.kind.value, self.message
        return {k: v for k, v in attrs.items() if v is not None}

    @classmethod
    def from_user_attrs(cls, attrs: dict) -> TrialOutcome:
        """The outcome a trial stored (a trial still running, or stored by a release before
        this record, reads with the fields it has)."""
        measured = Measured.from_dict(attrs.get("measured"))
        return cls(kind=Kind.stored(attrs.get("failure_kind")), message=attrs.get("failure_message") or "",
                   plan=plan_of(attrs), measured=measured, timings=dict(attrs.get("timings") or {}),
                   counters=Counters.from_dict(attrs.get("counters")), predicted=bool(attrs.get("predicted")),
                   pruned=bool(attrs.get("pruned")), steered=attrs.get("steered"),
                   intermediate=attrs.get("intermediate"), memory_budget=attrs.get("memory_budget"),
                   env=attrs.get("env"), full_run=attrs.get("full_run"))


def plan_of(attrs: dict) -> Plan | None:
    """The Plan a trial stored (its "plan" user attribute), or None when it has none."""
    stored = attrs.get("plan")
    return Plan.from_stored(stored) if isinstance(stored, dict) else None


def kind_of(attrs: dict) -> Kind:
    """The kind a stored trial ended with (OK for a trial that did not fail, or still runs)."""
    return Kind.stored(attrs.get("failure_kind"))


def finite_or_none(x: Any) -> float | None:
    """A measured figure as stored: a finite float, or None."""
    return float(x) if x is not None and math.isfinite(float(x)) else None

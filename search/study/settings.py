"""A study's settings: what a space file's STUDY dict may hold, and the command line overrides."""
from __future__ import annotations

import dataclasses
import math
import os
import re
from dataclasses import dataclass, field

from ..errors import UserError

OBJECTIVES = {"loss": "minimize", "mfu": "maximize", "memory": "minimize",
              "time_to_train": "minimize"}  # seconds the full run would take (search/trial/record.py)
TOKENS_PER_PARAM = 20  # the full run's default token count per parameter (Chinchilla, Hoffmann et al. 2022)
TUNERS = ("tpe", "nsga2", "random", "grid", "evolution")
PRUNERS = ("none", "median", "hyperband")
STEERS = ("none", "predicted", "global", "learned")  # search/tuning/steer.py; "learned" = "predicted"
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


class SettingsError(UserError, ValueError):
    """A setting is not valid; the message names it and the allowed values."""


@dataclass(frozen=True)
class StudySettings:
    """objectives: names from OBJECTIVES, in the order of trial.values.
    trials: the trial budget (grid: at most the number of points).
    tuner: one of TUNERS. target: devices of one trial ("cpu:8").
    processes: processes per trial (each with devices/processes local devices; jax.distributed).
    memory_budget: per-device bytes a plan may use ("2GiB", an int, or None for the device's memory).
    timeout: wall-clock seconds per trial, compile and training included.
    pruner: for single-objective studies, an Optuna pruner on intermediate loss.
    workers: trials run at once by one driver (one worker process each).
    seed: seed of the tuner. count_flops: count the executed FLOPs (HFU) with every loop's trip
    count, from the step's optimized HLO (two unrolled probe compiles where it cannot be read).
    tokens: a training-token budget per trial ("2M", 65536): every trial trains
    round(tokens / (global batch x seq_len)) steps (steps_for_tokens), and the objective loss
    is its held-out eval loss. None: each config's own steps.
    compute: a training-compute budget per trial in model FLOPs ("1e15", "3P"): every trial trains
    compute / (model FLOPs per token) tokens (tokens_for_compute), so trials of different model
    sizes compare their (held-out) loss at equal compute, not at equal tokens. Excludes tokens.
    steer: "predicted" skips a measured trial, after compiling and before training, when the
    roofline's prediction times the point's own bound of the measured/predicted ratio says a
    finished trial dominates it (search/tuning/steer.py): the bound from a model of that ratio
    over plan features, learned from the study's measured trials (store/correction.py), the
    global ratio while too few have run; "learned" is the same rule (its earlier name);
    "global" uses one global bound for every point (the rule before the model); "none" (the
    default) trains every proposal.
    plan_cache: where plan-only trials keep compiled plans for every study and run folder
    (search/planning/plan_cache.py): "on" ($PAXSEARCH_PLAN_CACHE, else $PAXSEARCH_CACHE/plans),
    "off" (every plan compiled, nothing stored) or a folder.
    plan_compile: how plan-only trials on a TPU topology compile (search/planning/targets.py):
    "passes" (the default) stops the TPU compiler once its HLO passes and buffer assignment are
    done, which give every figure of a plan (search/planning/hlo_passes.py; the generated code's bytes
    counted at a bound above every program measured); "full" compiles to the end, as a real run would.
    train_tokens: the tokens of the full run the objective time_to_train times ("300G", 2e11):
    time_to_train = train_tokens / (global batch x seq_len / step time), the step time measured
    (or predicted, for a plan-only trial). None: TOKENS_PER_PARAM tokens per parameter of each
    trial's model (Chinchilla's compute-optimal count).
    imports: module names (dotted identifiers) the driver and every worker import before a
    trial's config is built, e.g. one registering a seqio task; `replace(imports=...)` adds
    to those already set (the command line's --import adds to STUDY's and the study's).
    """

    objectives: tuple[str, ...] = ("loss", "mfu", "memory")
    trials: int = 12
    tuner: str = "tpe"
    target: str = "cpu:8"
    processes: int = 1
    memory_budget: int | None = None
    timeout: float = 600.0
    pruner: str = "none"
    workers: int = 1
    seed: int = 0
    count_flops: bool = True
    tokens: int | None = None
    compute: int | None = None  # model FLOPs per trial (equal compute); excludes tokens
    steer: str = "none"
    plan_cache: str = "on"
    plan_compile: str = "passes"  # plan-only TPU trials: "passes" (HLO passes only) or "full"
    train_tokens: int | None = None  # the full run's tokens (time_to_train); None: 20 per parameter
    imports: tuple[str, ...] = ()  # user modules every process imports (search/study/user_imports.py)
    extra: dict = field(default_factory=dict)  # kept empty, so that studies stored with it still load

    @classmethod
    def from_dict(cls, d: dict) -> "StudySettings":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise SettingsError(f"unknown setting(s) {', '.join(unknown)}; "
                                f"known: {', '.join(sorted(known - {'extra'}))}")
        if d.get("extra"):  # once fault injection; faults are now a test-only seam (tests/fault_driver.py)
            raise SettingsError(f"setting extra={d['extra']!r} is not supported; remove it from STUDY")
        return cls().replace(**d)

    def replace(self, **changes) -> "StudySettings":
        changes = {k: v for k, v in changes.items() if v is not None}
        if "imports" in changes:
            changes["imports"] = tuple(self.imports) + tuple(_import_names(changes["imports"]))
        s = dataclasses.replace(self, **changes)
        return s._validated()

    def _validated(self) -> "StudySettings":
        _check_types(self)
        objectives = (self.objectives,) if isinstance(self.objectives, str) else tuple(self.objectives)
        bad = [o for o in objectives if o not in OBJECTIVES]
        if bad or not objectives or len(set(objectives)) != len(objectives):
            raise SettingsError(f"objectives {list(objectives)}: choose distinct names from {', '.join(OBJECTIVES)}")
        if self.tuner == "gp":
            raise SettingsError("tuner gp is not available (Optuna's GPSampler needs PyTorch, too heavy a "
                                "dependency for paxsearch); use tpe, nsga2, random, grid or evolution")
        if self.tuner not in TUNERS:
            raise SettingsError(f"unknown tuner {self.tuner!r}; choose one of {', '.join(TUNERS)}")
        if self.tuner == "evolution" and len(objectives) > 1:
            raise SettingsError(f"tuner evolution optimizes one objective, but the study has {len(objectives)} "
                                f"({', '.join(objectives)}); pass --objective NAME to pick one, or use nsga2 or tpe "
                                "for several")
        if self.pruner not in PRUNERS:
            raise SettingsError(f"unknown pruner {self.pruner!r}; choose one of {', '.join(PRUNERS)}")
        if self.steer not in STEERS:
            raise SettingsError(f"unknown steer {self.steer!r}; choose one of {', '.join(STEERS)}")
        if int(self.trials) < 1 or int(self.processes) < 1 or int(self.workers) < 1:
            raise SettingsError("trials, processes and workers must be >= 1")
        if not float(self.timeout) > 0 or not math.isfinite(float(self.timeout)):
            raise SettingsError(f"timeout must be a finite number of seconds > 0, got {self.timeout}")
        if not 0 <= int(self.seed) < 2**32:
            raise SettingsError(f"seed must be in [0, 2**32), got {self.seed}")
        _check_time_to_train(self, objectives)
        budget = None if self.memory_budget in (None, "", "device") else parse_bytes(self.memory_budget)
        tokens = None if self.tokens is None else parse_count(self.tokens, "tokens")
        compute = None if self.compute is None else parse_count(self.compute, "compute")
        if tokens is not None and compute is not None:
            raise SettingsError("set one budget per trial: tokens= (equal tokens) or compute= (equal model FLOPs), "
                                "not both")
        plan_cache = _plan_cache(self.plan_cache)
        if self.plan_compile not in PLAN_COMPILE:
            raise SettingsError(f"setting plan_compile={self.plan_compile!r} must be one of {', '.join(PLAN_COMPILE)}")
        train_tokens = None if self.train_tokens is None else parse_count(self.train_tokens, "train_tokens")
        return dataclasses.replace(self, objectives=objectives, trials=int(self.trials), tokens=tokens,
                                   compute=compute, plan_cache=plan_cache, train_tokens=train_tokens,
                                   processes=int(self.processes), workers=int(self.workers),
                                   timeout=float(self.timeout), memory_budget=budget, seed=int(self.seed),
                                   count_flops=bool(self.count_flops), extra=dict(self.extra or {}),
                                   imports=_import_names(self.imports))

    @property
    def directions(self) -> list[str]:
        return [OBJECTIVES[o] for o in self.objectives]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self) | {"objectives": list(self.objectives), "imports": list(self.imports)}


def _check_time_to_train(s: StudySettings, objectives: tuple[str, ...]) -> None:
    """time_to_train has no intermediate values to prune on, and steering predicts MFU and
    memory only: either with it would act on something else, so each is refused in one line."""
    if "time_to_train" not in objectives:
        return
    if s.pruner != "none":
        raise SettingsError(f"pruner {s.pruner} prunes on intermediate values, and time_to_train has none "
                            "(it is known when a trial ends); use --pruner none")
    if s.steer != "none":
        raise SettingsError(f"steer {s.steer} does not predict time_to_train (only MFU and memory); "
                            "use --steer none, or objectives without time_to_train")


_INTS = ("trials", "processes", "workers", "seed")
_STRS = ("tuner", "target", "pruner", "steer")


def _check_types(s: StudySettings) -> None:
    """Each setting has its type: integers are ints (not 2.5, not True), timeout a real number,
    names strings, count_flops a bool, objectives and imports names (SettingsError otherwise)."""
    def bad(name: str, value, want: str) -> SettingsError:
        return SettingsError(f"setting {name}={value!r} must be {want}")

    for name in _INTS:
        value = getattr(s, name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad(name, value, "an integer")
    if isinstance(s.timeout, bool) or not isinstance(s.timeout, (int, float)):
        raise bad("timeout", s.timeout, "a number of seconds")
    for name in _STRS:
        if not isinstance(getattr(s, name), str):
            raise bad(name, getattr(s, name), "a string")
    if not isinstance(s.count_flops, bool):
        raise bad("count_flops", s.count_flops, "True or False")
    for name in ("objectives", "imports"):
        value = getattr(s, name)
        names = (value,) if isinstance(value, str) else value
        if not isinstance(names, (list, tuple)) or not all(isinstance(v, str) for v in names):
            raise bad(name, value, "a list of names")
    if not isinstance(s.extra, dict):
        raise bad("extra", s.extra, "empty")


PLAN_COMPILE = ("passes", "full")


def _plan_cache(value) -> str:
    """A plan_cache setting as stored: "on", "off", or an absolute folder path."""
    if not isinstance(value, str) or not value.strip():
        raise SettingsError(f"setting plan_cache={value!r} must be on, off or a folder")
    text = value.strip()
    if text.lower() in ("on", "off"):
        return text.lower()
    return os.path.abspath(os.path.expanduser(text))


def _import_names(names) -> tuple[str, ...]:
    from .user_imports import check_names

    try:
        return check_names(names)
    except ValueError as e:
        raise SettingsError(str(e)) from None


def parse_bytes(value) -> int:
    """'2GiB', '512MiB', '1.5GB', '1e9' or an int -> bytes."""
    if isinstance(value, bool):
        raise SettingsError(f"memory budget {value!r} is not a size")
    if isinstance(value, (int, float)):
        if not math.isfinite(value) or value < 1:
            raise SettingsError(f"memory budget must be a finite number of bytes >= 1, got {value}")
        return int(value)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([a-zA-Z]*)\s*", str(value))
    if not m or m.group(2).lower() not in _UNITS:
        raise SettingsError(f"memory budget {value!r} is not a size like 2GiB, 512MiB, 1.5GB or 1000000")
    size = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not math.isfinite(size):
        raise SettingsError(f"memory budget {value!r} is not a finite size")
    n = int(size)
    if n <= 0:
        raise SettingsError(f"memory budget must be > 0, got {value!r}")
    return n


_COUNT_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "p": 10**15,
                "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}


def parse_count(value, what: str) -> int:
    """65536, 1e6, '2M', '64Ki' (k/M/G/T/P decimal, Ki/Mi/Gi/Ti binary) -> a positive int."""
    if isinstance(value, bool):
        raise SettingsError(f"{what} {value!r} is not a count")
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise SettingsError(f"{what} must be a finite count, got {value!r}")
        n = int(value)
    elif not isinstance(value, str):
        raise SettingsError(f"{what} {value!r} is a {type(value).__name__}, not a count like 65536, 2M or 64Ki")
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([a-zA-Z]*)\s*", str(value))
        unit = m.group(2).lower() if m else ""
        if not m or unit not in _COUNT_UNITS:
            raise SettingsError(f"{what} {value!r} is not a count like 65536, 2M or 64Ki")
        count = float(m.group(1)) * _COUNT_UNITS[unit]
        if not math.isfinite(count):
            raise SettingsError(f"{what} {value!r} is not a finite count")
        n = int(count)
    if n < 1:
        raise SettingsError(f"{what} must be >= 1, got {value!r}")
    return n


def steps_for_tokens(tokens: int, global_batch: int, seq_len: int) -> int:
    """Training steps that see `tokens` tokens at global_batch x seq_len tokens a step: the
    nearest whole number of steps (halves round up), so a trial sees the budget to within half
    a step. SettingsError when the budget is less than one step."""
    per_step = int(global_batch) * int(seq_len)
    if tokens < per_step:
        raise SettingsError(f"tokens={tokens:,} is less than one step of global batch {global_batch} x seq_len "
                            f"{seq_len} = {per_step:,} tokens; raise STUDY tokens= or use a smaller batch")
    return int(tokens // per_step + (1 if 2 * (tokens % per_step) >= per_step else 0))


def tokens_for_compute(compute: int, flops_per_token: int) -> int:
    """The training tokens that spend `compute` model FLOPs at `flops_per_token` (forward and
    backward, trainer/flops.py: 3 x the forward's): the token budget of STUDY compute=."""
    if flops_per_token < 1:
        raise SettingsError(f"model FLOPs per token must be >= 1, got {flops_per_token}")
    tokens = compute // flops_per_token
    if tokens < 1:
        raise SettingsError(f"compute={compute:,} FLOPs is less than one token of this model ({flops_per_token:,} "
                            "FLOPs per token); raise STUDY compute=")
    return int(tokens)

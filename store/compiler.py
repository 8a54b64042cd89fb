"""The compiler a plan was made with: the jax, jaxlib and libtpu versions, a Plan's `compiler`.

    Plan.make(..., compiler=made_here())      # a compiled plan (a worker's compile, the HLO passes, the trainer's)
    Plan.make(..., compiler=NOT_COMPILED)     # None: an analytic plan compiled nothing
    of_plan(plan)                      # the record, None (analytic) or UNKNOWN (stored before plans named it)
    describe(of_plan(plan))            # "jax 0.10.2, jaxlib 0.10.2, libtpu 0.0.52"
    planned_with(plans)                # one line for a study's plans; mixed versions are said so
    recheck(plan, trial, local_libtpu, platform)   # a plan whose libtpu is not this TPU machine's

A plan is only as good as its compiler: the same step compiled by another libtpu may need
GiB more (on the project's v5e, libtpu 0.0.42.1 needed 1-3 GiB more per point than 0.0.52).
`made_here` is the one builder of the record (a typed Plan picks it up from here). Stored
data is read as data: a record that is not a dict of version strings reads as UNKNOWN.
Pure: imports neither JAX nor anything of paxsearch but store/plan.py's type (the versions come
from package metadata).
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import TYPE_CHECKING, Any, Union

if TYPE_CHECKING:
    from .plan import Plan

KEY = "compiler"  # the stored plan's entry (store/plan.py)
PACKAGES = ("jax", "jaxlib", "libtpu")
NOT_COMPILED = None  # an analytic plan: nothing was compiled
GIB = 2 ** 30
UNKNOWN = "unknown"  # a plan stored before plans named their compiler (or a malformed record)

Record = dict[str, Union[str, None]]
Stored = Union[Record, None, str]  # a record, NOT_COMPILED or UNKNOWN


def package_version(package: str) -> str | None:
    """The installed version of `package`; None when it is not installed."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def made_here(version: Callable[[str], str | None] = package_version) -> Record:
    """The record of a plan compiled in this process: the installed jax, jaxlib and libtpu
    (None when libtpu is not installed). `version`: how a package's version is read (tests)."""
    return {p: version(p) for p in PACKAGES}


def named(plan: Plan | None, worker_env: Mapping | None) -> Plan | None:
    """`plan` naming its compiler: unchanged when it names one (the planning layer's plans do)
    or was not compiled in a worker (a screen's answer); else, for the trainer's plan of a trial
    a worker compiled and trained, the versions of that worker's environment (`worker_env`, the
    environment() a worker reports: the jax, jaxlib and libtpu it compiled with)."""
    if (plan is None or plan.has("compiler") or plan.has("screen") or plan.plan_method != "compiled"
            or not isinstance(worker_env, Mapping) or not isinstance(worker_env.get("jax"), str)):
        return plan
    return plan.with_(compiler={p: worker_env.get(p) for p in PACKAGES})


def read(value: Any) -> Stored:
    """A stored plan's compiler entry as a record, NOT_COMPILED (None: analytic) or UNKNOWN (an
    entry that is not a record of version strings). store/plan.py reads the entry with it."""
    if value is None:
        return NOT_COMPILED
    if (isinstance(value, Mapping) and isinstance(value.get("jax"), str)
            and all(value.get(p) is None or isinstance(value.get(p), str) for p in PACKAGES)):
        return {p: value.get(p) for p in PACKAGES}
    return UNKNOWN


def of_plan(plan: Plan | None) -> Stored:
    """The compiler of a plan: its record, NOT_COMPILED (analytic), or UNKNOWN for a plan stored
    before plans named their compiler (or none)."""
    return plan.compiler if plan is not None else UNKNOWN


def describe(stored: Stored) -> str:
    """"jax 0.10.2, jaxlib 0.10.2, libtpu 0.0.52" ("no libtpu" without one); "analytic (nothing
    compiled)"; "unknown"."""
    if stored is NOT_COMPILED:
        return "analytic (nothing compiled)"
    if not isinstance(stored, Mapping):
        return UNKNOWN
    libtpu = f"libtpu {stored['libtpu']}" if stored.get("libtpu") else "no libtpu"
    return f"jax {stored.get('jax')}, jaxlib {stored.get('jaxlib')}, {libtpu}"


def planned_line(stored: Stored) -> str:
    """One plan's compiler as a phrase: "planned with jax 0.10.2, jaxlib 0.10.2, libtpu 0.0.52",
    "planned analytically: nothing compiled", or "planned with an unknown compiler (...)"."""
    if stored is NOT_COMPILED:
        return "planned analytically: nothing compiled"
    if not isinstance(stored, Mapping):
        return f"planned with an unknown compiler ({_UNKNOWN_WHY})"
    return f"planned with {describe(stored)}"


_UNKNOWN_WHY = "stored before plans named theirs"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _tally(plans: Iterable[Plan | None]) -> tuple[Counter[str], int, int]:
    """(plans by compiler text, analytic plans, plans of an unknown compiler); trials without a plan left out."""
    compiled: Counter[str] = Counter()
    analytic = unknown = 0
    for plan in plans:
        if plan is None:
            continue
        stored = of_plan(plan)
        if stored is NOT_COMPILED:
            analytic += 1
        elif isinstance(stored, Mapping):
            compiled[describe(stored)] += 1
        else:
            unknown += 1
    return compiled, analytic, unknown


def mixed(plans: Iterable[Plan | None]) -> bool:
    """Whether the plans were compiled by more than one jax / jaxlib / libtpu."""
    return len(_tally(plans)[0]) > 1


def planned_with(plans: Iterable[Plan | None]) -> str | None:
    """One line naming the compiler of a study's plans (trials without a plan are left out):
    "planned with jax 0.10.2, jaxlib 0.10.2, libtpu 0.0.52"; several versions are "planned with
    mixed compilers: ... (20 plans); ... (7 plans)"; analytic and unknown plans are counted
    after. None when no trial has a plan."""
    compiled, analytic, unknown = _tally(plans)
    if len(compiled) > 1:
        head = "planned with mixed compilers: " + "; ".join(
            f"{text} ({_plural(n, 'plan')})" for text, n in sorted(compiled.items(), key=lambda kv: (-kv[1], kv[0])))
    elif compiled:
        head = f"planned with {next(iter(compiled))}"
    elif unknown:
        head, unknown = planned_line(UNKNOWN), 0
    elif analytic:
        return planned_line(NOT_COMPILED)
    else:
        return None
    parts = [head]
    if analytic:
        parts.append(f"{_plural(analytic, 'analytic plan')} compiled nothing")
    if unknown:
        parts.append(f"{_plural(unknown, 'plan')} of an unknown compiler ({_UNKNOWN_WHY})")
    return "; ".join(parts)


# ----------------------------------------------------------------------------- on a TPU machine

def libtpu_differs(stored: Stored, local_libtpu: str | None, platform: str) -> bool:
    """Whether a plan's memory must be checked again before it trains here: this machine has
    TPUs (`platform` "tpu", jax.devices()[0].platform) and the plan was compiled with another
    libtpu than `local_libtpu` (or with none). An analytic or unknown plan names no libtpu: False."""
    return platform == "tpu" and isinstance(stored, Mapping) and stored.get("libtpu") != local_libtpu


def _libtpu(version: str | None) -> str:
    return f"libtpu {version}" if version else "no libtpu"


@dataclass(frozen=True)
class Recheck:
    """A planned trial about to train on a TPU machine whose libtpu is not its plan's: the compile
    `paxsearch train` does anyway is its memory's re-check with the local compiler."""

    trial: int | None
    planned_bytes: int | None  # the plan's per-device peak
    planned_libtpu: str | None
    local_libtpu: str | None

    @property
    def _what(self) -> str:
        return f"trial {self.trial}" if self.trial is not None else "the trial"

    @property
    def line(self) -> str:
        """The one line said before compiling."""
        return (f"{self._what} was planned with {_libtpu(self.planned_libtpu)}; this machine has "
                f"{self.local_libtpu or 'no libtpu'}: its memory is re-checked with the local compiler before "
                "training")

    def refusal(self, local_bytes: int, limit_bytes: int, limit_source: str) -> str | None:
        """The error line when the local compiler's step (`local_bytes` per device) exceeds the
        chip's `limit_bytes`; None when it fits."""
        if local_bytes <= limit_bytes:
            return None
        planned = (f"planned {self.planned_bytes / GIB:.2f} GiB per device with {_libtpu(self.planned_libtpu)}"
                   if self.planned_bytes is not None else f"planned with {_libtpu(self.planned_libtpu)}")
        return (f"{self._what} does not fit this machine: {planned}, the local compiler "
                f"({_libtpu(self.local_libtpu)}) needs {local_bytes / GIB:.2f} GiB per device, above the chip's "
                f"limit of {limit_bytes / GIB:.2f} GiB ({limit_source})")


def recheck(plan: Plan | None, trial: int | None, local_libtpu: str | None, platform: str) -> Recheck | None:
    """The Recheck of a stored trial's `plan` on this machine (`platform`: jax.devices()[0].platform;
    `local_libtpu`: the installed libtpu), or None when its memory needs no re-check (libtpu_differs)."""
    stored = of_plan(plan)
    if plan is None or not isinstance(stored, Mapping) or not libtpu_differs(stored, local_libtpu, platform):
        return None
    peak = plan.peak_bytes
    return Recheck(trial, peak if isinstance(peak, int) and not isinstance(peak, bool) else None,
                   stored.get("libtpu"), local_libtpu)


def study_line(plans: Iterable[Plan | None], local_libtpu: str | None, platform: str) -> str | None:
    """The one line a study continued on a TPU machine gets when earlier plans were compiled with
    another libtpu; None otherwise (no TPUs here, or every plan is this machine's)."""
    others: Counter[str] = Counter()
    for plan in plans:
        stored = of_plan(plan) if plan is not None else UNKNOWN
        if isinstance(stored, Mapping) and libtpu_differs(stored, local_libtpu, platform):
            others[_libtpu(stored.get("libtpu"))] += 1
    if not others:
        return None
    listed = ", ".join(f"{_plural(n, 'plan')} with {text}" for text, n in sorted(others.items()))
    return (f"this study's earlier plans were made with another libtpu ({listed}); this machine has "
            f"{_libtpu(local_libtpu)}: trials here are compiled and their memory checked with the local compiler "
            "before they train, and `paxsearch train RUN --trial N` re-checks a planned trial the same way")

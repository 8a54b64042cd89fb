"""The one place where a trial's failure gets its kind: from the type of the exception and
the phase it was raised in, or from how a worker process ended (its exit status, who killed
it, the kernel's OOM-kill counters). Never from error text. JAX-free (the XLA status is read
by search/planning/topology.py, which imports JAX only when asked about an XLA error)."""
from __future__ import annotations

import enum
import re
import signal
from dataclasses import dataclass

from ...store.outcome import Kind
from ...trainer.errors import ConfigError, DataError, NonFiniteLoss
from ..errors import UserError
from ..planning import topology


class Phase(enum.Enum):
    SETUP = "setup"  # the driver builds the trial's config from its decisions
    CHECK = "check"  # static validation: mesh, divisibility, names (nothing compiled)
    PLAN = "plan"  # ahead-of-time compilation
    SCREEN = "screen"  # the compiled plan held against the memory budget, and steering
    TRAIN = "train"  # the short training


@dataclass(frozen=True)
class ExitStatus:
    """How a worker process ended without sending its result.

    returncode: the process's (negative: the signal), None when it still runs but stopped
    answering. killed_by: why paxsearch itself killed it ("timeout", "interrupt",
    "shutdown"), if it did. oom_evidence: a sentence naming an OOM-kill counter that rose
    (oom_watch.MemoryWatch.oom_evidence), if one did. fatal_line: the last native fatal log
    line the process wrote (last_fatal_line), if it wrote one: shown, never classified."""

    returncode: int | None
    killed_by: str | None = None
    oom_evidence: str | None = None
    fatal_line: str | None = None


# glog's FATAL line, as XLA, libtpu and TensorFlow write it before they abort the process:
# F<mmdd> <hh:mm:ss.micros> <thread> <file:line>] <message>
_GLOG_FATAL = re.compile(r"F\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ (\S+:\d+\] .*)")


def last_fatal_line(log_text: str) -> str | None:
    """The last native fatal log line in `log_text`, from its `file:line]` on, whitespace
    folded, at most 300 chars; None when there is none."""
    for line in reversed(log_text.splitlines()):
        m = _GLOG_FATAL.match(line.strip())
        if m:
            return " ".join(m.group(1).split())[:300]
    return None


def describe(e: BaseException) -> str:
    """An exception as one line: its type and its text, whitespace folded, at most 500 chars."""
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:500]}" if text else type(e).__name__


def is_oom(e: BaseException) -> bool:
    return isinstance(e, MemoryError) or topology.is_resource_exhausted(e)


def classify(error: BaseException | ExitStatus, phase: Phase | None = None) -> tuple[Kind, str]:
    """(kind, one-line message) of a trial that ended with `error` in `phase` (a worker's exit
    status needs no phase)."""
    if isinstance(error, ExitStatus):
        return _exit(error)
    if isinstance(error, topology.PredictedOOM):  # compiled (or counted) over the memory budget
        return Kind.PREDICTED_OOM, str(error)
    if isinstance(error, NonFiniteLoss):
        return Kind.NAN_LOSS, str(error)
    if isinstance(error, (ConfigError, DataError)):  # the config or its data cannot run here
        return Kind.INVALID, str(error)
    if phase is Phase.SETUP and isinstance(error, (UserError, TypeError, ValueError)):  # a space's bad value
        return Kind.INVALID, str(error)
    if phase is Phase.PLAN:
        return (Kind.PREDICTED_OOM if is_oom(error) else Kind.COMPILE_ERROR), describe(error)
    if phase is Phase.TRAIN and is_oom(error):
        return Kind.RUNTIME_OOM, describe(error)
    return Kind.CRASH, describe(error)  # anything the harness did not foresee: the study goes on


def _exit(status: ExitStatus) -> tuple[Kind, str]:
    if status.killed_by == Kind.TIMEOUT.value:
        return Kind.TIMEOUT, "worker killed by paxsearch: the trial ran past its time limit"
    if status.killed_by:
        return Kind.INTERRUPTED, f"worker killed by paxsearch ({status.killed_by})"
    code = status.returncode
    if code is None:
        return Kind.CRASH, "worker stopped answering"
    if code == -signal.SIGKILL:
        if status.oom_evidence:
            return Kind.RUNTIME_OOM, f"worker killed by the kernel's OOM killer ({status.oom_evidence})"
        return Kind.CRASH, ("worker killed by SIGKILL from outside paxsearch (no OOM kill recorded in its memory "
                            "cgroup nor in /proc/vmstat)")
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return Kind.CRASH, f"worker died of {name}{_said(status)}"
    # glog's quick fatal (XLA refusing a flag of XLA_FLAGS at start-up) exits 1 without a signal
    return Kind.CRASH, f"worker exited with status {code} without a result{_said(status)}"


def _said(status: ExitStatus) -> str:
    return f"; its last fatal log line: {status.fatal_line}" if status.fatal_line else ""

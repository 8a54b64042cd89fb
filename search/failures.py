"""Failure kinds of a trial, decided from exception types and worker exit status only."""
from __future__ import annotations

import signal

INVALID = "invalid"  # static checks failed (mesh, divisibility, unknown names)
PREDICTED_OOM = "predicted_oom"  # the compiled plan exceeds the memory budget (no step run)
COMPILE_ERROR = "compile_error"  # XLA could not compile the step
RUNTIME_OOM = "runtime_oom"  # out of memory while training (or the worker was OOM-killed)
NAN_LOSS = "nan_loss"  # training diverged
TIMEOUT = "timeout"  # the trial ran past its wall-clock limit; its process group was killed
CRASH = "crash"  # the worker died (segfault, abort) or raised something unexpected

KINDS = (INVALID, PREDICTED_OOM, COMPILE_ERROR, RUNTIME_OOM, NAN_LOSS, TIMEOUT, CRASH)


def from_exit_status(returncode: int | None) -> tuple[str, str]:
    """(kind, message) for a worker that ended without reporting a result."""
    if returncode is None:
        return CRASH, "worker stopped answering"
    if returncode == -signal.SIGKILL:
        return RUNTIME_OOM, "worker killed by SIGKILL (the kernel's OOM killer, most likely)"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return CRASH, f"worker died of {name}"
    return CRASH, f"worker exited with status {returncode} without a result"

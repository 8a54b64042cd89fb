"""One trial: its outcome record, how a failure gets its kind, the OOM-killer watch, and its
execution inside a worker (execute.py, which imports JAX: import it from a worker only)."""
from ...store.outcome import FAILURE_KINDS, Counters, Kind, Measured, TrialOutcome
from .classify import ExitStatus, Phase, classify, describe
from .oom_watch import MemoryWatch

__all__ = ["FAILURE_KINDS", "Counters", "ExitStatus", "Kind", "Measured", "MemoryWatch", "Phase", "TrialOutcome",
           "classify", "describe"]

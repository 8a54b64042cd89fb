"""Worker processes that run trials: the pool of worker gangs the driver hands jobs to (pool.py),
the worker's own entry point (entry.py, `python -m paxsearch.search.workers.entry`), the
key-value channel the workers of a slice gang talk over (gang_channel.py), and which GPUs each
worker slot sees (gpu_assign.py)."""
from .gpu_assign import GpuAssignError
from .pool import WorkerGang, WorkerSlot, WorkerStartError

__all__ = ["GpuAssignError", "WorkerGang", "WorkerSlot", "WorkerStartError"]

"""Multi-process start-up and per-process facts (peak memory)."""
from __future__ import annotations

import resource

import jax

from .config import DistributedConfig

_initialized = False


def maybe_initialize(dist: DistributedConfig) -> None:
    """jax.distributed.initialize when more than one process is configured (once per process).

    On CPU the processes exchange collectives through gloo. The device count per process
    comes from XLA_FLAGS (--xla_force_host_platform_device_count), set before JAX starts.
    """
    global _initialized
    if dist.num_processes <= 1 or _initialized:
        return
    if not dist.coordinator_address:
        raise ValueError("distributed.num_processes > 1 needs distributed.coordinator_address (host:port)")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=dist.coordinator_address,
                               num_processes=dist.num_processes, process_id=dist.process_id,
                               heartbeat_timeout_seconds=int(dist.heartbeat_timeout_s),
                               initialization_timeout=int(dist.initialization_timeout_s))
    _initialized = True


def measured_peak_bytes(device) -> int:
    """Peak bytes in use on `device` where the platform reports it, else the process's peak RSS."""
    stats = None
    try:
        stats = device.memory_stats()
    except Exception:  # some platforms raise instead of returning None
        stats = None
    if stats and "peak_bytes_in_use" in stats:
        return int(stats["peak_bytes_in_use"])
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024

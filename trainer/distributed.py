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


class PeakMeter:
    """The device peak of one run (measured_peak_bytes), or 0 where the device cannot tell it.

    A device's high-water marks cover the whole process: in a worker that ran an earlier trial,
    they may be that trial's. So the peak is read only when, at the run's start, no mark stood
    above what was then in use (nothing earlier in the process reached further: its first run);
    otherwise `read` gives 0, "not measured". On CPU it is the process's peak RSS, as before."""

    def __init__(self, device):
        self.device = device
        self.attributable = marks_at_rest(_memory_stats(device))

    def read(self) -> int:
        stats = _memory_stats(self.device)
        if stats and "peak_bytes_in_use" in stats and not self.attributable:
            return 0
        return device_peak_bytes(stats)


def marks_at_rest(stats: dict | None) -> bool:
    """No high-water mark of `stats` stands above what is in use (or the platform keeps none)."""
    if not stats or "peak_bytes_in_use" not in stats:
        return True
    return (int(stats["peak_bytes_in_use"]) <= int(stats.get("bytes_in_use", 0) or 0)
            and int(stats.get("peak_bytes_reserved", 0) or 0) <= int(stats.get("bytes_reserved", 0) or 0))


def _memory_stats(device) -> dict | None:
    try:
        return device.memory_stats()
    except Exception:  # some platforms raise instead of returning None
        return None


def device_peak_bytes(stats: dict | None) -> int:
    """Peak bytes of one device's memory_stats; None or without a peak: the process's peak RSS.

    A TPU's allocator counts buffers (arguments, outputs, live arrays) under `peak_bytes_in_use`
    and a loaded program's temporaries apart, under `peak_bytes_reserved` (measured on a v5e chip
    with libtpu 0.0.42.1: a program with 557 KiB of temporaries raised bytes_reserved by 557 KiB
    and left bytes_in_use at its buffers; benchmarks/RESULTS.md). The step's peak is both: the sum
    of the two high-water marks (an upper bound when the two peaks fell at different times). GPUs
    report no reserved bytes, so the sum is their buffers' peak."""
    if stats and "peak_bytes_in_use" in stats:
        return int(stats["peak_bytes_in_use"]) + int(stats.get("peak_bytes_reserved", 0) or 0)
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024

"""Evidence of the kernel's OOM killer on a trial's worker processes: the oom_kill counters
of their memory cgroups and of /proc/vmstat, and their memory high-water mark. JAX-free."""
from __future__ import annotations

import os


def _read_counter(path: str, key: str) -> int | None:
    try:
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 2 and parts[0] == key:
                    return int(parts[1])
    except (OSError, ValueError):
        pass
    return None


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
        return None if text == "max" else int(text)
    except (OSError, ValueError):
        return None


def memory_cgroup(pid: int) -> tuple[str, str] | None:
    """(oom_kill counter file, limit file) of the memory cgroup of `pid` (v2 or v1), if readable."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            lines = [line.strip().split(":", 2) for line in f if line.count(":") >= 2]
    except OSError:
        return None
    for _hid, controllers, path in lines:
        if "memory" in controllers.split(","):  # cgroup v1 memory controller
            base = os.path.join("/sys/fs/cgroup/memory", path.lstrip("/"))
            return os.path.join(base, "memory.oom_control"), os.path.join(base, "memory.limit_in_bytes")
    for hid, controllers, path in lines:
        if hid == "0" and controllers == "":  # cgroup v2
            base = os.path.join("/sys/fs/cgroup", path.lstrip("/"))
            return os.path.join(base, "memory.events"), os.path.join(base, "memory.max")
    return None


class MemoryWatch:
    """Watches a trial's worker processes for evidence of the kernel's OOM killer: the
    oom_kill counters of their memory cgroups (v2 memory.events, v1 memory.oom_control) and
    of /proc/vmstat, and their memory high-water mark (VmHWM) against the cgroup's limit.
    `sample()` is called while the trial runs (cheap: a few /proc reads)."""

    def __init__(self, pids: list[int]):
        self.pids = list(pids)
        self.counters: dict[str, int] = {}  # counter file -> value when first seen
        self.limits: dict[str, int | None] = {}
        self.hwm = 0
        self.vmstat = _read_counter("/proc/vmstat", "oom_kill")
        self.sample()

    def sample(self) -> None:
        for pid in self.pids:
            found = memory_cgroup(pid)
            if found and found[0] not in self.counters:
                value = _read_counter(found[0], "oom_kill")
                if value is not None:
                    self.counters[found[0]] = value
                    self.limits[found[0]] = _read_int(found[1])
            hwm = _read_counter(f"/proc/{pid}/status", "VmHWM:")
            if hwm is not None:
                self.hwm = max(self.hwm, hwm * 1024)

    def oom_evidence(self) -> str | None:
        """A sentence naming the counter that rose since the trial began, or None."""
        hwm = f"worker peak RSS {self.hwm / 2**20:.0f} MiB"
        for path, before in self.counters.items():
            after = _read_counter(path, "oom_kill")
            if after is not None and after > before:
                limit = self.limits.get(path)
                of = f" of the {limit / 2**20:.0f} MiB limit" if limit and limit < 2**60 else ""
                return f"oom_kill in {path} rose from {before} to {after}; {hwm}{of}"
        # No cgroup counter rose (none found, or the worker was moved to a cgroup it was killed
        # in before a sample saw it): the whole machine's counter, said as such.
        if self.vmstat is not None:
            after = _read_counter("/proc/vmstat", "oom_kill")
            if after is not None and after > self.vmstat:
                return f"oom_kill in /proc/vmstat rose from {self.vmstat} to {after}; {hwm}"
        return None

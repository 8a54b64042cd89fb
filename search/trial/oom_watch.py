"""Evidence of the kernel's OOM killer on a trial's worker processes: the oom_kill counters
of their memory cgroups and of /proc/vmstat, the kernel log's "Killed process PID" lines, and
their memory high-water mark. JAX-free."""
from __future__ import annotations

import errno
import os
import re
import time

KMSG = "/dev/kmsg"
LOG_WAIT_S = 1.0  # how long the log is read again for the victim's line (see oom_evidence)
_KILLED = re.compile(r"Killed process (\d+) \(([^)]*)\)")


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


def _mounted(mount: str, path: str) -> str | None:
    """The folder of cgroup `path` (as /proc/PID/cgroup names it) under `mount`. In a container
    the mount shows the container's own cgroup as its root, while /proc names the host's path
    (memory:/process_api/<id>): the longest tail of the path that exists there."""
    parts = [p for p in path.split("/") if p]
    for i in range(len(parts) + 1):
        folder = os.path.join(mount, *parts[i:])
        if os.path.isdir(folder):
            return folder
    return None


def memory_cgroup(pid: int) -> tuple[str, str, str] | None:
    """(folder, oom_kill counter file name, limit file name) of the memory cgroup of `pid`
    (v1 or v2), if readable."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            lines = [line.strip().split(":", 2) for line in f if line.count(":") >= 2]
    except OSError:
        return None
    for _hid, controllers, path in lines:
        if "memory" in controllers.split(","):  # cgroup v1 memory controller
            folder = _mounted("/sys/fs/cgroup/memory", path)
            return (folder, "memory.oom_control", "memory.limit_in_bytes") if folder else None
    for hid, controllers, path in lines:
        if hid == "0" and controllers == "":  # cgroup v2
            folder = _mounted("/sys/fs/cgroup", path)
            return (folder, "memory.events", "memory.max") if folder else None
    return None


def _kills(folder: str, counter: str) -> int | None:
    """OOM kills in cgroup `folder` and every cgroup under it. v2's memory.events counts its
    subtree already; v1's memory.oom_control counts only its own cgroup, so the subtree is
    summed (a worker moved into a child cgroup and killed there before a sample saw it)."""
    if counter == "memory.events":
        return _read_counter(os.path.join(folder, counter), "oom_kill")
    total = None
    for here, _dirs, files in os.walk(folder):
        if counter in files:
            value = _read_counter(os.path.join(here, counter), "oom_kill")
            if value is not None:
                total = (total or 0) + value
    return total


INIT_PID_NS = 0xEFFFFFFC  # the inode of the kernel's initial pid namespace (PROC_PID_INIT_INO)


def _pids_are_the_kernels() -> bool:
    """Whether this process numbers processes as the kernel log does: in a container with its
    own pid namespace the log's pids are the host's, and cannot be matched to ours."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino == INIT_PID_NS
    except OSError:
        return False


def kernel_kills(after_seq: int = -1) -> tuple[int, list[tuple[int, str]]] | None:
    """(the last sequence number, [(pid, the record's text)] of the OOM killer's "Killed process"
    records past `after_seq`) read from the kernel log (/dev/kmsg), or None where it cannot be
    read or its pids are not ours (no such device, no permission, a pid namespace of our own:
    then the counters alone tell)."""
    if not _pids_are_the_kernels():
        return None
    try:
        fd = os.open(KMSG, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    last, kills = after_seq, []
    try:
        while True:
            try:
                record = os.read(fd, 8192).decode("utf-8", "replace")
            except BlockingIOError:
                break  # read to the end
            except OSError as e:
                if e.errno == errno.EPIPE:  # records were overwritten before this read; go on
                    continue
                return None
            if not record:
                break
            head, _, text = record.partition(";")
            try:
                seq = int(head.split(",")[1])
            except (IndexError, ValueError):
                continue
            last = max(last, seq)
            m = _KILLED.search(text)
            if seq > after_seq and m:
                kills.append((int(m.group(1)), text.strip().splitlines()[0]))
    finally:
        os.close(fd)
    return last, kills


class MemoryWatch:
    """Watches a trial's worker processes for evidence of the kernel's OOM killer: the
    oom_kill counters of their memory cgroups (v2 memory.events, v1 memory.oom_control) and
    of /proc/vmstat, and their memory high-water mark (VmHWM) against the cgroup's limit.
    A counter counts every kill in its cgroup, and a worker's cgroup is often the whole
    container's or CI job's: where the kernel log can be read, a kill counts as this trial's
    only when the log's "Killed process PID" names the worker. `sample()` is called while the
    trial runs (cheap: a few /proc reads)."""

    def __init__(self, pids: list[int]):
        self.pids = list(pids)
        log = kernel_kills()
        self.kmsg_seq = log[0] if log else None  # None: the kernel log cannot be read
        self.counters: dict[str, int] = {}  # cgroup folder -> its subtree's OOM kills when first seen
        self.kinds: dict[str, str] = {}  # cgroup folder -> its counter file's name
        self.limits: dict[str, int | None] = {}
        self.hwm = 0
        self.vmstat = _read_counter("/proc/vmstat", "oom_kill")
        self.sample()

    def sample(self) -> None:
        for pid in self.pids:
            found = memory_cgroup(pid)
            if found and found[0] not in self.counters:
                folder, counter, limit = found
                value = _kills(folder, counter)
                if value is not None:
                    self.counters[folder] = value
                    self.kinds[folder] = counter
                    self.limits[folder] = _read_int(os.path.join(folder, limit))
            hwm = _read_counter(f"/proc/{pid}/status", "VmHWM:")
            if hwm is not None:
                self.hwm = max(self.hwm, hwm * 1024)

    def oom_evidence(self, pid: int | None = None) -> str | None:
        """A sentence naming the counter that rose since the trial began, or None. `pid`: the
        worker that died (any of the trial's when None). Where the kernel log can be read and
        names the OOM killer's victims since the trial began, the kill is this worker's only
        when the log names it: a counter that rose for another process's kill is not evidence."""
        counted = self._counter_evidence()
        if counted is None or self.kmsg_seq is None:
            return counted
        ours = {pid} if pid is not None else set(self.pids)
        # The OOM killer sends SIGKILL, then writes its line: a parent that reaps its child at
        # once may read the log before the line is there, so it is read again for up to a second.
        deadline = time.monotonic() + LOG_WAIT_S
        while True:
            log = kernel_kills(self.kmsg_seq)
            if log is None:
                return counted
            mine = [text for victim, text in log[1] if victim in ours]
            if mine:
                return f"{counted}; the kernel log says: {mine[-1]}"
            if time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        if log[1]:
            return None  # the log names other victims only: their kills raised the counter
        return counted  # no record in the log (overwritten, or not yet written): the counter alone tells

    def _counter_evidence(self) -> str | None:
        hwm = f"worker peak RSS {self.hwm / 2**20:.0f} MiB"
        for folder, before in self.counters.items():
            after = _kills(folder, self.kinds[folder])
            if after is not None and after > before:
                limit = self.limits.get(folder)
                of = f" of the {limit / 2**20:.0f} MiB limit" if limit and limit < 2**60 else ""
                path = os.path.join(folder, self.kinds[folder])
                return f"oom_kill in {path} (and the cgroups under it) rose from {before} to {after}; {hwm}{of}"
        # No cgroup counter could be read: the whole machine's counter, said as such. Never
        # when one could: the machine's counter also counts other containers' kills.
        if not self.counters and self.vmstat is not None:
            after = _read_counter("/proc/vmstat", "oom_kill")
            if after is not None and after > self.vmstat:
                return f"oom_kill in /proc/vmstat rose from {self.vmstat} to {after}; {hwm}"
        return None

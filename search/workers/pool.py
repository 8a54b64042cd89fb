"""Driver side of the trial workers: start, feed, time out, kill and replace them.

A WorkerGang is the set of processes one trial runs on: one process normally, N processes
for a multi-process trial (jax.distributed over 127.0.0.1, gloo collectives); a slice gang
(search/gang/slice_gang.py) is the one process of this host in a trial that spans several hosts. Every process gets
the same job; process 0's reports drive pruning (the others get the same decision) and
process 0's result is the trial's. Each process runs in its own session, so a timeout kills
its whole process group; a gang whose process died or hung is killed and started afresh.
"""
from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Callable

from ...store.outcome import Kind, TrialOutcome
from ...trainer import flagsets
from ..errors import UserError
from ..planning.targets import Target, target_env
from ..trial.classify import ExitStatus, classify, last_fatal_line
from ..trial.oom_watch import MemoryWatch

READY_TIMEOUT_S = 300.0
RECYCLE_AFTER_TRIALS = 32  # a fresh process now and then: whatever a long-lived one leaks is let go


def compilation_cache_dir(run_dir: str, environ=os.environ) -> str:
    """The persistent compilation cache the trial workers share: JAX's own
    JAX_COMPILATION_CACHE_DIR when the user set it (one cache for every run), else
    <run folder>/xla_cache."""
    return environ.get("JAX_COMPILATION_CACHE_DIR") or os.path.join(run_dir, "xla_cache")


class WorkerStartError(RuntimeError):
    """A worker process died or hung before it was ready."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _fatal_line_in(path: str, start: int) -> str | None:
    """The last native fatal line written to `path` from offset `start` on (its last 64 KiB)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(start, _size(path) - 65536))
            return last_fatal_line(f.read().decode(errors="replace"))
    except OSError:
        return None


class _Proc:
    def __init__(self, popen: subprocess.Popen, index: int, log: tuple[str, int] | None = None):
        self.popen, self.index, self.buf = popen, index, b""
        # (path, offset) where this process's lines begin: its worker log (appended to across
        # restarts) and, while it runs a trial, that trial's own log (entry.py writes there)
        self.worker_log, self.trial_log = log, None

    def fatal_line(self) -> str | None:
        """The last native fatal line this process wrote (XLA's, before it aborts), if any."""
        for path, start in filter(None, (self.trial_log, self.worker_log)):
            line = _fatal_line_in(path, start)
            if line:
                return line
        return None

    def send(self, msg: dict) -> bool:
        try:
            self.popen.stdin.write((json.dumps(msg) + "\n").encode())
            self.popen.stdin.flush()
            return True
        except (BrokenPipeError, OSError):
            return False


MAX_FLAG_SETS_PER_SLOT = 2  # gangs kept started per worker slot, one per compiler flag set


def gangs_kept(target: Target) -> int:
    """Gangs a slot keeps started: one where its trials run on attached TPU chips (one program at a
    time can hold a chip: a second gang's processes, started with another flag set while the
    first holds the chip, fail to open it), else MAX_FLAG_SETS_PER_SLOT."""
    return 1 if target.platform == "tpu" and not target.plan_only else MAX_FLAG_SETS_PER_SLOT


def check_chip_workers(target: Target, workers: int) -> None:
    """Trials on attached TPU chips run one at a time: each worker would open every chip of the
    machine, and a chip opens for one program (UserError, one line, before anything is written)."""
    if target.platform == "tpu" and not target.plan_only and workers > 1:
        raise UserError(f"--workers {workers} with target {target.text} on this machine's TPU chips: one program "
                        "at a time can hold a chip, so trials here run one at a time; use --workers 1")


class WorkerSlot:
    """One trial at a time, on a gang started with the trial's compiler flag set (flags are
    read when the backend starts, so each set needs its own processes). The gangs of the
    sets used last stay started; the least recently used beyond gangs_kept(target) is closed
    (before the new gang starts: on attached TPU chips only one gang can hold them)."""

    def __init__(self, target: Target, processes: int, run_dir: str, index: int = 0, imports: tuple[str, ...] = (),
                 cuda_devices: list[str] | None = None):
        self.target, self.processes, self.run_dir, self.index = target, processes, run_dir, index
        self.imports = tuple(imports)  # user modules its workers import (search/study/user_imports.py)
        self.cuda_devices = cuda_devices  # CUDA_VISIBLE_DEVICES of each process (search/workers/gpu_assign.py)
        self.gangs: dict[str, WorkerGang] = {}  # flag set -> gang, most recently used last
        self.shut: str | None = None  # why the slot was shut down (shut_down): no gang of it starts again

    def make_gang(self, flags: str) -> "WorkerGang":
        return WorkerGang(self.target, self.processes, self.run_dir, self.index, flags, self.imports,
                          self.cuda_devices)

    def gang(self, flags: str = "default") -> "WorkerGang":
        """The gang for `flags` (created, not started, when there is none)."""
        g = self.gangs.pop(flags, None) or self.make_gang(flags)
        if self.shut:
            g.shut_down(self.shut)
        self.gangs[flags] = g
        while len(self.gangs) > gangs_kept(self.target):
            self.gangs.pop(next(iter(self.gangs))).close()
        return g

    @property
    def last(self) -> "WorkerGang":
        return next(reversed(self.gangs.values())) if self.gangs else self.gang()

    def kill(self, reason: str | None = None) -> None:
        for g in self.gangs.values():
            g.kill(reason)

    def shut_down(self, reason: str) -> None:
        """From any thread: SIGKILL every gang's process groups; none starts again (see
        WorkerGang.shut_down). Waits for nothing."""
        self.shut = reason
        for g in list(self.gangs.values()):
            g.shut_down(reason)

    def reap(self, deadline: float) -> None:
        """After shut_down: wait until `deadline` (time.monotonic()) at most for the processes to end."""
        for g in list(self.gangs.values()):
            g.reap(deadline)

    def close(self) -> None:
        for g in self.gangs.values():
            g.close()


class WorkerGang:
    def __init__(self, target: Target, processes: int, run_dir: str, index: int = 0, flags: str = "default",
                 imports: tuple[str, ...] = (), cuda_devices: list[str] | None = None):
        self.target, self.processes, self.run_dir, self.index = target, processes, run_dir, index
        self.imports = tuple(imports)
        self.cuda_devices = cuda_devices  # per process: the GPUs it may see (None: whatever is visible)
        self.flags = flags  # the compiler flag set (trainer/flagsets.py) its processes start with
        self.procs: list[_Proc] = []
        self.env: dict | None = None
        self.dist: dict | None = None  # jax.distributed settings shared by the gang (no process_id)
        self.starts = 0
        self.trials_served = 0
        self.killed_by: str | None = None  # why paxsearch itself killed the gang, if it did
        self.watch: MemoryWatch | None = None  # OOM-kill evidence of the current trial
        self.shut: str | None = None  # set by shut_down: the gang never starts again
        self._spawn = threading.Lock()  # shut_down (another thread) never misses a process being started

    # ----- life cycle -----
    def start(self) -> None:
        self.kill()
        self.killed_by = None
        per_proc = self.target.devices_per_process(self.processes)
        dist_base = self.distributed_base(per_proc)
        log_dir = os.path.join(self.run_dir, "logs")
        os.makedirs(log_dir, exist_ok=True)
        with self._spawn:
            if self.shut:
                raise WorkerStartError(f"not started: the driver is shutting down ({self.shut})")
            for i in self.local_process_ids():
                env = self.process_env(i, per_proc, dist_base)
                log_start = _size(self.log_path(i))
                log = open(self.log_path(i), "ab")
                popen = subprocess.Popen([sys.executable, "-m", "paxsearch.search.workers.entry"],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                         start_new_session=True, env=env)
                log.close()
                self.procs.append(_Proc(popen, i, (self.log_path(i), log_start)))
        self.dist = dist_base
        self.env = None
        self.starts += 1
        self.trials_served = 0

    def distributed_base(self, per_proc: int) -> dict | None:
        """jax.distributed settings shared by the gang's processes (no process_id); None for one process."""
        if self.processes <= 1:
            return None
        return {"coordinator_address": f"127.0.0.1:{free_port()}", "num_processes": self.processes,
                "local_device_count": per_proc}

    def local_process_ids(self) -> range:
        """The jax.distributed process ids this machine starts (all of them for a local gang)."""
        return range(self.processes)

    def worker_settings(self, dist: dict | None) -> dict:
        """PAXSEARCH_WORKER of one process (workers/entry.py reads it)."""
        return {"distributed": dist, "imports": list(self.imports),
                "cache_dir": compilation_cache_dir(self.run_dir)}

    def process_env(self, i: int, per_proc: int, dist_base: dict | None) -> dict:
        """The environment process `i` starts with: device count, platform, compiler flag set and,
        on GPU, its own CUDA_VISIBLE_DEVICES, all set before its backend starts."""
        env = dict(os.environ)
        cpu = self.target.platform == "cpu"
        env["XLA_FLAGS"] = flagsets.with_device_count(env.get("XLA_FLAGS"), per_proc if cpu else None)
        if cpu:
            env["JAX_PLATFORMS"] = "cpu"
        elif self.target.platform == "gpu":  # the driver's own JAX_PLATFORMS=cpu must not keep it off the GPUs
            env.pop("JAX_PLATFORMS", None)
        if self.target.plan_only:  # compiled for the TPU topology on this CPU, libtpu kept quiet
            env.update(target_env(self.target))
        if self.cuda_devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.cuda_devices[i]
        env.update(flagsets.env_for(self.flags, self.target.platform, env))  # before the backend starts
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        dist = dict(dist_base, process_id=i) if dist_base else None
        env["PAXSEARCH_WORKER"] = json.dumps(self.worker_settings(dist))
        return env

    def log_path(self, process: int) -> str:
        tag = "" if self.flags == "default" else f"-{self.flags}"
        return os.path.join(self.run_dir, "logs", f"worker-{self.index}{tag}-p{process}.log")

    def ensure_ready(self, timeout: float = READY_TIMEOUT_S) -> dict:
        """Start the gang if needed and wait for every process's "ready"; returns process 0's env."""
        if (not self.procs or any(p.popen.poll() is not None for p in self.procs)
                or self.trials_served >= RECYCLE_AFTER_TRIALS):
            self.start()
        if self.env is not None:
            return self.env
        envs: dict[int, dict] = {}
        deadline = time.monotonic() + timeout
        while len(envs) < len(self.procs):
            for proc, msg in self._messages(deadline):
                if msg is None:
                    code = proc.popen.wait()
                    fatal = proc.fatal_line()
                    self.kill()
                    said = f" ({fatal})" if fatal else ""
                    raise WorkerStartError(
                        f"worker process exited with status {code} before it was ready{said}; see "
                        f"{self.log_path(proc.index)}")
                if msg.get("type") == "ready":
                    envs[proc.index] = msg["env"]
            if time.monotonic() > deadline and len(envs) < len(self.procs):
                self.kill()
                raise WorkerStartError(f"worker processes were not ready within {timeout:.0f} s")
        self.env = envs[0]
        return self.env

    def signal_kill(self, reason: str | None = None) -> None:
        """SIGKILL every process group of the gang, from any thread: nothing waits and no pipe is
        closed here (closing a pipe that the thread running the trial reads would let the fd be
        reused under it); that thread sees the end of the pipe and cleans up. `reason`
        ("interrupt", "shutdown", "taken over") is kept so that a trial it cuts short is typed as
        killed by paxsearch, not as a crash or an OOM."""
        with self._spawn:
            if reason:
                self.killed_by = reason
            for p in list(self.procs):
                try:
                    os.killpg(p.popen.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass

    def shut_down(self, reason: str) -> None:
        """From any thread (the driver's Ctrl-C): SIGKILL the process groups and never start the
        gang again, so that a thread that is about to start it cannot bring a worker back."""
        with self._spawn:
            self.shut = reason
        self.signal_kill(reason)

    def reap(self, deadline: float) -> None:
        """Wait until `deadline` (time.monotonic()) at most for the processes to end; closes nothing."""
        for p in list(self.procs):
            try:
                p.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                return

    def kill(self, reason: str | None = None) -> None:
        """SIGKILL every process group of the gang, wait for them and close their pipes (only
        from the thread that runs the gang's trials, or once that thread is done)."""
        self.signal_kill(reason)
        for p in self.procs:
            try:
                p.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            for f in (p.popen.stdin, p.popen.stdout):
                try:
                    f.close()
                except OSError:
                    pass
        self.procs = []
        self.env = None

    def close(self) -> None:
        for p in self.procs:
            p.send({"type": "exit"})
        deadline = time.monotonic() + 5
        for p in self.procs:
            try:
                p.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        self.kill()

    # ----- one trial -----
    def run(self, job: dict, timeout: float, on_report: Callable[[dict], bool] | None = None) -> TrialOutcome:
        """Run `job` on every process; the outcome of process 0, or a typed failure. Its timings
        carry `worker_start_s`: the seconds spent starting the gang's processes for this trial
        (imports and opening the devices: 6-11 s for a TPU chip), 0 when a started gang ran it."""
        t_start = time.monotonic()
        self.ensure_ready()
        start_s = round(time.monotonic() - t_start, 3)
        outcome = self._run_started(job, timeout, on_report)
        return outcome.replace(timings={**outcome.timings, "worker_start_s": start_s})

    def _run_started(self, job: dict, timeout: float, on_report: Callable[[dict], bool] | None) -> TrialOutcome:
        self.trials_served += 1
        self.watch = MemoryWatch([p.popen.pid for p in self.procs])
        for p in self.procs:
            pjob = dict(job)
            if self.dist:
                pjob["distributed"] = dict(self.dist, process_id=p.index)
            if p.index > 0 and job.get("log_path"):
                pjob["log_path"] = job["log_path"].replace("log.txt", f"log.{p.index}.txt")
            p.trial_log = (pjob["log_path"], _size(pjob["log_path"])) if pjob.get("log_path") else None
            if not p.send({"type": "trial", "job": pjob}):
                return self._died(p)
        deadline = time.monotonic() + timeout
        results: dict[int, dict] = {}
        stops: dict[int, bool] = {}
        waiting: dict[int, list[int]] = {p.index: [] for p in self.procs}
        while len(results) < len(self.procs):
            self.watch.sample()  # the worker's memory cgroup and high-water mark
            if self.killed_by:  # killed from another thread: no waiting for the end of a pipe that a
                # child which left the process group may hold open (it would last until the deadline)
                gone = next((p for p in self.procs if p.popen.poll() is not None), None)
                if gone is not None:
                    return self._died(gone)
            if time.monotonic() >= deadline:
                self.kill()
                return TrialOutcome.failure(Kind.TIMEOUT, f"trial ran past its {timeout:.0f} s limit; worker "
                                                          "process group killed")
            for proc, msg in self._messages(deadline):
                if msg is None:
                    return self._died(proc)
                kind = msg.get("type")
                if kind == "report":
                    step = int(msg.get("step", 0))
                    if proc.index == 0:
                        stops[step] = bool(on_report(msg)) if on_report else False
                    waiting[proc.index].append(step)
                    if job.get("relay_reports"):
                        self._reply(stops, waiting)
                elif kind == "result":
                    results[proc.index] = msg
                elif kind == "gang_failure":  # another host of a slice gang failed first (gang_channel.py)
                    self.kill()
                    return TrialOutcome.from_wire(msg)
        return TrialOutcome.from_wire(results[0])

    def _reply(self, stops: dict[int, bool], waiting: dict[int, list[int]]) -> None:
        for p in self.procs:
            while waiting[p.index] and waiting[p.index][0] in stops:
                p.send({"type": "prune_reply", "stop": stops[waiting[p.index].pop(0)]})

    def _died(self, proc: _Proc) -> TrialOutcome:
        try:
            code = proc.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            code = None
        killed_by = self.killed_by
        self.kill()
        evidence = self.watch.oom_evidence(proc.popen.pid) if self.watch and code == -signal.SIGKILL else None
        fatal = proc.fatal_line() if code and not killed_by else None
        kind, message = classify(ExitStatus(code, killed_by, evidence, fatal))
        if self.processes > 1:
            message = f"process {proc.index}: {message}"
        return TrialOutcome.failure(kind, message)

    def _messages(self, deadline: float):
        """Yield (proc, message) pairs that arrive before `deadline`; message None on EOF."""
        sel = selectors.DefaultSelector()
        for p in self.procs:
            sel.register(p.popen.stdout, selectors.EVENT_READ, p)
        try:
            timeout = max(0.0, min(1.0, deadline - time.monotonic()))
            for key, _ in sel.select(timeout):
                p: _Proc = key.data
                data = os.read(p.popen.stdout.fileno(), 1 << 16)
                if not data:
                    yield p, None
                    return
                p.buf += data
                while b"\n" in p.buf:
                    line, p.buf = p.buf.split(b"\n", 1)
                    if line.strip():
                        try:
                            yield p, json.loads(line)
                        except ValueError:
                            continue
        finally:
            sel.close()

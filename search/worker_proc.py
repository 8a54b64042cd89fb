"""`python -m paxsearch.search.worker_proc`: a trial worker process serving several trials.

Started by the driver (search/pool.py) in its own session, with XLA_FLAGS / JAX_PLATFORMS
already in its environment and PAXSEARCH_WORKER holding its JSON settings
({"distributed": {...} or null, "cache_dir": ..., "imports": [user modules]}). Protocol: JSON lines; jobs arrive on
stdin, messages leave on the original stdout (anything libraries print goes to stderr, and
during a trial to the trial's log.txt):

    -> {"type": "ready", "env": {...}}                     once imports are done
    <- {"type": "trial", "job": {...}}                      run one trial
    -> {"type": "report", "step": .., "loss": .., ...}      at each logging interval
    <- {"type": "prune_reply", "stop": bool}                when the job asked for replies
    -> {"type": "result", ...}                              the trial's outcome
    <- {"type": "exit"}
The worker exits by itself when its driver dies.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time


class Channel:
    def __init__(self, out_fd: int):
        self._out = os.fdopen(out_fd, "w", buffering=1)

    def send(self, msg: dict) -> None:
        self._out.write(json.dumps(msg) + "\n")
        self._out.flush()

    @staticmethod
    def recv() -> dict | None:
        line = sys.stdin.readline()
        return json.loads(line) if line else None


def _watch_parent(interval: float = 0.5) -> None:
    parent = os.getppid()

    def loop():
        while True:
            time.sleep(interval)
            if os.getppid() != parent:
                os._exit(3)

    threading.Thread(target=loop, daemon=True, name="parent-watch").start()


@contextlib.contextmanager
def _output_to(path: str | None):
    """Route fds 1 and 2 (Python's and C++'s output) to `path` for the duration."""
    if not path:
        yield
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (fd, *saved):
            os.close(f)


def main() -> int:
    channel = Channel(os.dup(1))
    os.dup2(2, 1)  # library prints must not corrupt the protocol
    _watch_parent()
    settings = json.loads(os.environ.get("PAXSEARCH_WORKER", "{}"))
    from . import trial_exec  # imports JAX and the trainer: the slow part, once per worker

    trial_exec.initialize(settings.get("distributed"), settings.get("cache_dir"))
    from .user_imports import import_modules

    import_modules(settings.get("imports") or ())  # before any trial's config is built (the driver checked them)
    channel.send({"type": "ready", "env": trial_exec.environment(), "pid": os.getpid()})
    while True:
        msg = channel.recv()
        if msg is None or msg.get("type") == "exit":
            return 0
        if msg.get("type") != "trial":
            continue
        job = msg["job"]

        def report(metrics: dict) -> bool:
            channel.send({"type": "report", **metrics})
            if not job.get("relay_reports"):
                return False
            reply = channel.recv()
            return bool(reply and reply.get("stop"))

        with _output_to(job.get("log_path")):
            print(f"== trial {job.get('number')} on worker pid {os.getpid()} "
                  f"({time.strftime('%Y-%m-%d %H:%M:%S')})", flush=True)
            result = trial_exec.run_trial(job, report)
            print(f"== trial {job.get('number')}: {result.get('failure_kind') or 'ok'} "
                  f"{result.get('failure_message') or ''}", flush=True)
        channel.send(result)


if __name__ == "__main__":
    sys.exit(main())

"""`python -m paxsearch.search.workers.entry`: a trial worker process serving several trials.

Started by the driver (search/workers/pool.py) in its own session, with XLA_FLAGS / JAX_PLATFORMS
already in its environment and PAXSEARCH_WORKER holding its JSON settings
({"distributed": {...} or null, "cache_dir": ..., "imports": [user modules]}). Protocol: JSON lines; jobs arrive on
stdin, messages leave on the original stdout (anything libraries print goes to stderr, and
during a trial to the trial's log.txt):

    -> {"type": "ready", "env": {...}}                     once imports are done
    <- {"type": "trial", "job": {...}}                      run one trial
    -> {"type": "report", "step": .., "loss": .., ...}      at each logging interval
    <- {"type": "prune_reply", "stop": bool}                when the job asked for replies
    -> {"type": "result", ...}                              the trial's TrialOutcome, wire form
    <- {"type": "exit"}
The worker exits by itself when its driver dies.

In a slice gang (settings "gang": one worker per host, jax.distributed across the hosts;
search/gang/slice_gang.py), host 0's worker is as above and also hands every trial to the other
hosts through the coordinator (search/workers/gang_channel.py), watches them while it runs, and
answers with the combined result (or, when another host fails first, with
{"type": "gang_failure", "failure_kind": .., "failure_message": ..}). It takes
{"type": "restart", "flags": SET} too: the whole gang leaves, to start again with another
compiler flag set. The other hosts' workers take their trials from host 0, never from stdin,
and tell their own `paxsearch worker` only what happens:
    -> {"type": "trial_start", "number": n} / {"type": "trial_end", "number": n, "failure_kind": ..}
    -> {"type": "done"} | {"type": "restart", "flags": SET} | {"type": "gang_lost", "message": ..}
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time

from ...store.outcome import TrialOutcome


class Channel:
    def __init__(self, out_fd: int):
        self._out = os.fdopen(out_fd, "w", buffering=1)
        self._lock = threading.Lock()  # a gang's watch thread sends too

    def send(self, msg: dict) -> None:
        with self._lock:
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


def _join(dist: dict | None) -> None:
    """Join the trial's processes (jax.distributed) with JAX alone imported, before the trainer
    (TensorFlow through seqio, ~8 CPU-s): a gang that does not form fails in seconds, and the
    join window is not spent importing. execute.initialize does not join again."""
    if dist:
        from ...trainer import distributed
        from ...trainer.config import DistributedConfig

        distributed.maybe_initialize(DistributedConfig(**dist))


def main() -> int:
    channel = Channel(os.dup(1))
    os.dup2(2, 1)  # library prints must not corrupt the protocol
    _watch_parent()
    settings = json.loads(os.environ.get("PAXSEARCH_WORKER", "{}"))
    _join(settings.get("distributed"))
    from ..trial import execute as trial_exec  # imports JAX and the trainer: the slow part, once per worker

    trial_exec.initialize(settings.get("distributed"), settings.get("cache_dir"))
    from ..study.user_imports import import_modules

    import_modules(settings.get("imports") or ())  # before any trial's config is built (the driver checked them)
    gang = None
    if settings.get("gang"):
        from .gang_channel import GangChannel

        dist = settings["distributed"]
        gang = GangChannel(int(dist["process_id"]), int(dist["num_processes"]))
        gang.start_beating()
    channel.send({"type": "ready", "env": trial_exec.environment(), "pid": os.getpid()})
    if gang is not None and gang.host > 0:
        return _follow(channel, gang, settings)
    while True:
        msg = channel.recv()
        if msg is None or msg.get("type") == "exit":
            if gang is not None:  # the other hosts' workers end too
                gang.publish({"type": "exit"})
                gang.shutdown()
            return 0
        if msg.get("type") == "restart" and gang is not None:
            gang.publish({"type": "restart", "flags": msg.get("flags", "default")})
            gang.shutdown()
            return 0
        if msg.get("type") != "trial":
            continue
        job = msg["job"]
        seq = gang.publish({"type": "trial", "job": job}) if gang is not None else None
        watching = (gang.watch(seq, lambda failure: channel.send({**failure.to_wire(), "type": "gang_failure"}))
                    if gang is not None else None)

        def report(metrics: dict, job=job, seq=seq) -> bool:  # this trial's job and sequence number
            channel.send({"type": "report", **metrics})
            if not job.get("relay_reports"):
                return False
            reply = channel.recv()
            stop = bool(reply and reply.get("stop"))
            if gang is not None:  # every host stops at the same step
                gang.publish_prune(seq, int(metrics.get("step", 0)), stop)
            return stop

        outcome = _trial(trial_exec, job, report)
        if gang is not None:
            watching.set()
            outcome = gang.gather(seq, outcome)
        channel.send(outcome.to_wire())


def _trial(trial_exec, job: dict, report) -> TrialOutcome:
    with _output_to(job.get("log_path")):
        print(f"== trial {job.get('number')} on worker pid {os.getpid()} "
              f"({time.strftime('%Y-%m-%d %H:%M:%S')})", flush=True)
        outcome = trial_exec.run_trial(job, report)
        print(f"== trial {job.get('number')}: {outcome.kind.value} {outcome.message}", flush=True)
    return outcome


def _follow(channel: Channel, gang, settings: dict) -> int:
    """Hosts 1..N-1 of a slice gang: run what host 0 hands out until it says exit or restart."""
    from ..trial import execute as trial_exec
    from .gang_channel import GangLost

    run_dir = settings["gang"]["run_dir"]
    try:
        while True:
            msg = gang.next_message()
            seq = gang.seq - 1
            if msg.get("type") in ("exit", "restart"):
                channel.send({"type": "done"} if msg["type"] == "exit" else msg)
                gang.shutdown()
                return 0
            job = dict(msg["job"])
            trial_dir = os.path.join(run_dir, "trials", str(job.get("number")))
            job.update(trial_dir=trial_dir, log_path=os.path.join(trial_dir, f"log.{gang.host}.txt"),
                       distributed=dict(job.get("distributed") or {}, process_id=gang.host))
            channel.send({"type": "trial_start", "number": job.get("number")})

            def report(metrics: dict, _seq=seq, _job=job) -> bool:
                return gang.prune_decision(_seq, int(metrics.get("step", 0))) if _job.get("relay_reports") else False

            outcome = _trial(trial_exec, job, report)
            gang.post_result(seq, outcome)
            channel.send({"type": "trial_end", "number": job.get("number"), "failure_kind": outcome.kind.stored_text,
                          "failure_message": outcome.message})
    except GangLost as e:
        channel.send({"type": "gang_lost", "message": str(e)})
        return 4


if __name__ == "__main__":
    sys.exit(main())

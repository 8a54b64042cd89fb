"""Slice gangs: one trial run by every host of a TPU slice (or of a GPU cluster), as one
jax.distributed program, started the way Paxml and MaxText jobs start: the same
`paxsearch worker --storage URL --study NAME` on every host (`gcloud ... ssh --worker=all`,
a JobSet, `srun`). Membership: search/gang/membership.py.

- Host 0 runs the study loop (search/driver/loop.py) with one SliceSlot: it asks the tuner,
  hands each trial to its worker, which passes it on to every other host through the
  jax.distributed coordinator (search/workers/gang_channel.py), and records the combined result.
  Only host 0 writes to storage.
- Hosts 1..N-1 run follow(): no tuner, no storage writes; they keep one worker process in
  the gang and run what host 0 hands out, reading their own data shards.
- A failure on any host is one typed failure of the trial. A host lost mid-trial fails the
  trial as `host_lost`; host 0 then starts its worker again and the gang re-forms when every
  host has joined again (the others' workers leave with the old coordinator and their
  `paxsearch worker` starts them again), or every host stops with one line once
  `join_timeout` passes without the full gang.
"""
from __future__ import annotations

import os
import time

from ...store.outcome import TrialOutcome
from ..planning.targets import Target
from ..trial.classify import ExitStatus, classify
from ..workers.gang_channel import GANG_HEARTBEAT_TIMEOUT_S
from ..workers.pool import READY_TIMEOUT_S, WorkerGang, WorkerSlot, WorkerStartError
from .membership import Membership

JOIN_TIMEOUT_S = 300  # how long hosts wait for the whole gang (jax.distributed's own default)
JOIN_TRY_S = 30  # hosts 1..N-1 try to join this long at a time, looking at the study in between
SHUTDOWN_WAIT_S = 60.0  # host 0's worker leaves only when every host has (jax.distributed.shutdown)


class SliceGang(WorkerGang):
    """This host's one process in a gang of `membership.num_hosts` processes, one per host."""

    def __init__(self, target: Target, membership: Membership, run_dir: str, flags: str = "default",
                 imports: tuple[str, ...] = (), join_timeout: float = JOIN_TIMEOUT_S):
        super().__init__(target, membership.num_hosts, run_dir, 0, flags, imports)
        self.membership = membership
        self.join_timeout = float(join_timeout)

    def distributed_base(self, per_proc: int) -> dict:
        m = self.membership
        return {"coordinator_address": m.coordinator, "num_processes": m.num_hosts, "local_device_count": per_proc,
                "heartbeat_timeout_s": GANG_HEARTBEAT_TIMEOUT_S,
                "initialization_timeout_s": max(1, int(self.join_timeout))}

    def local_process_ids(self) -> range:
        return range(self.membership.host_index, self.membership.host_index + 1)

    def worker_settings(self, dist: dict | None) -> dict:
        return {**super().worker_settings(dist), "gang": {"run_dir": os.path.abspath(self.run_dir)}}

    def log_path(self, process: int) -> str:
        tag = "" if self.flags == "default" else f"-{self.flags}"
        return os.path.join(self.run_dir, "logs", f"worker-gang{tag}-h{process}.log")

    def ensure_ready(self, timeout: float | None = None) -> dict:
        """Ready once every host has joined (jax.distributed.initialize waits for them)."""
        try:
            return super().ensure_ready(timeout or self.join_timeout + READY_TIMEOUT_S)
        except WorkerStartError as e:
            m = self.membership
            raise WorkerStartError(f"the slice gang at {m.coordinator} did not form ({e}); each of the {m.num_hosts} "
                                   f"hosts must run `paxsearch worker` on this study with --num-hosts {m.num_hosts} "
                                   f"within {self.join_timeout:.0f} s of each other") from None

    def run(self, job: dict, timeout: float, on_report=None) -> TrialOutcome:
        """As WorkerGang.run; after a failure that may have left another host inside a collective
        (a crash, an OOM mid-step: a kind not reached alike on every host), the gang is started
        afresh before the next trial. After the others the gang stays formed."""
        outcome = super().run(job, timeout, on_report)
        if not outcome.kind.same_on_every_host:
            self.kill()
        return outcome

    def restart(self, flags: str) -> None:
        """Host 0: the whole gang leaves, to start again with compiler flag set `flags`."""
        for p in self.procs:
            p.send({"type": "restart", "flags": flags})
        self._wait_exit()

    def close(self) -> None:
        for p in self.procs:
            p.send({"type": "exit"})
        self._wait_exit()

    def _wait_exit(self) -> None:
        deadline = time.monotonic() + SHUTDOWN_WAIT_S
        for p in self.procs:
            try:
                p.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except Exception:
                pass
        self.kill()


class SliceSlot(WorkerSlot):
    """Host 0's one worker slot: one gang at a time (every host holds one process of it), so a
    trial with another compiler flag set makes the whole gang start again with that set."""

    def __init__(self, target: Target, membership: Membership, run_dir: str, imports: tuple[str, ...] = (),
                 join_timeout: float = JOIN_TIMEOUT_S):
        super().__init__(target, membership.num_hosts, run_dir, 0, imports)
        self.membership, self.join_timeout = membership, join_timeout

    def make_gang(self, flags: str) -> SliceGang:
        return SliceGang(self.target, self.membership, self.run_dir, flags, self.imports, self.join_timeout)

    def gang(self, flags: str = "default") -> SliceGang:
        for other in [f for f in self.gangs if f != flags]:
            g = self.gangs.pop(other)
            if g.procs:
                g.restart(flags)
        return super().gang(flags)


def follow(ctx, membership: Membership, join_timeout: float = JOIN_TIMEOUT_S, say=print) -> int:
    """Hosts 1..N-1: keep this host's worker in the gang until host 0 ends the study."""
    from ..driver.budget import study_finished
    from ..driver.loop import DriverError
    from ..driver.prepare import first_flag_set

    if study_finished(ctx):  # nothing for host 0 to hand out: no worker to start, no gang to wait for
        say(f"host {membership.host_index}: the study has no trial left to run; leaving", flush=True)
        return 0
    flags = first_flag_set(ctx)
    trying_since = time.monotonic()
    while True:  # one try to join lasts at most JOIN_TRY_S, so that a finished study is noticed
        gang = SliceGang(ctx.target, membership, ctx.run_dir, flags, ctx.settings.imports,
                         min(join_timeout, JOIN_TRY_S))
        gang.start()
        try:
            outcome, detail = _serve(gang, say)
        finally:
            gang.kill()
        if outcome == "done":
            say(f"host {membership.host_index}: host 0 ended the study; leaving the gang", flush=True)
            return 0
        if outcome == "restart":
            flags, trying_since = detail, time.monotonic()
            say(f"host {membership.host_index}: the gang starts again with compiler flag set {flags}", flush=True)
            continue
        if outcome == "ready_then_lost":
            trying_since = time.monotonic()
            say(f"host {membership.host_index}: the gang broke ({detail}); joining again", flush=True)
            continue
        if study_finished(ctx):  # host 0 found nothing to do and left without forming the gang
            say(f"host {membership.host_index}: the study has no trial left to run; leaving", flush=True)
            return 0
        if time.monotonic() - trying_since > join_timeout:  # never joined in time
            raise DriverError(f"host {membership.host_index} could not join the slice gang at {membership.coordinator} "
                              f"within {join_timeout:.0f} s ({detail}); is host 0 running `paxsearch worker` "
                              f"on this study with --num-hosts {membership.num_hosts}?")
        time.sleep(2.0)  # the coordinator is starting again, or not there yet


def _serve(gang: SliceGang, say) -> tuple[str, str]:
    """Relay this host's worker until it exits: ("done" | "restart" | "ready_then_lost" |
    "not_joined", detail)."""
    host = gang.membership.host_index
    proc = gang.procs[0]
    ready, outcome = False, None
    deadline = float("inf")
    while True:
        for _, msg in gang._messages(deadline):
            if msg is None:
                code = proc.popen.wait()
                if outcome:
                    return outcome
                _, message = classify(ExitStatus(code))
                return ("ready_then_lost" if ready else "not_joined"), f"{message}; see {gang.log_path(host)}"
            kind = msg.get("type")
            if kind == "ready":
                ready = True
                say(f"host {host}: joined the slice gang at {gang.membership.coordinator} "
                    f"({gang.membership.num_hosts} hosts)", flush=True)
            elif kind == "trial_start":
                say(f"host {host}: trial {msg.get('number')} running", flush=True)
            elif kind == "trial_end":
                say(f"host {host}: trial {msg.get('number')} {msg.get('failure_kind') or 'done'} "
                    f"{msg.get('failure_message') or ''}".rstrip(), flush=True)
            elif kind == "done":
                outcome = ("done", "")
            elif kind == "restart":
                outcome = ("restart", str(msg.get("flags") or "default"))
            elif kind == "gang_lost":
                outcome = ("ready_then_lost", str(msg.get("message")))

"""The control channel of a slice gang, inside the worker processes (one per host).

A slice gang is one trial run by every host of a slice: host 0's `paxsearch worker` asks the
tuner and records the trial; the others only run it. The hosts share nothing but the
storage URL and the jax.distributed coordinator; this channel rides on the coordinator's
key-value store (the same service jax.distributed already runs in host 0's worker), so it
needs no port or file of its own. Keys, per gang incarnation (a new coordinator starts
with an empty store):

    paxsearch/job/<seq>             host 0 -> all: {"type": "trial", "job": ...} | {"type": "exit"}
                                    | {"type": "restart", "flags": SET}
    paxsearch/prune/<seq>/<step>    host 0 -> all: "1" stop / "0" go on (pruned studies)
    paxsearch/result/<seq>/<host>   host i -> host 0: the host's result, JSON
    paxsearch/beat/<host>           host i: a counter it increments every BEAT_S seconds

Host 0 watches the others while a trial runs: a host whose counter has not moved for
LOST_AFTER_S seconds, or that reports a failure first, fails the trial (typed) before
the collectives it left hanging do. LOST_AFTER_S is below the coordinator's own heartbeat
timeout (GANG_HEARTBEAT_TIMEOUT_S), so the typed failure is seen before jax.distributed
aborts the processes.
"""
from __future__ import annotations

import json
import threading
import time
from typing import Callable

from ...store.outcome import Kind, TrialOutcome

BEAT_S = 1.0
LOST_AFTER_S = 10.0
GANG_HEARTBEAT_TIMEOUT_S = 30  # jax.distributed heartbeat timeout of gang processes
WAIT_MS = 30_000  # one blocking get of the key-value store


class GangLost(RuntimeError):
    """The coordinator went away (host 0 ended or died): this process leaves the gang."""


def _client():
    from jax._src import distributed  # the coordinator client jax.distributed.initialize made

    client = distributed.global_state.client
    if client is None:
        raise RuntimeError("slice gang channel needs jax.distributed.initialize first")
    return client


def _blocking_get(client, key: str) -> str:
    """The value of `key` once host 0 sets it. A get that times out is asked again; gets that
    fail well before their timeout, three times running, mean the coordinator is gone."""
    fast_failures = 0
    while True:
        t0 = time.monotonic()
        try:
            return client.blocking_key_value_get(key, WAIT_MS)
        except Exception as e:  # timed out, or no coordinator: told apart by how long it took
            if time.monotonic() - t0 >= WAIT_MS / 2000:
                fast_failures = 0
                continue
            fast_failures += 1
            if fast_failures >= 3:
                raise GangLost(f"the gang's coordinator went away ({type(e).__name__})") from None
            time.sleep(1.0)


class GangChannel:
    def __init__(self, host: int, hosts: int):
        self.host, self.hosts = host, hosts
        self.client = _client()
        self.seq = 0
        self._stop = threading.Event()
        self._beats: dict[int, tuple[int | None, float]] = {}

    # ----- every host -----
    def start_beating(self) -> None:
        def loop():
            key = f"paxsearch/beat/{self.host}"
            while not self._stop.wait(BEAT_S):
                try:
                    self.client.key_value_increment(key, 1)
                except Exception:  # the coordinator is gone: the main thread finds out
                    return

        threading.Thread(target=loop, daemon=True, name="gang-beat").start()

    def shutdown(self) -> None:
        """Leave the gang in order (jax.distributed.shutdown waits for every host)."""
        self._stop.set()
        import jax

        try:
            jax.distributed.shutdown()
        except Exception:
            pass

    # ----- host 0 -----
    def publish(self, message: dict) -> int:
        """Send the next message to every host; returns its sequence number."""
        seq = self.seq
        self.client.key_value_set(f"paxsearch/job/{seq}", json.dumps(message))
        self.seq += 1
        return seq

    def publish_prune(self, seq: int, step: int, stop: bool) -> None:
        self.client.key_value_set(f"paxsearch/prune/{seq}/{step}", "1" if stop else "0")

    def _result_of(self, seq: int, host: int) -> TrialOutcome | None:
        try:
            text = self.client.key_value_try_get(f"paxsearch/result/{seq}/{host}")
        except Exception:  # NOT_FOUND: not there yet
            return None
        return TrialOutcome.from_wire(json.loads(text))

    def lost_hosts(self) -> list[tuple[int, float]]:
        """(host, seconds silent) of every other host whose beat has not moved for LOST_AFTER_S."""
        now = time.monotonic()
        lost = []
        for h in range(1, self.hosts):
            try:
                value = int(self.client.key_value_try_get(f"paxsearch/beat/{h}"))
            except Exception:
                value = None
            last, since = self._beats.get(h, (None, now))
            if value != last or h not in self._beats:
                self._beats[h] = (value, now)
            elif now - since > LOST_AFTER_S:
                lost.append((h, now - since))
        return lost

    def watch(self, seq: int, on_failure: Callable[[TrialOutcome], None]) -> threading.Event:
        """While trial `seq` runs on host 0: call on_failure(result) once when another host is
        lost or reports a failure. Set the returned event to stop watching."""
        stop = threading.Event()

        def loop():
            while not stop.wait(1.0):
                failure = self.gang_failure(seq)
                if failure:
                    on_failure(failure)
                    return

        threading.Thread(target=loop, daemon=True, name="gang-watch").start()
        return stop

    def gang_failure(self, seq: int) -> TrialOutcome | None:
        """The failure that ends trial `seq` because of another host, if there is one now."""
        for h, silent in self.lost_hosts():
            return TrialOutcome.failure(Kind.HOST_LOST, f"host {h} of {self.hosts} stopped answering for "
                                                        f"{silent:.0f} s (its worker died or the host was lost)")
        for h in range(1, self.hosts):
            r = self._result_of(seq, h)
            if r and r.kind.failed:
                return TrialOutcome.failure(r.kind, f"host {h}: {r.message}".strip())
        return None

    def gather(self, seq: int, outcome: TrialOutcome) -> TrialOutcome:
        """Host 0's result of trial `seq` combined with every other host's: the first failure
        wins, named by its host. Waits for all of them (a lost host fails the trial)."""
        if outcome.kind.failed:
            return outcome
        pending = set(range(1, self.hosts))
        while pending:
            for h in sorted(pending):
                r = self._result_of(seq, h)
                if r is not None:
                    pending.discard(h)
                    if r.kind.failed:
                        return outcome.failed_as(r.kind, f"host {h}: {r.message}".strip())
            if pending:
                failure = self.gang_failure(seq)
                if failure:
                    return outcome.failed_as(failure.kind, failure.message)
                time.sleep(0.2)
        return outcome

    # ----- hosts 1..N-1 -----
    def next_message(self) -> dict:
        """Block until host 0 publishes the next message (GangLost when it is gone)."""
        text = _blocking_get(self.client, f"paxsearch/job/{self.seq}")
        self.seq += 1
        return json.loads(text)

    def prune_decision(self, seq: int, step: int) -> bool:
        return _blocking_get(self.client, f"paxsearch/prune/{seq}/{step}") == "1"

    def post_result(self, seq: int, outcome: TrialOutcome) -> None:
        """Host 0 needs only how this host's trial ended: its kind and message, wire form."""
        brief = TrialOutcome.failure(outcome.kind, outcome.message)
        self.client.key_value_set(f"paxsearch/result/{seq}/{self.host}", json.dumps(brief.to_wire()))

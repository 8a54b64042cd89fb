"""Who owns a RUNNING trial, and taking over one whose driver is gone.

The owner: a driver claims each trial it asks for (owner_info: host, pid, process start) and
beats a heartbeat on it while it runs (heartbeat); a beat refused because the trial is finished
means another driver took it over, and the owner's worker is killed.

The taker (recover_stale, at every driver's start): a RUNNING trial whose owner process is gone,
or whose heartbeat (a driver of another host) is older than STALE_AFTER_S, is abandoned: its
config queued again, then the trial marked FAIL (failure_kind "crash", "driver died"), under
the study lock, under which its owner records it too (exactly one of the two happens). A trial
its driver left unmarked on Ctrl-C or SIGTERM (mark_left, search/driver/shutdown.py) is typed
`interrupted` instead.

tests/fault_driver.py sets HOST, STALE_AFTER_S and HEARTBEAT_S here; they are read at each use.
"""
from __future__ import annotations

import contextlib
import os
import socket
import threading
import time

import optuna
import psutil
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import TrialState

from ...store.outcome import Kind
from ..study.run_folder import write_whole
from ..tuning.tuners import trial_decisions
from ..workers.pool import WorkerGang
from .context import StudyContext

STALE_AFTER_S = 120.0  # a RUNNING trial of another host whose heartbeat is older is abandoned
HEARTBEAT_S = 15.0
HOST = socket.gethostname()  # the owner's host; a trial of another host is judged by its heartbeat


# ----- the owner -----
def owner_info() -> dict:
    return {"host": HOST, "pid": os.getpid(), "started": psutil.Process().create_time()}


@contextlib.contextmanager
def heartbeat(trial: optuna.Trial, gang: WorkerGang):
    """Beats every HEARTBEAT_S while the trial runs. A beat refused because the trial is
    finished means another driver took it over (this one was stopped or cut off past
    STALE_AFTER_S): the worker is killed, and Driver._record (loop.py) drops the trial with one line."""
    stop = threading.Event()

    def beat():
        while not stop.wait(HEARTBEAT_S):
            try:
                trial.set_user_attr("heartbeat", time.time())
            except UpdateFinishedTrialError:
                gang.signal_kill("taken over")
                return
            except Exception:  # storage hiccup: the next beat tries again
                pass

    th = threading.Thread(target=beat, daemon=True)
    th.start()
    try:
        yield
    finally:
        stop.set()
        th.join(timeout=5)


# ----- the taker -----
def _owner_alive(owner: dict) -> bool:
    try:
        return abs(psutil.Process(int(owner["pid"])).create_time() - float(owner["started"])) < 1.0
    except (psutil.Error, KeyError, TypeError, ValueError):
        return False


def is_stale(t: optuna.trial.FrozenTrial, now: float | None = None) -> bool:
    owner = t.user_attrs.get("owner")
    if owner is None:  # its driver died between ask() and claiming it (both happen under the lock)
        return True
    if owner.get("host") == HOST:
        return not _owner_alive(owner)
    beat = float(t.user_attrs.get("heartbeat") or 0.0)
    return (now or time.time()) - beat > STALE_AFTER_S


def abandon(ctx: StudyContext, number: int, message: str, kind: Kind = Kind.CRASH,
            study: optuna.Study | None = None, storage: optuna.storages.BaseStorage | None = None) -> bool:
    """Queue a RUNNING trial's config again, then mark it FAIL (`kind`, superseded); call it
    under the study lock (the owner records its trial under it too: Driver._write_if_ours).
    `study` and `storage` default to the context's (a driver shutting down passes bounded ones).

    The copy comes first and only once (a trial with requeued_from == number): a kill between
    the two steps leaves the trial RUNNING beside its copy, and the next recovery only fails it."""
    study = study or ctx.study
    storage = storage or ctx.storage
    study_id = storage.get_study_id_from_name(ctx.name)
    trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, number)
    t = storage.get_trial(trial_id)
    if t.state != TrialState.RUNNING:
        return False
    d = trial_decisions(ctx.space, t)
    if d is not None and not copied(study, number):
        study.enqueue_trial(d, user_attrs={"requeued_from": number})
    try:
        storage.set_trial_user_attr(trial_id, "failure_kind", kind.value)
        storage.set_trial_user_attr(trial_id, "failure_message", message)
        storage.set_trial_user_attr(trial_id, "superseded", True)
        study.tell(number, state=TrialState.FAIL)
    except UpdateFinishedTrialError:
        return False
    return True


def copied(study: optuna.Study, number: int) -> bool:
    """Whether trial `number`'s config was queued again (abandon's first step was taken)."""
    return any(o.user_attrs.get("requeued_from") == number for o in study.get_trials(deepcopy=False))


def recover_stale(ctx: StudyContext) -> list[int]:
    """Abandon the RUNNING trials whose driver is gone; returns their numbers. A trial its
    driver left RUNNING when Ctrl-C or SIGTERM gave it no time to mark it (a mark in the trial's
    folder says so) is typed `interrupted`, any other `crash` ("driver died")."""
    done = []
    with ctx.lock.hold():
        for t in ctx.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if not is_stale(t):
                continue
            why = left_by_interrupt(ctx.run_dir, t.number)
            if why:
                ok = abandon(ctx, t.number, f"driver {why} before it could mark the trial; queued again",
                             Kind.INTERRUPTED)
            else:
                ok = abandon(ctx, t.number, _gone_why(t))
            if ok:
                done.append(t.number)
    return done


def _gone_why(t: optuna.trial.FrozenTrial) -> str:
    """The failure message of a trial whose driver is gone: "driver died" (its process is gone,
    or it never claimed the trial), or how long a driver on another host has been silent."""
    owner = t.user_attrs.get("owner") or {}
    if not owner or owner.get("host") == HOST:
        return "driver died"
    host = str(owner.get("host"))[:100]
    beat = t.user_attrs.get("heartbeat")
    if not beat:
        return f"driver on {host} gave no heartbeat; taken over"
    return f"driver on {host} silent for {time.time() - float(beat):.0f} s (stale heartbeat); taken over"


# ----- the mark a stopped driver leaves for the taker -----
INTERRUPTED_MARK = "interrupted.txt"  # in a trial's folder: its driver stopped (Ctrl-C, SIGTERM) unmarked
_STOPS = ("interrupted (Ctrl-C)", "terminated (SIGTERM)")


def mark_left(run_dir: str, numbers: list[int], why: str) -> None:
    """Best effort: a mark in each trial's folder that its driver left it RUNNING on `why`."""
    for number in numbers:
        try:
            write_whole(os.path.join(run_dir, "trials", str(number), INTERRUPTED_MARK), why + "\n")
        except OSError:
            pass


def left_by_interrupt(run_dir: str, number: int) -> str | None:
    """How the trial's driver was stopped when it left a mark (mark_left), else None."""
    try:
        with open(os.path.join(run_dir, "trials", str(number), INTERRUPTED_MARK)) as f:
            text = f.read(100).strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text if text in _STOPS else None

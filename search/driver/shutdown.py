"""A driver's bounded stop: Ctrl-C and SIGTERM, or an error it cannot go on after.

Ctrl-C and SIGTERM are bounded (SHUTDOWN_S) whatever blocks (a worker that does not die, a
storage that is locked or away, a thread stuck in either): the worker process groups are
killed (stop_workers), the trials in flight are queued again through a storage whose waits are
bounded, under the study lock (bounded too), and whatever could not be marked in time stays
RUNNING for `resume`, with a mark in its folder that makes `resume` type it `interrupted`
(requeue_in_flight; cli/common.run_driver bounds the process's exit too). Driver._shut_down
(loop.py) runs these steps in order.
"""
from __future__ import annotations

import threading
import time

import optuna

from ...store.outcome import Kind
from ..errors import ShutDown
from ..study import storage as storage_lib
from ..workers.pool import WorkerSlot
from .context import StudyContext
from .takeover import abandon, mark_left

SHUTDOWN_S = 10.0  # Ctrl-C / SIGTERM: workers killed and trials in flight queued again within this


def _plural(numbers: list[int]) -> str:
    return f"trial{'s' if len(numbers) > 1 else ''} {', '.join(map(str, numbers))}"


def shutdown_line(why: str, requeued: list[int], left: list[int], problem: str, run_dir: str) -> str:
    """The one line of a driver stopped by Ctrl-C or SIGTERM: what it queued again, and what it
    left RUNNING for `resume` (and why)."""
    parts = [why]
    if requeued:
        parts.append(f"{_plural(requeued)} queued again")
    if left:
        parts.append(f"{_plural(left)} left RUNNING ({problem or 'not marked in time'}); "
                     f"`paxsearch resume {run_dir}` queues {'them' if len(left) > 1 else 'it'} again")
    if not requeued and not left:
        parts.append("no trial was running")
    return "; ".join(parts)


def ignore_further_signals() -> None:
    """During the bounded shutdown a second Ctrl-C or SIGTERM changes nothing (it would only
    cut the requeueing short)."""
    import signal

    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    except ValueError:  # not the main thread: signals do not reach this code then
        pass


def stop_workers(slots: list[WorkerSlot], threads: list[threading.Thread], deadline: float) -> None:
    """Kill the worker process groups, then give the loop threads a moment (3 s at most, and
    not past `deadline`) to see their workers die."""
    for slot in slots:
        slot.shut_down("interrupt")
    settle = min(deadline, time.monotonic() + 3.0)  # the loop threads see their workers die
    for th in threads:
        if th.is_alive():
            th.join(timeout=max(0.0, settle - time.monotonic()))
    for slot in slots:
        slot.reap(settle)


def requeue_in_flight(ctx: StudyContext, numbers: list[int], why: str, status: int, deadline: float,
                      maybe_empty: bool) -> ShutDown:
    """Queue the trials in flight again by `deadline`; mark those not marked in time, which stay
    RUNNING: `resume` (or `run`) fails them and queues them again once this driver is gone.
    Returns the exception whose line says which is which."""
    requeued, handled, problem = requeue_bounded(ctx, numbers, why, deadline)
    left = [n for n in numbers if n not in handled]
    mark_left(ctx.run_dir, left, why)
    return ShutDown(shutdown_line(why, requeued, left, problem, ctx.run_dir), status, maybe_empty=maybe_empty)


def stopped_on(ctx: StudyContext, error: BaseException, numbers: list[int]) -> BaseException:
    """The error the driver stops on (a SQLite file that cannot be written: one line, at
    once). Its trials in flight (`numbers`) are queued again first (within SHUTDOWN_S), unless
    the storage is what failed: then they stay RUNNING for `resume`, as the line says."""
    lasting = storage_lib.lasting_error(error)
    if lasting is not None:
        return lasting
    if numbers and not isinstance(error, storage_lib.StorageError):
        why = f"stopped ({storage_lib.scrub(storage_lib.first_line(error), ctx.url)[:200]})"
        requeue_bounded(ctx, numbers, why, time.monotonic() + SHUTDOWN_S)
    return error


def requeue_bounded(ctx: StudyContext, numbers: list[int], why: str,
                    deadline: float) -> tuple[list[int], set[int], str]:
    """abandon() each trial in flight, in a thread given until `deadline`: (the numbers queued
    again, the numbers settled either way, the problem that stopped it or "")."""
    requeued: list[int] = []
    handled: set[int] = set()
    problem: list[str] = []
    if not numbers:
        return requeued, handled, ""

    def work() -> None:
        storage = None
        try:
            storage = storage_lib.open_bounded(ctx.url, max(0.5, deadline - time.monotonic() - 0.5))
            study = optuna.load_study(study_name=ctx.name, storage=storage,
                                      sampler=optuna.samplers.RandomSampler())
            with ctx.lock.hold(timeout=max(0.0, deadline - time.monotonic() - 0.5)):
                for number in numbers:
                    if abandon(ctx, number, f"driver {why}; queued again", Kind.INTERRUPTED, study, storage):
                        requeued.append(number)
                    handled.add(number)
        except storage_lib.LockTimeout as e:
            problem.append(str(e))
        except Exception as e:  # noqa: BLE001 - the line says what stopped it
            cause = e.__cause__ if isinstance(e, optuna.exceptions.StorageInternalError) else None
            problem.append(storage_lib.scrub(storage_lib.first_line(cause or e), ctx.url))
        finally:
            if storage is not None:
                storage.engine.dispose()

    th = threading.Thread(target=work, daemon=True, name="requeue")
    th.start()
    th.join(timeout=max(0.0, deadline - time.monotonic()))
    if th.is_alive():
        problem.append(f"the storage did not answer within {SHUTDOWN_S:.0f} s")
    return list(requeued), set(handled), problem[0] if problem else ""

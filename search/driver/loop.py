"""The study loop shared by `run`, `worker` and `resume`: propose under the study lock, run the
trial in a worker gang, store everything, repeat until the budget (or the space) is used up.

A trial's life in the driver (Driver): _next asks the tuner for it and claims it (owner,
heartbeat); _run prepares it (config and static checks: prepare.py) and hands it to a worker
gang while its heartbeat beats (takeover.heartbeat); _record stores its outcome, unless another
driver took it over meanwhile. Only the driver talks to storage; workers get a job and give back
a result.

Around the loop: trials a dead driver left RUNNING are taken over at the start (takeover.py);
Ctrl-C and SIGTERM stop the driver within a bound, queueing its trials in flight again
(shutdown.py); budget.py says whether work is left.
"""
from __future__ import annotations

import math
import os
import threading
import time
from typing import Callable

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import TrialState

from ...store import compiler
from ...store.outcome import Kind, TrialOutcome
from ..errors import ShutDown, Terminated, UserError
from ..study import configio
from ..study import storage as storage_lib
from ..study.storage import is_superseded
from ..trial import record
from ..tuning import steer
from ..tuning.tuners import (
    SpaceExhausted,
    make_proposer,
    make_pruner,
    make_sampler,
    seen_keys,
    suggest_all,
    trial_decisions,
)
from ..workers import gpu_assign
from ..workers.pool import WorkerSlot, WorkerStartError
from . import shutdown, takeover
from .budget import budget_of, has_work
from .context import StudyContext
from .prepare import prepare, worker_flags
from .progress import Progress
from .takeover import copied, owner_info, recover_stale


class DriverError(UserError, RuntimeError):
    """The study cannot go on (e.g. no worker process can start)."""


# Trial number -> fault the worker injects (hang, nan, segfault, oom_kill). Only tests set it,
# in the driver's own process (tests/fault_driver.py): no environment variable, nothing stored
# in the study, so no stale setting can sabotage a real study.
FAULTS: dict[int, str] = {}


class Driver:
    def __init__(self, ctx: StudyContext, progress: bool = True,
                 slots: Callable[[int], WorkerSlot] | None = None):
        """`slots(i)` makes worker slot i (default: local worker processes, each with its own
        GPUs on a GPU target); a slice gang's host 0 gives its own (search/gang/slice_gang.py)."""
        self.ctx = ctx
        self.make_slot = slots or self._local_slots()
        s = ctx.settings
        self.objectives = list(s.objectives)
        ctx.study.sampler = make_sampler(s, ctx.space, ctx.seed)
        first_cfg = configio.build(ctx.space.first_config())
        ctx.study.pruner = make_pruner(s, first_cfg.steps)
        self.first_flags = worker_flags(first_cfg)
        self.relay = s.pruner != "none" and len(self.objectives) == 1 and self.objectives[0] != "memory"
        self.proposer = make_proposer(s, ctx.space, ctx.seed)
        self.budget, self.space_size = budget_of(ctx)
        self.owner = owner_info()
        self.progress_enabled = progress
        self._inflight: dict[int, optuna.Trial] = {}
        self._stop = threading.Event()
        self._interrupted = threading.Event()  # Ctrl-C: in-flight trials are requeued, not recorded
        self._error: BaseException | None = None
        self._start_failures = 0
        self._asked_any = False  # whether this driver created a trial (a study it created is then not empty)
        self.finished = 0

    # ----- the loop -----
    def run(self) -> dict:
        ctx = self.ctx
        abandoned = recover_stale(ctx)
        t0 = time.perf_counter()
        if not self._has_work():
            print("nothing to run: the study's budget (or its space) is used up", flush=True)
            return {"elapsed_s": 0.0, "finished": 0}
        trials = ctx.study.get_trials(deepcopy=False)
        done = [t for t in trials if t.state.is_finished() and not is_superseded(t)]
        self.progress = Progress(self.budget, steer.counted(done), self.objectives, enabled=self.progress_enabled,
                                 predicted=ctx.target.plan_only)
        self.progress.seed_best(t.values for t in done
                                if t.state == TrialState.COMPLETE and not t.user_attrs.get("failure_kind"))
        if abandoned:
            self.progress.note(f"resumed: trial(s) {', '.join(map(str, abandoned))} left running by a driver that is "
                               "gone: marked failed and queued again")
        gangs = [self.make_slot(i) for i in range(ctx.settings.workers)]
        threads = [threading.Thread(target=self._loop, args=(g,), daemon=True) for g in gangs]
        try:
            for g in gangs:
                g.gang(self.first_flags).start()  # workers import JAX while the first trial is proposed
            for th in threads:
                th.start()
            while any(th.is_alive() for th in threads):
                for th in threads:
                    th.join(timeout=0.5)
        except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (errors.Terminated)
            terminated = isinstance(e, Terminated)
            raise self._shut_down(gangs, threads, "terminated (SIGTERM)" if terminated else "interrupted (Ctrl-C)",
                                  143 if terminated else 130) from None
        finally:
            if not self._interrupted.is_set():  # a shut down driver's threads may still read the pipes
                for g in gangs:
                    g.close()
            self.progress.close()
        if self._error is not None:
            raise shutdown.stopped_on(ctx, self._error, sorted(self._inflight))
        self._check_none_left_running()
        return {"elapsed_s": time.perf_counter() - t0, "finished": self.finished}

    def _shut_down(self, slots: list[WorkerSlot], threads: list[threading.Thread], why: str,
                   status: int) -> ShutDown:
        """Ctrl-C / SIGTERM, within shutdown.SHUTDOWN_S whatever blocks: kill the worker process
        groups, give the loop threads a moment, then queue the trials in flight again; a trial
        not marked in time stays RUNNING for `resume` (shutdown.py). Returns the exception whose
        line says which is which."""
        shutdown.ignore_further_signals()
        deadline = time.monotonic() + shutdown.SHUTDOWN_S
        self._interrupted.set()
        self._stop.set()
        shutdown.stop_workers(slots, threads, deadline)
        return shutdown.requeue_in_flight(self.ctx, sorted(self._inflight), why, status, deadline,
                                          maybe_empty=not self._asked_any)

    def _local_slots(self) -> Callable[[int], WorkerSlot]:
        """Worker slot i: its processes on this machine; on a GPU target, slot i's processes see
        only the i-th `gpu:N` of the visible GPUs (GpuAssignError, one line, when they do not fit)."""
        ctx, s = self.ctx, self.ctx.settings
        cuda = gpu_assign.for_target(ctx.target, s.workers, s.processes)
        return lambda i: WorkerSlot(ctx.target, s.processes, ctx.run_dir, i, s.imports, cuda[i] if cuda else None)

    def _check_none_left_running(self) -> None:
        """A driver never ends well while a trial it owns is still RUNNING in the study."""
        mine = [t.number for t in storage_lib.retry(self.ctx.study.get_trials, deepcopy=False,
                                                    states=(TrialState.RUNNING,))
                if t.user_attrs.get("owner") == self.owner]
        if mine:
            raise DriverError(f"trial(s) {', '.join(map(str, mine))} of this driver are still RUNNING in the study; "
                              "`paxsearch resume` (or `run` again) queues them again")

    def _loop(self, slot: WorkerSlot) -> None:
        try:
            while not self._stop.is_set():
                try:
                    slot.last.ensure_ready()
                    self._start_failures = 0
                except WorkerStartError as e:
                    self._start_failures += 1
                    if self._start_failures >= 2:
                        raise DriverError(f"worker processes cannot start: {e}") from None
                    continue
                item = self._next()
                if item is None:
                    return
                try:
                    self._run(slot, *item)
                except UpdateFinishedTrialError:  # another driver took the trial over before it ran
                    self._taken_over(item[0].number)
        except BaseException as e:  # noqa: BLE001 - handed to the main thread
            self._error = self._error or e
            self._stop.set()

    # ----- proposing -----
    def _has_work(self) -> bool:
        return has_work(self.ctx)

    def _next(self):
        ctx, space = self.ctx, self.ctx.space
        with ctx.lock.hold():
            trials = ctx.study.get_trials(deepcopy=False)
            active = [t for t in trials if not is_superseded(t)]
            waiting = [t for t in active if t.state == TrialState.WAITING]
            if not waiting:
                if steer.counted(active) >= self.budget:
                    return None
                if self.proposer is not None:
                    point = self.proposer.propose(space, active)
                    if point is None:
                        return None
                    ctx.study.enqueue_trial(point)
                elif self.space_size is not None and len(seen_keys(space, active)) >= self.space_size:
                    return None
            trial = ctx.study.ask()
            self._asked_any = True
            # a blip of the database is waited for, as at every other write
            storage_lib.retry(trial.set_user_attr, "owner", self.owner)
            storage_lib.retry(trial.set_user_attr, "heartbeat", time.time())
            try:
                decisions = suggest_all(trial, space)
            except SpaceExhausted:
                trial.set_user_attr("superseded", True)
                ctx.study.tell(trial, state=TrialState.FAIL)
                return None
            storage_lib.retry(trial.set_user_attr, "decisions", decisions)
            self._inflight[trial.number] = trial
        return trial, decisions

    # ----- one trial -----
    def _run(self, slot: WorkerSlot, trial: optuna.Trial, decisions: dict) -> None:
        ctx = self.ctx
        t0 = time.perf_counter()
        number = trial.number
        trial_dir = os.path.abspath(os.path.join(ctx.run_dir, "trials", str(number)))
        os.makedirs(trial_dir, exist_ok=True)
        storage_lib.retry(trial.set_user_attr, "trial_dir", trial_dir)
        outcome, config_json, flags = prepare(ctx, trial, decisions, trial_dir)
        gang = slot.gangs.get(flags) or slot.last  # settled in the driver: no worker is started for it
        if outcome is None:
            gang = slot.gang(flags)  # started with the trial's compiler flag set
            job = {"number": number, "trial_dir": trial_dir, "config": config_json,
                   "log_path": os.path.join(trial_dir, "log.txt"), "memory_budget": ctx.settings.memory_budget,
                   "count_flops": ctx.settings.count_flops, "relay_reports": self.relay,
                   "fault": FAULTS.get(number),
                   "plan_target": ctx.target.text if ctx.target.plan_only else None,
                   "steer": self._steer(trial)}
            with takeover.heartbeat(trial, gang):
                try:
                    outcome = gang.run(job, ctx.settings.timeout, self._on_report(trial) if self.relay else None)
                except WorkerStartError as e:
                    outcome = TrialOutcome.failure(Kind.CRASH, f"worker could not start: {e}")
        if self._interrupted.is_set():  # killed by our own Ctrl-C: the main thread requeues it
            return
        self._record(trial, decisions, outcome, time.perf_counter() - t0, gang.env)
        self._inflight.pop(number, None)

    def _requeue_lost(self, trial: optuna.Trial) -> None:
        """A trial that a lost host failed (slice gangs) is superseded and its config queued
        again, so that the budget counts configs that were really tried."""
        retry = storage_lib.retry
        frozen = retry(self.ctx.storage.get_trial, trial._trial_id)
        d = trial_decisions(self.ctx.space, frozen)
        if d is not None:
            with self.ctx.lock.hold():
                retry(self.ctx.study.enqueue_trial, d, user_attrs={"requeued_from": trial.number})

    def _on_report(self, trial: optuna.Trial):
        metric = self.objectives[0]

        def on_report(msg: dict) -> bool:
            value = msg.get(metric)
            if value is None or not math.isfinite(float(value)):
                return False
            try:
                trial.report(float(value), int(msg["step"]))
                return trial.should_prune()
            except UpdateFinishedTrialError:  # taken over by another driver: stop it, _record drops it
                return True

        return on_report

    def _record(self, trial: optuna.Trial, decisions: dict, outcome: TrialOutcome, total_s: float,
                env: dict | None) -> None:
        state, values, outcome = record.settle(self.objectives, outcome, self.ctx.settings.train_tokens)
        outcome = outcome.replace(timings=record.driver_timings(outcome, total_s),
                                  plan=compiler.named(outcome.plan, env)).with_env(env)
        attrs = outcome.to_user_attrs()
        if state == TrialState.COMPLETE and values and not outcome.kind.failed and not outcome.predicted:
            values, attrs = self._inherit_group_loss(trial, values, attrs)
        lost = outcome.kind is Kind.HOST_LOST  # not the config's doing: it runs again
        if lost:
            attrs["superseded"] = True
        # a storage outage is ridden out; past its budget the trial stays RUNNING
        if not storage_lib.retry(self._write_if_ours, trial, attrs, values if state == TrialState.COMPLETE else None,
                                 state):
            self._taken_over(trial.number)
            return
        if lost:
            self._requeue_lost(trial)
        self.finished += 1
        feasible = state == TrialState.COMPLETE and not outcome.kind.failed
        self.progress.finished(record.trial_line(trial.number, state, decisions, outcome, total_s), values, feasible,
                               counts=not outcome.steered)

    def _write_if_ours(self, trial: optuna.Trial, attrs: dict, values, state: TrialState) -> bool:
        """Under the study lock (as abandon runs): store the trial's outcome and final state,
        unless another driver took it over (its config was queued again): False then. True
        also when an earlier try of this call was stored before its connection dropped."""
        with self.ctx.lock.hold():
            if copied(self.ctx.study, trial.number):
                return False
            if self.ctx.storage.get_trial(trial._trial_id).state.is_finished():
                return True
            for key, value in attrs.items():
                trial.set_user_attr(key, value)
            if attrs.get("constraint"):
                trial.set_constraint("memory", attrs["constraint"][0])
            self.ctx.study.tell(trial, values=values, state=state)
        return True

    def _taken_over(self, number: int) -> None:
        self._inflight.pop(number, None)
        if self._interrupted.is_set():  # our own Ctrl-C queued it again: its line says so
            return
        self.progress.note(f"trial {number}: taken over by another driver while this one was stopped or cut off "
                           f"(no heartbeat for over {takeover.STALE_AFTER_S:.0f} s); its result here is dropped, "
                           "the copy queued by the other driver counts")

    def _inherit_group_loss(self, trial: optuna.Trial, values: list[float], attrs: dict) -> tuple[list, dict]:
        """A layout-only variant scores its math group's loss (measured once, by the group's first
        trial), so the loss objective moves only with what changes the math; its own loss stays
        in measured.loss, and how far it was from the group's in loss_group."""
        if "loss" not in self.objectives:
            return values, attrs
        i = self.objectives.index("loss")
        key = storage_lib.retry(lambda: trial.user_attrs.get("math_key"))
        trials = storage_lib.retry(self.ctx.study.get_trials, deepcopy=False)
        ref = steer.group_loss(trials, key, trial.number, i)
        own = values[i]
        if ref is None or not math.isfinite(own):
            return values, attrs
        number, loss = ref
        deviation = abs(own / loss - 1.0) if loss else abs(own)
        group = {"math_key": key, "from_trial": number, "loss": loss, "own_loss": own, "deviation": deviation}
        if deviation > steer.LOSS_TOLERANCE:  # the layout changed the math: keep the trial's own loss, say so
            self.progress.note(f"#{trial.number}: loss {own:.6g} differs from its math group's {loss:.6g} "
                               f"(trial {number}) by {deviation:.2%}, more than a layout may; kept its own")
            return values, {**attrs, "loss_group": {**group, "from_trial": None, "mismatch": True}}
        values = list(values)
        values[i] = loss
        return values, {**attrs, "loss_group": group}

    def _steer(self, trial: optuna.Trial) -> dict | None:
        """The finished trials a worker may find this one dominated by (search/tuning/steer.py)."""
        if self.ctx.settings.steer == "none" or self.ctx.target.plan_only:
            return None
        key = storage_lib.retry(lambda: trial.user_attrs.get("math_key"))
        trials = storage_lib.retry(self.ctx.study.get_trials, deepcopy=False)
        return steer.job_steer(trials, self.objectives, key, self.ctx.settings.steer)

"""The study loop shared by `run`, `worker` and `resume`: propose under the study lock, run the
trial in a worker gang, store everything, repeat until the budget (or the space) is used up.

Only the driver talks to storage; workers get a job and give back a result. A trial left
RUNNING by a driver that died is found (its owner process is gone, or its heartbeat is
stale), marked FAIL (failure_kind "crash", "driver died") and its config queued again. A
driver whose trial was taken over that way while it was stopped or cut off drops its result
with one line when it wakes (the taking over and the recording are done under the study
lock: exactly one of them happens).

Ctrl-C and SIGTERM are bounded (SHUTDOWN_S): the worker process groups are killed, the
trials in flight are queued again through a storage whose waits are bounded, and whatever
could not be marked in time stays RUNNING for `resume`, with a mark in its folder that
makes `resume` type it `interrupted` (cli/common.run_driver bounds the process's exit too).
"""
from __future__ import annotations

import contextlib
import math
import os
import socket
import threading
import time
from typing import Callable

import optuna
import psutil
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import TrialState

from ...store.outcome import Kind, TrialOutcome
from ...trainer import flagsets
from ..errors import ShutDown, Terminated, UserError
from ..planning import screen as plan_screen
from ..study import configio
from ..study import storage as storage_lib
from ..study.run_folder import write_whole
from ..study.settings import SettingsError, steps_for_tokens
from ..study.space import SpaceError, config_dict
from ..study.storage import is_superseded
from ..trial import record
from ..trial.classify import Phase, classify
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
from ..workers.pool import WorkerGang, WorkerSlot, WorkerStartError
from .context import StudyContext
from .progress import Progress

STALE_AFTER_S = 120.0  # a RUNNING trial of another host whose heartbeat is older is abandoned
HEARTBEAT_S = 15.0
HOST = socket.gethostname()  # the owner's host; a trial of another host is judged by its heartbeat
SHUTDOWN_S = 10.0  # Ctrl-C / SIGTERM: workers killed and trials in flight queued again within this


class DriverError(UserError, RuntimeError):
    """The study cannot go on (e.g. no worker process can start)."""


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


def _ignore_further_signals() -> None:
    """During the bounded shutdown a second Ctrl-C or SIGTERM changes nothing (it would only
    cut the requeueing short)."""
    import signal

    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    except ValueError:  # not the main thread: signals do not reach this code then
        pass


def owner_info() -> dict:
    return {"host": HOST, "pid": os.getpid(), "started": psutil.Process().create_time()}


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
    if d is not None and not _copied(study, number):
        study.enqueue_trial(d, user_attrs={"requeued_from": number})
    try:
        storage.set_trial_user_attr(trial_id, "failure_kind", kind.value)
        storage.set_trial_user_attr(trial_id, "failure_message", message)
        storage.set_trial_user_attr(trial_id, "superseded", True)
        study.tell(number, state=TrialState.FAIL)
    except UpdateFinishedTrialError:
        return False
    return True


def _copied(study: optuna.Study, number: int) -> bool:
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


# Trial number -> fault the worker injects (hang, nan, segfault, oom_kill). Only tests set it,
# in the driver's own process (tests/fault_driver.py): no environment variable, nothing stored
# in the study, so no stale setting can sabotage a real study.
FAULTS: dict[int, str] = {}


def token_budget(cfg, tokens: int, num_devices: int) -> dict:
    """The steps that give `cfg` a budget of `tokens` training tokens on `num_devices`
    (settings.steps_for_tokens), with the figures stored on the trial. Loss is then scored on
    held-out data, so a config that does not evaluate cannot be scored (ConfigError)."""
    from ...trainer import mesh as mesh_lib
    from ...trainer.errors import ConfigError

    if not cfg.eval.enabled:
        raise ConfigError("STUDY tokens= scores loss as the held-out eval loss, and this config has "
                          "eval.enabled=False; enable eval in space() (eval=EvalConfig(enabled=True))")
    batch = mesh_lib.global_batch_size(cfg, num_devices)
    steps = steps_for_tokens(tokens, batch, cfg.model.seq_len)
    per_step = batch * cfg.model.seq_len
    return {"tokens": int(tokens), "global_batch": int(batch), "seq_len": int(cfg.model.seq_len),
            "tokens_per_step": int(per_step), "steps": int(steps), "tokens_trained": int(steps * per_step)}


def budget_of(ctx: StudyContext) -> tuple[int, int | None]:
    """(trials the study runs, size of its space or None when infinite)."""
    size = ctx.space.size() if ctx.space.finite else None
    return (ctx.settings.trials if size is None else min(ctx.settings.trials, size)), size


def has_work(ctx: StudyContext) -> bool:
    """Whether a driver would find a trial to run now: a queued config, or budget and space left."""
    budget, size = budget_of(ctx)
    with ctx.lock.hold():
        active = [t for t in ctx.study.get_trials(deepcopy=False) if not is_superseded(t)]
        if any(t.state == TrialState.WAITING for t in active):
            return True
        if steer.counted(active) >= budget:
            return False
        if size is not None and len(seen_keys(ctx.space, active)) >= size:
            return False
    return True


def study_finished(ctx: StudyContext) -> bool:
    """No work left and no trial running anywhere (a running one may still be queued again)."""
    running = storage_lib.retry(ctx.study.get_trials, deepcopy=False, states=(TrialState.RUNNING,))
    return not running and not has_work(ctx)


def worker_flags(cfg) -> str:
    """The compiler flag set a config's worker runs with: its own when known, else "default"
    (an unknown name fails the trial in the driver, before any worker)."""
    return cfg.flags if cfg.flags in flagsets.FLAG_SETS else "default"


def first_flag_set(ctx: StudyContext) -> str:
    """The compiler flag set the study's workers start with: the first config's."""
    return worker_flags(configio.build(ctx.space.first_config()))


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
            raise self._stopped_on(self._error)
        self._check_none_left_running()
        return {"elapsed_s": time.perf_counter() - t0, "finished": self.finished}

    def _shut_down(self, slots: list[WorkerSlot], threads: list[threading.Thread], why: str,
                   status: int) -> ShutDown:
        """Ctrl-C / SIGTERM, within SHUTDOWN_S whatever blocks (a worker that does not die, a
        storage that is locked or away, a thread stuck in either): kill the worker process
        groups, give the loop threads a moment, then queue the trials in flight again through
        a storage whose waits are bounded, under the study lock (bounded too). A trial not
        marked in time stays RUNNING; `resume` (or `run`) fails it and queues it again once
        this driver is gone. Returns the exception whose line says which is which."""
        _ignore_further_signals()
        deadline = time.monotonic() + SHUTDOWN_S
        self._interrupted.set()
        self._stop.set()
        for slot in slots:
            slot.shut_down("interrupt")
        settle = min(deadline, time.monotonic() + 3.0)  # the loop threads see their workers die
        for th in threads:
            if th.is_alive():
                th.join(timeout=max(0.0, settle - time.monotonic()))
        for slot in slots:
            slot.reap(settle)
        numbers = sorted(self._inflight)
        requeued, handled, problem = self._requeue_bounded(numbers, why, deadline)
        left = [n for n in numbers if n not in handled]
        mark_left(self.ctx.run_dir, left, why)
        return ShutDown(shutdown_line(why, requeued, left, problem, self.ctx.run_dir), status,
                        maybe_empty=not self._asked_any)

    def _stopped_on(self, error: BaseException) -> BaseException:
        """The error the driver stops on (a SQLite file that cannot be written: one line, at
        once). Its trials in flight are queued again first (within SHUTDOWN_S), unless the
        storage is what failed: then they stay RUNNING for `resume`, as the line says."""
        lasting = storage_lib.lasting_error(error)
        if lasting is not None:
            return lasting
        if self._inflight and not isinstance(error, storage_lib.StorageError):
            why = f"stopped ({storage_lib.scrub(storage_lib.first_line(error), self.ctx.url)[:200]})"
            self._requeue_bounded(sorted(self._inflight), why, time.monotonic() + SHUTDOWN_S)
        return error

    def _requeue_bounded(self, numbers: list[int], why: str, deadline: float) -> tuple[list[int], set[int], str]:
        """abandon() each trial in flight, in a thread given until `deadline`: (the numbers queued
        again, the numbers settled either way, the problem that stopped it or "")."""
        requeued: list[int] = []
        handled: set[int] = set()
        problem: list[str] = []
        if not numbers:
            return requeued, handled, ""
        ctx = self.ctx

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
            trial.set_user_attr("owner", self.owner)
            trial.set_user_attr("heartbeat", time.time())
            try:
                decisions = suggest_all(trial, space)
            except SpaceExhausted:
                trial.set_user_attr("superseded", True)
                ctx.study.tell(trial, state=TrialState.FAIL)
                return None
            trial.set_user_attr("decisions", decisions)
            self._inflight[trial.number] = trial
        return trial, decisions

    # ----- one trial -----
    def _run(self, slot: WorkerSlot, trial: optuna.Trial, decisions: dict) -> None:
        ctx = self.ctx
        t0 = time.perf_counter()
        number = trial.number
        trial_dir = os.path.abspath(os.path.join(ctx.run_dir, "trials", str(number)))
        os.makedirs(trial_dir, exist_ok=True)
        trial.set_user_attr("trial_dir", trial_dir)
        outcome, config_json, flags = self._prepare(trial, decisions, trial_dir)
        gang = slot.gangs.get(flags) or slot.last  # settled in the driver: no worker is started for it
        if outcome is None:
            gang = slot.gang(flags)  # started with the trial's compiler flag set
            job = {"number": number, "trial_dir": trial_dir, "config": config_json,
                   "log_path": os.path.join(trial_dir, "log.txt"), "memory_budget": ctx.settings.memory_budget,
                   "count_flops": ctx.settings.count_flops, "relay_reports": self.relay,
                   "fault": FAULTS.get(number),
                   "plan_target": ctx.target.text if ctx.target.plan_only else None,
                   "steer": self._steer(trial)}
            with self._heartbeat(trial, gang):
                try:
                    outcome = gang.run(job, ctx.settings.timeout, self._on_report(trial) if self.relay else None)
                except WorkerStartError as e:
                    outcome = TrialOutcome.failure(Kind.CRASH, f"worker could not start: {e}")
        if self._interrupted.is_set():  # killed by our own Ctrl-C: the main thread requeues it
            return
        self._record(trial, decisions, outcome, time.perf_counter() - t0, gang.env)
        self._inflight.pop(number, None)

    def _prepare(self, trial: optuna.Trial, decisions: dict,
                 trial_dir: str) -> tuple[TrialOutcome | None, str | None, str]:
        """Config and static checks in the driver: (the outcome when the trial ends here, config
        JSON, compiler flag set). With STUDY tokens=, the config's steps are the token budget's."""
        from ...trainer import validate
        from ...trainer.errors import ConfigError

        ctx = self.ctx
        try:
            cfg = ctx.space.config(decisions)
            built = configio.build(cfg)
        except (SpaceError, configio.ConfigFileError, TypeError, ValueError) as e:
            return TrialOutcome.failure(*classify(e, Phase.SETUP)), None, "default"
        flags = worker_flags(built)
        budget = None
        if ctx.settings.tokens and not ctx.target.plan_only:
            try:
                budget = token_budget(built, ctx.settings.tokens, ctx.target.num_devices)
            except (ConfigError, SettingsError) as e:
                return TrialOutcome.failure(*classify(e, Phase.SETUP)), None, flags
            cfg.steps = budget["steps"]
            built = configio.build(cfg)
            trial.set_user_attr("token_budget", budget)
        config_json = configio.dumps(cfg)
        trial.set_user_attr("config", config_json)
        trial.set_user_attr("config_dict", config_dict(cfg))
        write_whole(os.path.join(trial_dir, "config.json"), config_json)
        try:
            target = ctx.target.for_config(built)  # slices=auto: prod(mesh.dcn) slices for this trial
            validate.check(built, target.num_devices, target.platform, ctx.settings.processes)
            if built.flags != "default":  # XLA aborts on a flag it does not know: one probe per set
                flagsets.validate(built.flags, target.platform,
                                  tpu_slice=target.slice_name if target.plan_only else None)
        except ConfigError as e:
            return TrialOutcome.failure(*classify(e, Phase.CHECK)), config_json, flags
        if not target.plan_only:  # steering and the math group's loss (_inherit_group_loss) read it
            trial.set_user_attr("math_key", steer.math_key(built, target.num_devices))
        if target.plan_only:  # settled here when the study already knows the answer
            trial.set_user_attr("plan_target", target.name)  # the trial's concrete target
            keys = plan_screen.keys_attrs(built, target)
            for key, value in keys.items():
                trial.set_user_attr(key, value)
            trials = ctx.study.get_trials(deepcopy=False)
            return (plan_screen.screen(built, target, keys, trials, ctx.settings.memory_budget), config_json,
                    flags)
        return None, config_json, flags

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

    @contextlib.contextmanager
    def _heartbeat(self, trial: optuna.Trial, gang: WorkerGang):
        """Beats every HEARTBEAT_S while the trial runs. A beat refused because the trial is
        finished means another driver took it over (this one was stopped or cut off past
        STALE_AFTER_S): the worker is killed, and _record drops the trial with one line."""
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

    def _record(self, trial: optuna.Trial, decisions: dict, outcome: TrialOutcome, total_s: float,
                env: dict | None) -> None:
        state, values, outcome = record.settle(self.objectives, outcome)
        outcome = outcome.replace(timings=record.driver_timings(outcome, total_s)).with_env(env)
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
            if _copied(self.ctx.study, trial.number):
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
                           f"(no heartbeat for over {STALE_AFTER_S:.0f} s); its result here is dropped, the copy "
                           "queued by the other driver counts")

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
        return steer.job_steer(trials, self.objectives, key)

"""One trial inside a worker process: static checks -> plan -> memory screen -> steering
(search/tuning/steer.py) -> short training, or for a plan-only target the plan alone.

Runs with JAX already configured for this process (see workers/entry.py). Returns the trial's
TrialOutcome; whatever ends it early is classified once (classify.py), by its type and the
phase it ended in.
"""
from __future__ import annotations

import dataclasses
import os
import signal
import time
from typing import Callable

import jax

from ...store.outcome import Counters, Measured, TrialOutcome, finite_or_none
from ...store.plan import Plan
from ...trainer import distributed, flagsets
from ...trainer import flops as flops_lib
from ...trainer.config import DistributedConfig, TrainConfig
from ...trainer.errors import ConfigError, NonFiniteLoss
from ...trainer.plan import build_program
from ...trainer.train import train
from ..planning import compiled, plan_cache, plans, targets, topology
from ..planning.compilation import plan_point
from ..planning.predict import Prediction, hardware_for, hlo_cost, predict
from ..study import configio
from ..tuning import steer
from .classify import Phase, classify, describe


def default_memory_budget() -> tuple[int, str]:
    """Per-device bytes a plan may use when no budget is given, and where it comes from."""
    limit, reported = topology.local_device_memory()
    return limit, "device bytes_limit" if reported else "host RAM / local devices"


def trial_config(job: dict) -> TrainConfig:
    cfg = configio.build(configio.loads(job["config"]))
    started = os.environ.get(flagsets.SET_ENV, "default")
    platform = "tpu" if job.get("plan_target") else jax.devices()[0].platform
    if cfg.flags != started or not flagsets.applied(cfg.flags, os.environ, platform):
        raise ConfigError(f"the trial needs compiler flag set {cfg.flags!r} and this worker was started with "
                          f"{started!r}; flags apply only before the backend starts")
    dist = job.get("distributed") or {}
    # A trial writes only into its own trial folder: a checkpoint.directory in the config (which
    # the study's stored --set overrides could name) is dropped, as run_dir is.
    cfg = dataclasses.replace(cfg, run_dir=job["trial_dir"],
                              checkpoint=dataclasses.replace(cfg.checkpoint, directory=None),
                              log=dataclasses.replace(cfg.log, progress=False),
                              distributed=DistributedConfig(**dist) if dist else cfg.distributed)
    if job.get("fault") == "nan":  # fault injection (tests): a learning rate that must diverge
        cfg = dataclasses.replace(cfg, optimizer=dataclasses.replace(cfg.optimizer, peak_lr=1e9, warmup_steps=1,
                                                                     clip_norm=1e9))
    return cfg


_PLAN_DEVICES: dict[str, list] = {}


def run_plan(job: dict) -> TrialOutcome:
    """A plan-only trial (job["plan_target"], e.g. "tpu:v5e-16"): compile the step for the
    target's devices (compile-only TPU devices on this CPU) and never run it. Every figure
    but the compiled memory is a roofline prediction (search/planning/)."""
    t0 = time.perf_counter()
    phases: dict[str, float] = {}
    target = targets.parse_target(job["plan_target"])  # checked by the driver already
    budget = job.get("memory_budget")
    try:
        cfg = trial_config(job)
        target = target.for_config(cfg)  # slices=auto: prod(mesh.dcn) slices for this trial
        analytic = targets.planning_notice(target) is not None  # XLA cannot compile for it here: no devices
        if not analytic and target.name not in _PLAN_DEVICES:  # loading the topology is once per worker
            _PLAN_DEVICES[target.name] = targets.target_devices(target)
        outcome = plan_outcome(cfg, target, _PLAN_DEVICES.get(target.name), budget, phases,
                               None if analytic else plan_cache.folder())  # an analytic plan is not cached
    except Exception as e:  # a config that cannot run there, libtpu failing to load, an unknown topology
        outcome = TrialOutcome.failure(*classify(e, Phase.PLAN), predicted=True,
                                       **targets.plan_result_fields(target, budget))
    if outcome.plan is not None and not target.slices_auto:  # the compiler refused: still name the target
        outcome = outcome.replace(plan=outcome.plan.with_defaults(target=target.name, num_slices=target.num_slices))
    elapsed = time.perf_counter() - t0
    return outcome.replace(timings={"plan_s": elapsed, "train_s": 0.0, "worker_s": elapsed, **phases})


def plan_outcome(cfg, target, devices=None, budget_bytes: int | None = None,
                 phases: dict | None = None, cache=None) -> TrialOutcome:
    """Plan one point of a plan-only target: its Plan, held against `budget_bytes` when
    given (below the HBM), else against the HBM. A step the compiler refuses for memory
    is predicted_oom with the bytes it named standing for the peak. `phases` gets the seconds
    of each phase of the plan (compilation.plan_point). `cache`: the plan cache folder
    the compile is stored in (search/planning/plan_cache.py), or None."""
    try:
        kind, plan, message = "plan", plan_point(cfg, target, devices, phases)[1], ""
    except topology.PredictedOOM as oom:
        kind, plan, message = "refused", compiled.refused(oom, target), str(oom)
    except Exception as e:
        return TrialOutcome.failure(*classify(e, Phase.PLAN), **compiled.result_fields(target, budget_bytes))
    plan_cache.remember(cache, cfg, target, kind, plan, message, environment() if cache is not None else None)
    return compiled.outcome_of(kind, plan, message, target, budget_bytes)


def run_trial(job: dict, report: Callable[[dict], bool]) -> TrialOutcome:
    """Run one job; `report(metrics)` relays an intermediate result and returns True to stop.
    Whatever ends the trial early is classified once, by the phase it ended in."""
    if job.get("plan_target"):
        return run_plan(job)
    t0 = time.perf_counter()
    timings = {"plan_s": 0.0, "train_s": 0.0}
    outcome = TrialOutcome()
    phase = Phase.CHECK
    try:
        cfg = trial_config(job)
        _inject(job.get("fault"), job.get("trial_dir"))
        phase = Phase.PLAN  # static checks (trainer.validate, in build_program), then compile ahead of time
        tp = time.perf_counter()
        try:
            program = build_program(cfg, count_flops=job.get("count_flops", True), keep_hlo=True, hlo_flops=hlo_cost)
        finally:
            timings["plan_s"] = time.perf_counter() - tp
        phase = Phase.SCREEN
        plan = program.plan
        timings.update(plan.phases)
        if job.get("memory_budget"):
            budget, budget_source = job["memory_budget"], "setting"
        else:
            budget, budget_source = default_memory_budget()
        tq = time.perf_counter()
        planned = plans.trained(plan, *predicted_figures(program))
        timings["predict_s"] = round(time.perf_counter() - tq, 3)
        outcome = outcome.replace(plan=planned,
                                  memory_budget={"bytes": int(budget), "source": budget_source},
                                  peak_flops=_peak(plan, cfg))
        if plan.peak_bytes > budget:
            raise topology.PredictedOOM(f"predicted {plan.peak_bytes:,} bytes per device exceeds the budget "
                                        f"of {int(budget):,} bytes ({budget_source})")
        steered = _steered(job.get("steer"), planned)
        if steered:  # predicted dominated by a finished trial: compiled, never trained
            return outcome.replace(steered=steered, pruned=True,
                                   timings={**timings, "worker_s": time.perf_counter() - t0})
        phase = Phase.TRAIN
        stop_asked = {"stop": False}

        def on_metrics(sm) -> bool:
            stop = bool(report({"step": sm.step, "loss": sm.loss, "mfu": sm.mfu, "step_time": sm.step_time}))
            stop_asked["stop"] = stop_asked["stop"] or stop
            return stop

        tt = time.perf_counter()
        outcome = outcome.replace(counters=Counters(train_calls=1))
        try:
            result = train(cfg, on_metrics, program=program, resume=False)
        finally:
            timings["train_s"] = time.perf_counter() - tt
        outcome = outcome.replace(
            counters=Counters(train_calls=1, steps_run=int(result.steps_run)), measured=measured_of(result),
            pruned=bool(stop_asked["stop"] and result.stopped_early and result.steps_run < cfg.steps),
            intermediate=[[m.step, m.loss] for m in result.history])
    except Exception as e:
        if isinstance(e, NonFiniteLoss):
            outcome = outcome.replace(counters=Counters(outcome.counters.train_calls, int(getattr(e, "step", 0))))
        outcome = outcome.failed_as(*classify(e, phase))
    return outcome.replace(timings={**timings, "worker_s": time.perf_counter() - t0})


def _steered(job_steer: dict | None, plan: Plan) -> dict | None:
    """steer.dominated for this trial; with several processes, process 0's verdict for all
    (on CPU each process measures its own peak, so their predictions may differ, and a
    process that trained alone would wait in a collective for ever)."""
    if not job_steer:
        return None
    verdict = steer.dominated(job_steer, plan)
    if jax.process_count() == 1:
        return verdict
    import numpy as np
    from jax.experimental import multihost_utils

    if bool(multihost_utils.broadcast_one_to_all(np.int32(verdict is not None))):
        return verdict or {"decided_by": "process 0"}
    return None


def _inject(fault: str | None, trial_dir: str | None = None) -> None:
    """Fault injection for tests: the job's "fault", which only the test entry point
    (tests/fault_driver.py) sets in its driver's memory; nothing stored in a study sets it.
    "stubborn" hangs ignoring SIGINT and SIGTERM, with a child in a session of its own that
    holds the worker's pipes open (its pid in TRIAL_DIR/stubborn_child.pid). "xla_abort": a
    collective whose first device is 5 s late, so that XLA itself aborts the process when the
    test's XLA_FLAGS set the collectives' abort timeout below that."""
    if fault == "xla_abort":
        late_collective(5.0)
    if fault == "stubborn":
        _stubborn(trial_dir or ".")
    if fault in ("hang", "stubborn"):
        while True:
            time.sleep(3600)
    if fault == "segfault":
        os.kill(os.getpid(), signal.SIGSEGV)
    if fault == "oom_kill":
        os.kill(os.getpid(), signal.SIGKILL)


def late_collective(delay_s: float) -> None:
    """A psum over this process's devices whose device 0 first sleeps `delay_s` in a host callback
    (the "xla_abort" fault; the retired benchmarks/diag_collective_timeout.py ran it in a child process)."""
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(jax.local_devices(), ("x",))

    def late(i):
        if int(i[0]) == 0:
            time.sleep(delay_s)
        return i

    def total(a):
        i = jax.pure_callback(late, jax.ShapeDtypeStruct((1,), jnp.int32), jax.lax.axis_index("x")[None])
        return jax.lax.psum(a + i.astype(a.dtype), "x")

    step = jax.jit(jax.shard_map(total, mesh=mesh, in_specs=P("x"), out_specs=P()))
    step(jax.device_put(jnp.zeros(mesh.size), NamedSharding(mesh, P("x")))).block_until_ready()


def _stubborn(trial_dir: str) -> None:
    import stat
    import subprocess

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    pipes = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if stat.S_ISFIFO(os.fstat(int(name)).st_mode):
                pipes.append(int(name))
        except OSError:
            pass
    child = subprocess.Popen(["sleep", "600"], pass_fds=pipes, start_new_session=True, stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(os.path.join(trial_dir, "stubborn_child.pid"), "w") as f:
        f.write(str(child.pid))


def _peak(plan, cfg: TrainConfig) -> dict:
    try:
        value, source = flops_lib.peak_flops_per_device(plan.device_kind, plan.platform, jax.local_device_count(),
                                                       cfg.model.dtype)
    except ValueError as e:
        return {"value": None, "source": str(e)}
    return {"value": float(value), "source": source}


def predicted_figures(program) -> tuple[Prediction | None, str | None]:
    """(the roofline's prediction, None) of a trial that will also be measured, so that reports
    can set predicted against measured (search/planning/plans.py trained, search/planning/roofline/);
    (None, why) when this device has no figures (e.g. an unknown peak): the trial goes on."""
    try:
        return predict(program, hardware_for(jax.devices())), None
    except Exception as e:
        return None, describe(e)


def measured_of(result) -> Measured:
    f = result.final
    if f is None:
        return Measured(eval_loss=result.eval_loss, steps=int(result.steps_run))
    return Measured(loss=finite_or_none(f.loss), eval_loss=finite_or_none(result.eval_loss),
                    mfu=finite_or_none(f.mfu), hfu=finite_or_none(f.hfu),
                    tokens_per_sec=finite_or_none(f.tokens_per_sec), step_time=finite_or_none(f.step_time),
                    peak_bytes=int(f.measured_peak_bytes) or None, steps=int(result.steps_run),
                    dropped_fraction=finite_or_none(f.dropped_fraction),  # None for a dense model
                    load_balance_loss=finite_or_none(f.load_balance_loss))


def environment() -> dict:
    """What this worker runs on (stored with every trial)."""
    from importlib import metadata

    def version(pkg):
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return None

    dev = jax.devices()[0]
    return {"jax": jax.__version__, "jaxlib": version("jaxlib"), "libtpu": version("libtpu"),
            "device_kind": dev.device_kind, "platform": dev.platform, "num_devices": jax.device_count(),
            "local_devices": jax.local_device_count(), "process_count": jax.process_count(),
            "xla_flags": os.environ.get("XLA_FLAGS", ""), "libtpu_init_args": os.environ.get("LIBTPU_INIT_ARGS", ""),
            "flag_set": os.environ.get(flagsets.SET_ENV, "default")}


def initialize(dist: dict | None, cache_dir: str | None) -> None:
    """Once per worker process, before any device is touched."""
    if dist:
        distributed.maybe_initialize(DistributedConfig(**dist))
    if cache_dir:
        os.makedirs(cache_dir, exist_ok=True)
        jax.config.update("jax_compilation_cache_dir", cache_dir)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)

"""One trial inside a worker process: static checks -> plan -> memory screen -> steering
(search/steer.py) -> short training.

Runs with JAX already configured for this process (see worker_proc). Returns a JSON-able
result; failures are typed from exception classes (and XLA status codes), never from text.
"""
from __future__ import annotations

import dataclasses
import math
import os
import signal
import time
from typing import Callable

import jax

from ..trainer import distributed, flagsets, flops as flops_lib, mesh as mesh_lib, remat as remat_lib, topology
from ..trainer.config import DistributedConfig, TrainConfig
from ..trainer.errors import ConfigError, DataError, NonFiniteLoss
from ..trainer.plan import build_program
from ..trainer.train import train
from . import configio, failures, steer


class TrialFailure(Exception):
    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def _is_oom(e: BaseException) -> bool:
    return isinstance(e, MemoryError) or topology.is_resource_exhausted(e)


def _msg(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:500]}" if text else type(e).__name__


def default_memory_budget() -> tuple[int, str]:
    """Per-device bytes a plan may use when no budget is given, and where it comes from."""
    dev = jax.local_devices()[0]
    try:
        stats = dev.memory_stats() or {}
    except Exception:
        stats = {}
    if stats.get("bytes_limit"):
        return int(stats["bytes_limit"]), "device bytes_limit"
    import psutil
    total = psutil.virtual_memory().total
    return int(total // jax.local_device_count()), "host RAM / local devices"


def trial_config(job: dict) -> TrainConfig:
    cfg = configio.build(configio.loads(job["config"]))
    started = os.environ.get(flagsets.SET_ENV, "default")
    platform = "tpu" if job.get("plan_target") else jax.devices()[0].platform
    if cfg.flags != started or not flagsets.applied(cfg.flags, os.environ, platform):
        raise ConfigError(f"the trial needs compiler flag set {cfg.flags!r} and this worker was started with "
                          f"{started!r}; flags apply only before the backend starts")
    dist = job.get("distributed") or {}
    cfg = dataclasses.replace(cfg, run_dir=job["trial_dir"],
                              log=dataclasses.replace(cfg.log, progress=False),
                              distributed=DistributedConfig(**dist) if dist else cfg.distributed)
    if job.get("fault") == "nan":  # fault injection (tests): a learning rate that must diverge
        cfg = dataclasses.replace(cfg, optimizer=dataclasses.replace(cfg.optimizer, peak_lr=1e9, warmup_steps=1,
                                                                     clip_norm=1e9))
    return cfg


_PLAN_DEVICES: dict[str, list] = {}


def run_plan(job: dict) -> dict:
    """A plan-only trial (job["plan_target"], e.g. "tpu:v5e-16"): compile the step for the
    target's devices (compile-only TPU devices on this CPU) and never run it. Every figure
    but the compiled memory is a roofline prediction (search/targets.py)."""
    from . import targets

    t0 = time.perf_counter()
    out: dict = {"type": "result", "counters": {"train_calls": 0, "steps_run": 0}, "timings": {},
                 "plan": None, "measured": None, "pruned": False, "predicted": True}
    target = targets.parse_target(job["plan_target"])  # checked by the driver already
    try:
        cfg = trial_config(job)
        target = target.for_config(cfg)  # slices=auto: prod(mesh.dcn) slices for this trial
        if target.name not in _PLAN_DEVICES:  # loading the topology is once per worker
            _PLAN_DEVICES[target.name] = targets.target_devices(target)
        outcome = targets.outcome_of(cfg, target, _PLAN_DEVICES[target.name], job.get("memory_budget"))
    except ConfigError as e:
        outcome = {"status": "invalid", "error": str(e), "plan": None}
    except Exception as e:  # libtpu failing to load, a topology it does not know
        outcome = {"status": "compile_error", "error": _msg(e), "plan": None}
    out.update(plan_result(outcome, target, job.get("memory_budget")))
    if out["plan"] is not None and not target.slices_auto:  # the compiler refused: still name the target
        out["plan"].setdefault("target", target.name)
        out["plan"].setdefault("num_slices", target.num_slices)
    out["timings"] = {"plan_s": time.perf_counter() - t0, "train_s": 0.0, "worker_s": time.perf_counter() - t0}
    return out


def plan_result(outcome: dict, target, budget: int | None) -> dict:
    """The result fields of a plan outcome (targets.outcome_of) for the driver's records."""
    from .targets import plan_result_fields

    kinds = {"planned": None, "predicted_oom": failures.PREDICTED_OOM, "invalid": failures.INVALID,
             "compile_error": failures.COMPILE_ERROR}
    plan, oom = outcome.get("plan"), outcome.get("oom")
    if plan is None and oom:  # the compiler refused: the bytes it named stand for the peak
        plan = {"peak_bytes": oom.get("required_bytes") or oom.get("available_bytes"), "predicted": True,
                "peak_bytes_source": f"RESOURCE_EXHAUSTED ({oom.get('source')})",
                "hbm_bytes": target.hbm_bytes_per_device}
    res: dict = {"plan": plan, **plan_result_fields(target, budget)}
    if outcome["status"] != "planned":
        res["failure_kind"], res["failure_message"] = kinds[outcome["status"]], outcome.get("error") or ""
    return res


def run_trial(job: dict, report: Callable[[dict], bool]) -> dict:
    """Run one job; `report(metrics)` relays an intermediate result and returns True to stop."""
    if job.get("plan_target"):
        return run_plan(job)
    counters = {"train_calls": 0, "steps_run": 0}
    timings = {"plan_s": 0.0, "train_s": 0.0}
    out: dict = {"type": "result", "counters": counters, "timings": timings, "plan": None,
                 "measured": None, "pruned": False}
    t0 = time.perf_counter()
    try:
        cfg = trial_config(job)
        _inject(job.get("fault"))
        # static checks (no compilation)
        try:
            mesh_lib.check_config(cfg, jax.device_count(), jax.process_count())
            remat_lib.check_policy(cfg.remat, jax.devices()[0].platform)
        except ConfigError as e:
            raise TrialFailure(failures.INVALID, str(e)) from None
        # plan: compile ahead of time
        tp = time.perf_counter()
        try:
            program = build_program(cfg, count_flops=job.get("count_flops", True), keep_hlo=True)
        except ConfigError as e:
            raise TrialFailure(failures.INVALID, str(e)) from None
        except Exception as e:
            kind = failures.PREDICTED_OOM if _is_oom(e) else failures.COMPILE_ERROR
            raise TrialFailure(kind, _msg(e)) from None
        finally:
            timings["plan_s"] = time.perf_counter() - tp
        plan = program.plan
        budget, budget_source = (job["memory_budget"], "setting") if job.get("memory_budget") else default_memory_budget()
        out["plan"] = plan_dict(plan)
        out["plan"].update(predicted_figures(program))
        out["memory_budget"] = {"bytes": int(budget), "source": budget_source}
        out["peak_flops"] = _peak(plan, cfg)
        if plan.peak_bytes > budget:
            raise TrialFailure(failures.PREDICTED_OOM,
                               f"predicted {plan.peak_bytes:,} bytes per device exceeds the budget "
                               f"of {int(budget):,} bytes ({budget_source})")
        out["steered"] = _steered(job.get("steer"), out["plan"])
        if out["steered"]:  # predicted dominated by a finished trial: compiled, never trained
            out["pruned"] = True
            timings["worker_s"] = time.perf_counter() - t0
            return out
        # short training
        pruned = {"stop": False}

        def on_metrics(sm) -> bool:
            stop = bool(report({"step": sm.step, "loss": sm.loss, "mfu": sm.mfu, "step_time": sm.step_time}))
            pruned["stop"] = pruned["stop"] or stop
            return stop

        tt = time.perf_counter()
        counters["train_calls"] += 1
        try:
            result = train(cfg, on_metrics, program=program, resume=False)
        except NonFiniteLoss as e:
            counters["steps_run"] = int(getattr(e, "step", 0))
            raise TrialFailure(failures.NAN_LOSS, str(e)) from None
        except (ConfigError, DataError) as e:
            raise TrialFailure(failures.INVALID, _msg(e)) from None
        except Exception as e:
            raise TrialFailure(failures.RUNTIME_OOM if _is_oom(e) else failures.CRASH, _msg(e)) from None
        finally:
            timings["train_s"] = time.perf_counter() - tt
        counters["steps_run"] = int(result.steps_run)
        out["measured"] = measured_dict(result)
        out["pruned"] = bool(pruned["stop"] and result.stopped_early and result.steps_run < cfg.steps)
        out["intermediate"] = [[m.step, m.loss] for m in result.history]
    except TrialFailure as f:
        out["failure_kind"], out["failure_message"] = f.kind, str(f)
    except Exception as e:  # anything else the harness did not foresee: the study goes on
        out["failure_kind"], out["failure_message"] = failures.CRASH, _msg(e)
    timings["worker_s"] = time.perf_counter() - t0
    return out


def _steered(job_steer: dict | None, plan: dict) -> dict | None:
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


def _inject(fault: str | None) -> None:
    """Fault injection for tests (a hidden study setting, never set by users)."""
    if fault == "hang":
        while True:
            time.sleep(3600)
    if fault == "segfault":
        os.kill(os.getpid(), signal.SIGSEGV)
    if fault == "oom_kill":
        os.kill(os.getpid(), signal.SIGKILL)


def _peak(plan, cfg: TrainConfig) -> dict:
    try:
        value, source = flops_lib.peak_flops_per_device(plan.device_kind, plan.platform, jax.local_device_count(),
                                                       cfg.model.dtype)
    except ValueError as e:
        return {"value": None, "source": str(e)}
    return {"value": float(value), "source": source}


def plan_dict(plan) -> dict:
    mem = plan.memory
    return {"peak_bytes": int(plan.peak_bytes), "argument_bytes": int(mem.argument_bytes),
            "output_bytes": int(mem.output_bytes), "temp_bytes": int(mem.temp_bytes),
            "xla_flops_per_step": float(plan.xla_flops_per_step),
            "model_flops_per_step": float(plan.model_flops_per_step), "param_count": int(plan.param_count),
            "compile_seconds": float(plan.compile_seconds), "global_batch": int(plan.global_batch),
            "mesh_shape": dict(plan.mesh_shape), "predicted_step_time": None, "predicted_mfu": None}


def predicted_figures(program) -> dict:
    """The roofline's predicted step time and MFU of a trial that will also be measured, so
    that reports can set predicted against measured (search/targets.py, trainer/roofline/)."""
    from . import targets

    devices = jax.devices()
    platform = devices[0].platform
    target = targets.Target(f"{platform}:{len(devices)}", platform, len(devices))
    try:
        figures = targets.predictions(program, target, devices)
    except Exception as e:  # no figures for this device (e.g. an unknown peak): the trial goes on
        return {"roofline": {"predicted": True, "error": _msg(e)}}
    keys = ("predicted_step_time", "predicted_mfu", "predicted_tokens_per_sec", "roofline")
    return {k: figures[k] for k in keys}


def measured_dict(result) -> dict:
    f = result.final
    if f is None:
        return {"loss": None, "eval_loss": result.eval_loss, "mfu": None, "hfu": None, "tokens_per_sec": None,
                "step_time": None, "peak_bytes": None, "steps": int(result.steps_run)}

    def num(x):
        return float(x) if x is not None and math.isfinite(float(x)) else None

    return {"loss": num(f.loss), "eval_loss": num(result.eval_loss), "mfu": num(f.mfu), "hfu": num(f.hfu),
            "tokens_per_sec": num(f.tokens_per_sec), "step_time": num(f.step_time),
            "peak_bytes": int(f.measured_peak_bytes), "steps": int(result.steps_run)}


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

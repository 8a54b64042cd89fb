"""Targets a trial is planned (and run) for: "cpu:8", "tpu:v5e-16", "tpu:v5p-128,slices=2", ...

    target = parse_target("tpu:v5e-16,slices=2")   # no JAX needed
    os.environ.update(target_env(target))          # before JAX is imported (worker process)
    plan = plan_trial(cfg, target)                 # the trial's Plan (store/plan.py), PREDICTED figures

On a TPU target without TPU hardware, trials are compiled for the TPU topology
(jax.experimental.topologies, libtpu) and never run: `target.plan_only` is True.

plan_trial returns per-device memory from XLA's compiler (memory_analysis of the compiled
step), `fits` against the chip's HBM, and a roofline prediction of step time and MFU from
the optimized HLO (trainer/roofline/; every predicted figure is under a `predicted_` key
or in the "roofline" dict, which carries "predicted": True). A plan over capacity comes
back with fits=False (the caller marks the trial predicted_oom with the numbers); a step the
TPU compiler itself refuses for memory raises trainer.topology.PredictedOOM (typed, with
required and available bytes).

Planning a space is `paxsearch run` on a plan-only target: the driver settles what it
can without compiling (search/planning/screen.py: analytic pre-screen, duplicates, larger
batches of a refused point), worker processes compile the rest in parallel with the
target's environment (target_env) set before JAX is imported, one compile per point
(FLOPs are counted from the optimized HLO with loop trip counts, trainer/roofline/, so
the two unrolled FLOP probes of plan(count_flops=True) are not needed).
"""
# trainer.mesh and trainer.plan import JAX: they are imported inside the functions that need them,
# so that the driver, which parses targets and keys plans, never starts JAX.
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import time
from dataclasses import dataclass
from typing import Sequence

from ...store.compiler import package_version
from ...store.plan import Plan
from ...trainer import flops as flops_lib
from ...trainer import gpu_topology as gpu_topo
from ...trainer import hardware
from ...trainer import topology as topo
from ...trainer.config import MESH_AXES, compact_shape, full_shape
from ...trainer.errors import ConfigError
from ...trainer.flagsets import with_device_count
from ...trainer.predict import hardware_for, predict
from ...trainer.state_memory import dtype_bytes, train_state_bytes
from ..errors import UserError
from . import plans

PLATFORMS = ("cpu", "tpu", "gpu")


class TargetError(UserError, ValueError):
    """The target text cannot be used (one line for the user)."""


@dataclass(frozen=True)
class Target:
    name: str  # canonical text, e.g. "tpu:v5e-16,slices=2"
    platform: str  # "cpu" | "tpu" | "gpu"
    num_devices: int  # all slices together
    num_slices: int = 1
    plan_only: bool = False  # compiled for, never run (a TPU target without TPUs, gpu:h100x8 without GPUs)
    hbm_bytes_per_device: int | None = None  # None: ask the device (or no limit on CPU)
    chip: str | None = None  # "v5e" (TPU targets), "h100" (GPU node targets)
    slice_name: str | None = None  # "v5e-16" (TPU targets)
    # "tpu:v5e-256,slices=auto": the slice count is each trial's own, prod(mesh.dcn) slices of
    # `slice_name` (plan-only targets); num_devices / num_slices are then one slice's until
    # for_config gives the trial's concrete target
    slices_auto: bool = False

    @property
    def text(self) -> str:
        return self.name

    def for_config(self, cfg) -> "Target":
        """The concrete target one trial of `cfg` (a TrainConfig) is planned on: this target,
        or for slices=auto prod(cfg.mesh.dcn) slices of its slice type ("tpu:v5e-256,slices=2").
        ConfigError when the config's DCN shape cannot name a slice count."""
        if not self.slices_auto:
            return self
        dcn = tuple(cfg.mesh.dcn)
        if len(full_shape(dcn)) != len(MESH_AXES) or not all(isinstance(d, int) and d >= 1 for d in dcn):
            raise ConfigError(f"target {self.name} takes each trial's slice count from mesh.dcn, which must be "
                              f"{len(MESH_AXES)} positive integers ({', '.join(MESH_AXES)}) or 3 (data, fsdp, "
                              f"tensor), got dcn={dcn}")
        slices = math.prod(dcn)
        return dataclasses.replace(self, name=f"tpu:{self.slice_name}" + (f",slices={slices}" if slices > 1 else ""),
                                   num_devices=self.num_devices * slices, num_slices=slices, slices_auto=False)

    def devices_per_process(self, processes: int) -> int:
        """Devices each of `processes` processes of one trial holds (TargetError if they do not split)."""
        if self.plan_only and processes != 1:
            raise TargetError(f"target {self.name} is planned (compiled only) in one process; "
                              "drop --processes or set processes=1")
        if processes < 1 or self.num_devices % processes:
            raise TargetError(f"target {self.name} has {self.num_devices} devices, which do not split over "
                              f"{processes} processes; use a process count dividing {self.num_devices}")
        return self.num_devices // processes


def parse_target(text: str) -> Target:
    """'cpu:8', 'gpu:8', 'tpu:v5e-16', 'tpu:v5p-128', 'tpu:v4-32', 'tpu:v6e-256' (a v4 / v5p slice
    may name another topology: 'tpu:v5p-1024@4x8x16', trainer/topology.parse_slice), with
    ',slices=N' for N slices over DCN, or ',slices=auto' (plan-only TPU targets) for a slice
    count that each trial's mesh.dcn gives (Target.for_config). TargetError (one line) for
    anything else."""
    raw = str(text).strip()
    head, *opts = [p.strip() for p in raw.split(",")]
    m = re.fullmatch(r"(cpu|gpu|tpu)\s*:\s*(\S+)", head.lower())
    if not m:
        raise TargetError(f"unknown target {raw!r}; use cpu:N, gpu:N or tpu:<slice> "
                         "(e.g. cpu:8, tpu:v5e-16, tpu:v5p-128,slices=2)")
    platform, what = m.group(1), m.group(2)
    slices, auto = 1, False
    for opt in opts:
        om = re.fullmatch(r"slices\s*=\s*(\d+|auto)", opt.lower())
        if not om:
            raise TargetError(f"target {raw!r}: unknown option {opt!r}; the only option is slices=N or slices=auto")
        auto = om.group(1) == "auto"
        slices = 1 if auto else int(om.group(1))
    if slices < 1:
        raise TargetError(f"target {raw!r}: slices must be >= 1")
    suffix = ",slices=auto" if auto else f",slices={slices}" if slices > 1 else ""
    if platform == "gpu" and not what.isdigit():
        return _gpu_node_target(raw, what, slices, auto)
    if platform in ("cpu", "gpu"):
        if not what.isdigit() or int(what) < 1:
            raise TargetError(f"target {raw!r}: {platform}:N needs a device count N >= 1 (e.g. {platform}:8)")
        if auto:
            raise TargetError(f"target {raw!r}: slices=auto applies to TPU targets planned without TPUs "
                              f"(e.g. tpu:v5e-256,slices=auto); a {platform} trial runs on the devices it has")
        if slices > 1:
            raise TargetError(f"target {raw!r}: slices=N applies to TPU targets only")
        return Target(f"{platform}:{int(what)}", platform, int(what))
    try:
        tpu_slice = topo.parse_slice(what)
    except ConfigError as e:
        raise TargetError(f"target {raw!r}: {e}") from None
    chip = tpu_slice.chip
    target = Target(f"tpu:{tpu_slice.name}{suffix}", "tpu", tpu_slice.chips * slices, slices,
                    plan_only=not topo.has_tpu_hardware(), hbm_bytes_per_device=chip.hbm_bytes,
                    chip=chip.name, slice_name=tpu_slice.name, slices_auto=auto)
    check_auto_slices(target)
    return target


def _gpu_node_target(raw: str, what: str, slices: int, auto: bool) -> Target:
    """'gpu:h100x8': one node of 8 H100s. Without GPUs here it is plan-only, compiled for the
    node without a GPU (trainer/gpu_topology.py) or, without the CUDA plugin, planned analytically."""
    if auto or slices > 1:
        raise TargetError(f"target {raw!r}: slices= applies to TPU targets; plan one GPU node (e.g. gpu:h100x8)")
    try:
        node = gpu_topo.parse_node(what)
    except ConfigError as e:
        raise TargetError(f"target {raw!r}: {e}") from None
    spec = node.spec
    return Target(f"gpu:{node.name}", "gpu", node.count, plan_only=not gpu_topo.has_gpu_hardware(),
                  hbm_bytes_per_device=int(spec.hbm_usable_bytes.value), chip=node.chip, slice_name=node.name)


def planning_notice(target: Target) -> str | None:
    """The one line a plan-only target gets when it cannot be compiled here and is planned
    analytically instead (a GPU node without the CUDA plugin); None when it compiles."""
    if target.platform == "gpu" and target.plan_only and not gpu_topo.plugin_available():
        return gpu_topo.missing_plugin_line(gpu_topo.parse_node(target.slice_name or ""))
    return None


def compile_only_slice(target: Target) -> str | None:
    """The TPU slice a plan-only TPU target compiles for (flagsets.validate loads its topology); None otherwise."""
    return target.slice_name if target.plan_only and target.platform == "tpu" else None


def check_auto_slices(target: Target) -> None:
    """slices=auto plans each trial on its own slice count, so it needs a plan-only target:
    with TPUs attached, a trial runs on the slices this job has (TargetError, one line)."""
    if target.slices_auto and not target.plan_only:
        raise TargetError(f"target {target.name}: slices=auto plans each trial on prod(mesh.dcn) slices, and this "
                          f"machine has TPUs attached, where a trial runs on the slices the job has; use "
                          f"tpu:{target.slice_name},slices=N with N the job's slice count")


def target_env(target: Target) -> dict[str, str]:
    """Environment variables a process needs for `target`, to set before JAX is imported."""
    env = {"TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "3")}
    if target.platform == "cpu":
        env.update(JAX_PLATFORMS="cpu", XLA_FLAGS=with_device_count(os.environ.get("XLA_FLAGS"), target.num_devices))
    elif target.platform == "gpu" and target.plan_only:
        env["JAX_PLATFORMS"] = "cpu"  # compile-only GPU devices need no GPU backend (trainer/gpu_topology.py)
    elif target.platform == "tpu" and target.plan_only:
        # compile-only TPU devices need no TPU backend: stay on CPU, and answer libtpu's
        # questions so it does not warn (trainer.topology._quiet_libtpu_env)
        env["JAX_PLATFORMS"] = "cpu"
        for key, value in topo.compile_only_env(topo.parse_slice(target.slice_name)).items():
            env[key] = os.environ.get(key, value)
    return env


def apply_env(target: Target) -> None:
    """Set target_env(target) in this process (call before importing JAX)."""
    os.environ.update(target_env(target))


def check_available(target: Target) -> None:
    """Raise LibtpuMissing (one line) when a TPU target cannot be compiled here."""
    if target.platform == "tpu":
        topo.require_libtpu()


def target_devices(target: Target) -> list:
    """The devices of `target` (call after the process environment is set):
    cpu/gpu -> jax.devices(platform); tpu -> the attached TPUs, or without TPU hardware the
    compile-only devices of the topology."""
    if target.slices_auto:
        raise ConfigError(f"target {target.name} has no devices of its own: each trial's are those of "
                          "target.for_config(cfg)")
    if target.platform == "tpu":
        check_available(target)
        if not target.plan_only:
            import jax

            devices = jax.devices("tpu")
        else:
            devices = topo.topology_devices(target.slice_name, target.num_slices)
    elif target.platform == "gpu" and target.plan_only:
        devices = gpu_topo.node_devices(gpu_topo.parse_node(target.slice_name or ""))
    else:
        import jax

        devices = jax.devices(target.platform)
    if len(devices) < target.num_devices:
        raise ConfigError(f"target {target.name} needs {target.num_devices} devices, this process has "
                          f"{len(devices)}; set the device count before JAX starts (target_env)")
    return list(devices)[:target.num_devices]


# ----------------------------------------------------------------------------- memory

def memory_limit(hbm_bytes: int | None, budget_bytes: int | None) -> tuple[int | None, str]:
    """The per-device bytes a plan must fit in, and what they are: the chip's usable HBM, or
    a smaller memory budget. (None, "") when neither is known."""
    if budget_bytes and (not hbm_bytes or budget_bytes < hbm_bytes):
        return int(budget_bytes), "memory budget"
    return (int(hbm_bytes), "usable HBM") if hbm_bytes else (None, "")


def plan_result_fields(target: Target, budget_bytes: int | None) -> dict:
    """The result fields every plan-only trial of `target` carries, compiled or not: the
    memory budget it was held against, and the target's device and peak (not the worker's
    CPU)."""
    limit, what = memory_limit(target.hbm_bytes_per_device, budget_bytes)
    out: dict = {"memory_budget": {"bytes": limit, "source": "setting" if what == "memory budget" else "chip HBM"}
                 if limit else None}
    entry = hardware.TABLE.get(target.chip or "")
    if entry is not None:
        out["device"] = {"device_kind": entry.device_kinds[0], "platform": target.platform,
                         "num_devices": target.num_devices}
        peak = entry.peak_bf16_flops
        out["peak_flops"] = {"value": peak.value, "source": f"trainer/hardware.py: {peak.source}"}
    return out


# ----------------------------------------------------------------------------- one plan

PLAN_COMPILE_ENV = "PAXSEARCH_PLAN_COMPILE"  # the study's plan_compile, for its workers


def use_plan_compile(setting: str) -> None:
    """Apply a study's `plan_compile` setting ("passes" or "full") to this process and the
    workers it starts."""
    os.environ[PLAN_COMPILE_ENV] = setting


# The libtpu versions on which plans from the HLO passes were proven equal to the full compile on every
# published row (benchmarks/bench_plan_method.py; benchmarks/RESULTS.md, "Plans from the HLO passes").
# Under 0.0.42.1 they are not: the passes' buffer assignment held 18-50% fewer temporaries than the
# full compile's (RESULTS, "v6e measured"); another version compiles in full until it is proven.
PASSES_PROVEN_LIBTPU = ("0.0.52",)


def _passes_apply(target: Target, environ=None) -> bool:
    setting = (os.environ if environ is None else environ).get(PLAN_COMPILE_ENV, "passes")
    return setting != "full" and target.platform == "tpu" and target.plan_only and not topo.has_tpu_hardware()


def libtpu_unproven_line(libtpu: str | None = None) -> str | None:
    """One line when the installed libtpu (or `libtpu`, a version) is not one the HLO passes were
    proven on (PASSES_PROVEN_LIBTPU); None when it is, or when there is no libtpu."""
    libtpu = libtpu if libtpu is not None else package_version("libtpu")
    if libtpu is None or libtpu in PASSES_PROVEN_LIBTPU:
        return None
    return (f"libtpu {libtpu}: plans from the HLO passes are proven equal to the full compile on libtpu "
            f"{', '.join(PASSES_PROVEN_LIBTPU)} only (under 0.0.42 they held 18-50% fewer temporaries), so TPU "
            f"plans compile in full here (exact, slower); install libtpu=={PASSES_PROVEN_LIBTPU[-1]} for plans in "
            "seconds")


def plan_method_notice(target: Target, environ=None, libtpu: str | None = None) -> str | None:
    """The one line a plan-only TPU target gets when its plans compile in full only because of the
    installed libtpu (libtpu_unproven_line); None otherwise."""
    return libtpu_unproven_line(libtpu) if _passes_apply(target, environ) else None


def plan_method(target: Target, environ=None, libtpu: str | None = None) -> str:
    """How a plan of `target` is made here: "hlo_passes" (compile-only TPU devices with a libtpu the
    passes were proven on, unless plan_compile is "full": trainer/hlo_passes.py) or "compiled" (a full
    compile)."""
    return ("hlo_passes" if _passes_apply(target, environ) and libtpu_unproven_line(libtpu) is None
            else "compiled")


def compile_for_target(cfg, target: Target, devices: Sequence | None = None, phases: dict | None = None):
    """(Program, Plan) of `cfg` compiled for `target`; (None, analytic_plan) where XLA cannot
    compile for the target here (planning_notice). Raises PredictedOOM when the TPU
    compiler refuses the step for memory, ConfigError when the config cannot run there.
    `phases`, when given, gets the seconds of each phase (PlanResult.phases and predict_s).
    The plan's plan_method says how it was made (plan_method); where the HLO passes give no
    plan, the step is compiled in full and its plan_method_note says why."""
    from ...trainer.hlo_passes import PassesError, build_plan_program
    from ...trainer.plan import build_program

    target = target.for_config(cfg)  # slices=auto: this trial's own slice count
    if planning_notice(target) is not None:  # cannot compile for it here: the analytic plan, no Program
        return None, analytic_plan(cfg, target)
    devices = list(devices) if devices is not None else target_devices(target)
    method, note = plan_method(target), plan_method_notice(target)
    try:
        if method == "hlo_passes":
            try:
                program = build_plan_program(cfg, devices, target.slice_name or "", target.num_slices)
            except PassesError as e:
                method, note = "compiled", f"the HLO passes gave no plan ({e}); compiled in full"
        if method == "compiled":
            program = build_program(cfg, devices, count_flops=False, keep_hlo=True)
    except ConfigError:
        raise
    except Exception as e:
        oom = e if isinstance(e, topo.PredictedOOM) else topo.predicted_oom_from(e, target.hbm_bytes_per_device)
        if oom is None:
            raise
        oom.plan_method = method
        raise oom from None
    result = program.plan
    hbm = target.hbm_bytes_per_device or topo.bytes_limit(devices[0])
    t0 = time.perf_counter()
    prediction = predict(program, hardware_for(devices, target.chip))
    if phases is not None:
        phases.update(result.phases, predict_s=round(time.perf_counter() - t0, 3))
    # the concrete target ("tpu:v5e-256,slices=2" under slices=auto); the compiler: this process's
    return program, plans.compiled(result, prediction, target=target.name, num_slices=target.num_slices,
                                   plan_only=target.plan_only, hbm_bytes=hbm, mesh=_mesh_shapes(cfg, target),
                                   method=method, note=note)


def _mesh_shapes(cfg, target: Target) -> plans.MeshShapes:
    """The resolved ICI (within a slice) and DCN (across slices) shapes of the trial's mesh."""
    from ...trainer import mesh as mesh_lib

    ici, dcn = mesh_lib.resolve_shapes(cfg.mesh, target.num_devices)
    return tuple(ici), tuple(dcn), tuple(MESH_AXES)


def plan_trial(cfg, target: Target) -> Plan:
    """The plan of `cfg` on `target` (see compile_for_target)."""
    return compile_for_target(cfg, target)[1]


# ----------------------------------------------------------------------------- many plans

def state_bytes(cfg, target: Target) -> tuple[int, int, int, str]:
    """(bytes per device, shards, parameters, what the moments are) of what a train step keeps
    in device memory at the update: parameters, gradients and AdamW moments, without compiling.
    A lower bound of the compiled peak (activations are not counted)."""
    from ...trainer import mesh as mesh_lib

    sizes = mesh_lib.axis_sizes(cfg.mesh, target.num_devices)
    # weights: embed over fsdp x context, heads/mlp/vocab over tensor, the layers over pipeline
    # stages (so a lower bound: embeddings are not split over stage)
    shards = sizes["fsdp"] * sizes["context"] * sizes["tensor"] * sizes["stage"]
    params = flops_lib.param_count(cfg.model)
    # params + gradients + two AdamW moments (trainer/state_memory.py): ZeRO-1 shards the moments
    # over data too; offloaded moments are in host memory
    opt = cfg.optimizer
    moment_shards = shards * (sizes["data"] if opt.zero1 else 1)
    need = train_state_bytes(params, dtype_bytes(cfg.model.param_dtype), shards, moment_shards, opt.offload_state)
    moments = ("AdamW moments (offloaded: not counted)" if opt.offload_state else
               f"AdamW moments (ZeRO-1: over {moment_shards} shards)" if opt.zero1 else "AdamW moments")
    return need, shards, params, moments


def prescreen(cfg, target: Target, limit_bytes: int | None = None) -> topo.PredictedOOM | None:
    """A PredictedOOM when parameters, gradients and AdamW moments alone exceed the HBM of
    one device (or `limit_bytes`, when smaller), without compiling; None when the point may
    fit. Call it on a point that passed trainer.validate.check (the driver's static checks)."""
    target = target.for_config(cfg)
    hbm, what = memory_limit(target.hbm_bytes_per_device, limit_bytes)
    if hbm is None:
        return None
    need, shards, params, moments = state_bytes(cfg, target)
    if need <= hbm:
        return None
    return topo.PredictedOOM(
        f"predicted OOM (analytic, not compiled): {params:,} parameters with gradients and {moments} "
        f"need {need / topo.GiB:.2f} GiB per device over fsdp x context x tensor x stage = {shards} shards, above "
        f"{hbm / topo.GiB:.2f} GiB {what}", need, hbm, "analytic")


def analytic_plan(cfg, target: Target) -> Plan:
    """The plan of `cfg` on `target` without compiling (a GPU node where XLA cannot compile for
    it: planning_notice): memory is state_bytes' lower bound (parameters, gradients, AdamW
    moments; no activations), FLOPs the model's (trainer/flops.py), and the step time those
    FLOPs at the chip's rates (peak x measured matmul efficiency; the causal attention's at the
    attention kernels' measured efficiency, trainer/hardware.py), with no memory-bound work and no
    communication: an optimistic bound, labelled analytic."""
    from ...trainer import mesh as mesh_lib

    target = target.for_config(cfg)
    entry = hardware.spec(target.chip or "")
    need, shards, params, moments = state_bytes(cfg, target)
    batch = mesh_lib.global_batch_size(cfg, target.num_devices)
    model_flops = float(flops_lib.model_flops_per_step(cfg.model, batch))
    attention = float(flops_lib.attention_flops_per_step(cfg.model, batch))
    peak = entry.peak_bf16_flops.value
    attention_eff = (entry.attention_efficiency or entry.matmul_efficiency).value
    step = ((model_flops - attention) / (peak * entry.matmul_efficiency.value)
            + attention / (peak * attention_eff)) / target.num_devices
    hbm = target.hbm_bytes_per_device
    return plans.analytic(
        target=target.name, num_slices=target.num_slices, plan_only=target.plan_only, peak_bytes=need,
        hbm_bytes=hbm, peak_bytes_source=f"lower bound: {params:,} parameters, gradients and {moments} over {shards} "
                                         "shards (no activations)",
        param_count=params, global_batch=batch, num_devices=target.num_devices, model_flops_per_step=model_flops,
        tokens_per_step=batch * cfg.model.seq_len, device_kind=entry.device_kinds[0], platform=target.platform,
        mesh=_mesh_shapes(cfg, target), peak_flops_per_device=peak, step_time=step,
        roofline={"predicted": True, "hardware": entry.name, "method": "analytic", "compute_s": step,
                  "step_time_s": step,
                  "source": f"model FLOPs at {peak / 1e12:g} TFLOP/s x matmul efficiency "
                            f"{entry.matmul_efficiency.value:g}, their causal attention at x attention "
                            f"efficiency {attention_eff:g}; trainer/hardware.py: "
                            f"{entry.peak_bf16_flops.source}; {entry.matmul_efficiency.source}"},
        plan_notice=planning_notice(target))


def plan_keys(cfg, target: Target) -> tuple[str, str, int]:
    """(plan key, shape key, global batch). Points with the same plan key compile to the same
    step: model, resolved mesh, sharding rules, global batch, remat, flag set, memory knobs and
    pipeline on the same target (optimizer numbers, steps, seeds, data and logging do not change
    the compiled program's memory or FLOPs: the batch always carries segment ids and positions,
    and AdamW with clipping is the one optimizer). Points
    with the same shape key differ at most in their global batch, and a step's memory does
    not shrink as its batch grows: a batch that cannot fit rules out every larger one."""
    from ...trainer import mesh as mesh_lib

    target = target.for_config(cfg)  # slices=auto: keyed by the trial's concrete target
    ici, dcn = mesh_lib.resolve_shapes(cfg.mesh, target.num_devices)
    batch = mesh_lib.global_batch_size(cfg, target.num_devices)
    model = dataclasses.asdict(cfg.model)
    if model.get("vocab_tiles") == 1:  # the default: keys of studies made before vocab tiling stay the same
        del model["vocab_tiles"]
    # compact_shape: a mesh without stage or context keys as the 3-entry shape earlier releases
    # stored, so a resumed study still finds their plans
    key = {"target": target.name, "model": model, "ici": list(compact_shape(ici)), "dcn": list(compact_shape(dcn)),
           "remat": cfg.remat}
    if cfg.mesh.rules != "default":  # activation sharding changes the compiled step; keyed only when set
        key["rules"] = cfg.mesh.rules
    if cfg.flags != "default":  # a compiler flag set changes the compiled step
        key["flags"] = cfg.flags
    # the memory knobs change the compiled step; keyed only when set, like flags
    knobs = {"grad_accum_steps": (cfg.grad_accum_steps, 1), "zero1": (cfg.optimizer.zero1, False),
             "offload_state": (cfg.optimizer.offload_state, False), "offload_params": (cfg.offload_params, False)}
    key.update({k: v for k, (v, default) in knobs.items() if v != default})
    pipeline = dataclasses.asdict(cfg.pipeline)
    if pipeline != dataclasses.asdict(type(cfg.pipeline)()):  # microbatches, repeats, schedule
        key["pipeline"] = pipeline

    def digest(d: dict) -> str:
        return hashlib.sha1(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]

    return digest({**key, "global_batch": batch}), digest(key), batch


def plan_key(cfg, target: Target) -> str:
    """See plan_keys."""
    return plan_keys(cfg, target)[0]

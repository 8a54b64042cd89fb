"""Targets a trial is planned (and run) for: "cpu:8", "tpu:v5e-16", "tpu:v5p-128,slices=2", ...

    target = parse_target("tpu:v5e-16,slices=2")   # the grammar: no JAX needed
    os.environ.update(target_env(target))          # before JAX is imported (worker process)
    devices = target_devices(target)               # the target's devices (compile-only ones without TPUs)

On a TPU target without TPU hardware, trials are compiled for the TPU topology
(jax.experimental.topologies, libtpu) and never run: `target.plan_only` is True.

The rest of planning one point lives beside this module: how it is compiled here (method.py:
the HLO passes or a full compile, by the installed libtpu), the compile itself and its
prediction (compilation.py plan_point: the one call that plans a point), the plan without
compiling (analytic.py) and the key of points that compile to the same step (keys.py).
Importing this module starts no JAX: the driver parses targets with it.
"""
# trainer.mesh imports JAX: it is imported inside the functions that need it, so that the driver,
# which parses targets, never starts JAX.
from __future__ import annotations

import dataclasses
import math
import os
import re
from dataclasses import dataclass

from ...trainer import hardware
from ...trainer.config import MESH_AXES, full_shape
from ...trainer.errors import ConfigError
from ...trainer.flagsets import with_device_count
from ..errors import UserError
from . import gpu_topology as gpu_topo
from . import plans
from . import topology as topo

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
    may name another topology: 'tpu:v5p-1024@4x8x16', topology.parse_slice), with
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
    node without a GPU (search/planning/gpu_topology.py) or, without the CUDA plugin, planned analytically."""
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


def flag_probe(target: Target) -> str | None:
    """The code flagsets.validate probes a flag set with for `target`: a plan-only TPU target's loads its
    topology (topology.flag_probe); None otherwise (the backend started, flagsets.START_BACKEND)."""
    if target.plan_only and target.platform == "tpu" and target.slice_name:
        return topo.flag_probe(target.slice_name)
    return None


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
        env["JAX_PLATFORMS"] = "cpu"  # compile-only GPU devices need no GPU backend (search/planning/gpu_topology.py)
    elif target.platform == "tpu" and target.plan_only:
        # compile-only TPU devices need no TPU backend: stay on CPU, and answer libtpu's
        # questions so it does not warn (search/planning/topology.py _quiet_libtpu_env)
        env["JAX_PLATFORMS"] = "cpu"
        for key, value in topo.compile_only_env(topo.parse_slice(target.slice_name or "")).items():
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
            devices = topo.topology_devices(target.slice_name or "", target.num_slices)
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


def mesh_shapes(cfg, target: Target) -> plans.MeshShapes:
    """The resolved ICI (within a slice) and DCN (across slices) shapes of the trial's mesh."""
    from ...trainer import mesh as mesh_lib

    ici, dcn = mesh_lib.resolve_shapes(cfg.mesh, target.num_devices)
    return tuple(ici), tuple(dcn), tuple(MESH_AXES)

"""Where the train state lives: ZeRO-1 sharding of AdamW's moments, and host offload.

- ZeRO-1 (OptimizerConfig.zero1): every optimizer-state array (AdamW's mu and nu) is sharded
  over the `data` axis as well, on its largest dim that divides; parameters keep their
  sharding. The step constrains the gradients the same way, so XLA reduce-scatters them
  over data, updates each shard of the moments where it lives, and all-gathers the updated
  parameters (MaxText's and Paxml's "shard optimizer state over data").
- Optimizer-state offload (OptimizerConfig.offload_state) and parameter offload
  (TrainConfig.offload_params): those arrays live in pinned host memory between steps
  (`NamedSharding.with_memory_kind("pinned_host")`); the step moves them to the device
  (jax.device_put inside the jit), computes, and its out_shardings send the new values back.
  TPU and GPU only: the CPU has no separate device memory, and the config is refused there.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from .config import TrainConfig
from .errors import ConfigError, UnsupportedOnPlatform

DATA = "data"
HOST, DEVICE = "pinned_host", "device"
OFFLOAD_PLATFORMS = ("tpu", "gpu", "cuda", "rocm")


def check(cfg: TrainConfig, data_size: int, platform: str) -> None:
    """One line when a knob cannot apply: ZeRO-1 without a data axis, offload on CPU."""
    opt = cfg.optimizer
    for where, value in (("optimizer.zero1", opt.zero1), ("optimizer.offload_state", opt.offload_state),
                         ("offload_params", cfg.offload_params)):
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false, got {value!r}")
    if opt.zero1 and data_size < 2:
        raise ConfigError(f"optimizer.zero1 shards the optimizer state over the data axis, which has size {data_size} "
                          "here; use a mesh with data > 1 or zero1=False (fsdp already shards it)")
    for where, value in (("optimizer.offload_state", opt.offload_state), ("offload_params", cfg.offload_params)):
        if value and platform not in OFFLOAD_PLATFORMS:
            raise UnsupportedOnPlatform(f"{where} needs host-memory offload, which platform {platform!r} lacks; "
                                        f"use it on TPU or GPU, or set {where}=False here")


def zero1_sharding(sh: NamedSharding, shape: tuple[int, ...]) -> NamedSharding:
    """`sh` with the data axis added to the largest dim of `shape` that still divides (as is
    when data is already used, is 1, or divides no dim)."""
    mesh = sh.mesh
    data = dict(mesh.shape).get(DATA, 1)
    spec = list(sh.spec) + [None] * (len(shape) - len(sh.spec))
    axes = [() if s is None else (s,) if isinstance(s, str) else tuple(s) for s in spec]
    if data < 2 or any(DATA in a for a in axes):
        return sh
    for d in sorted(range(len(shape)), key=lambda i: -shape[i]):
        shards = math.prod(dict(mesh.shape)[a] for a in axes[d])
        if shape[d] % (shards * data) == 0:
            axes[d] = axes[d] + (DATA,)
            new = [a if a else None for a in axes]
            return NamedSharding(mesh, P(*[a[0] if a and len(a) == 1 else a for a in new]),
                                 memory_kind=sh.memory_kind)
    return sh


@dataclasses.dataclass(frozen=True)
class Placement:
    """The state's shardings between steps (`stored`), on the device during the step
    (`device`, None when nothing is offloaded), and the gradients' (None: as the params)."""

    stored: dict
    device: dict | None
    grads: object | None


def place(cfg: TrainConfig, shardings: Any, abstract_state: Any) -> Placement:
    """The Placement of {params, opt_state, step} for cfg's ZeRO-1 and offload settings.
    `shardings`: the state's NamedShardings from the logical rules; `abstract_state`: its shapes."""
    opt = cfg.optimizer
    is_moment = lambda x: len(x.shape) >= 1  # AdamW's mu and nu (not its scalar count)
    sh_params, sh_opt = shardings["params"], shardings["opt_state"]
    grads = None
    if opt.zero1:
        sh_opt = jax.tree.map(lambda sh, x: zero1_sharding(sh, x.shape) if is_moment(x) else sh,
                              sh_opt, abstract_state["opt_state"])
        grads = jax.tree.map(lambda sh, x: zero1_sharding(sh, x.shape), sh_params, abstract_state["params"])
    device = {**shardings, "params": sh_params, "opt_state": sh_opt}
    if not (opt.offload_state or cfg.offload_params):
        return Placement(device, None, grads)
    stored = dict(device)
    if opt.offload_state:
        stored["opt_state"] = jax.tree.map(lambda sh, x: sh.with_memory_kind(HOST) if is_moment(x) else sh,
                                           sh_opt, abstract_state["opt_state"])
    if cfg.offload_params:
        stored["params"] = jax.tree.map(lambda sh: sh.with_memory_kind(HOST), sh_params)
    device = {k: jax.tree.map(lambda sh: sh.with_memory_kind(DEVICE), v) for k, v in device.items()}
    return Placement(stored, device, grads)

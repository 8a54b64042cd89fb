"""Device mesh over the named axes (config.MESH_AXES: data, stage, fsdp, context, tensor, expert):
ICI shape x DCN shape, and its static checks."""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh

from . import moe as moe_lib
from .config import ATTENTIONS, BLOCKS, MESH_AXES, MLPS, POSITIONS, MeshConfig, TrainConfig, full_shape
from .errors import ConfigError
from .sharding import RULE_SETS

# rows of the batch; stage splits layers, context the sequence; expert splits rows outside the MoE layers
BATCH_AXES = ("data", "fsdp", "expert")


def resolve_shapes(mesh_cfg: MeshConfig, num_devices: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """ICI and DCN shapes over MESH_AXES (a 3-entry shape read as data, fsdp, tensor:
    config.full_shape), with a -1 ICI entry filled in; raises ConfigError on mismatch."""
    ici, dcn = list(full_shape(mesh_cfg.ici)), list(full_shape(mesh_cfg.dcn))
    if len(ici) != len(MESH_AXES) or len(dcn) != len(MESH_AXES):
        raise ConfigError(f"mesh shapes need {len(MESH_AXES)} entries ({', '.join(MESH_AXES)}), 5 (no expert) or 3 "
                          f"(data, fsdp, tensor), got ici={tuple(mesh_cfg.ici)} dcn={tuple(mesh_cfg.dcn)}; "
                          "config.mesh_shape(stage=2, fsdp=-1) builds one by name")
    if any(d < 1 for d in dcn) or any(i == 0 or i < -1 for i in ici) or ici.count(-1) > 1:
        raise ConfigError(f"mesh entries must be positive (one ICI entry may be -1), got ici={ici} dcn={dcn}")
    dcn_size = math.prod(dcn)
    if -1 in ici:
        known = math.prod(i for i in ici if i != -1) * dcn_size
        if num_devices % known:
            raise ConfigError(
                f"mesh ici={tuple(ici)} x dcn={tuple(dcn)} cannot fill {num_devices} devices: "
                f"{num_devices} is not a multiple of {known}; pick shapes whose product divides the device count")
        ici[ici.index(-1)] = num_devices // known
    size = math.prod(ici) * dcn_size
    if size != num_devices:
        raise ConfigError(
            f"mesh ici={tuple(ici)} x dcn={tuple(dcn)} has {size} devices but {num_devices} are available; "
            f"make the product of the shapes equal {num_devices}")
    return tuple(ici), tuple(dcn)


def axis_sizes(mesh_cfg: MeshConfig, num_devices: int) -> dict[str, int]:
    """{axis name: ICI x DCN size} over MESH_AXES."""
    ici, dcn = resolve_shapes(mesh_cfg, num_devices)
    return {name: i * d for name, i, d in zip(MESH_AXES, ici, dcn, strict=True)}


def named_sizes(mesh) -> dict[str, int]:
    """{axis: size} of a built mesh, as a plan stores it: the expert axis left out where it is 1,
    so that a dense model's stored plan reads as before the expert axis existed."""
    sizes = dict(mesh.shape)
    if sizes.get("expert") == 1:
        del sizes["expert"]
    return sizes


def global_batch_size(cfg: TrainConfig, num_devices: int) -> int:
    """per-device batch x devices on the batch axes, or the configured global batch."""
    sizes = axis_sizes(cfg.mesh, num_devices)
    batch_devices = math.prod(sizes[a] for a in BATCH_AXES)
    if (cfg.per_device_batch is None) == (cfg.global_batch is None):
        raise ConfigError("set exactly one of per_device_batch and global_batch")
    if cfg.global_batch is not None:
        if cfg.global_batch < 1 or cfg.global_batch % batch_devices:
            axes = " x ".join(f"{a}={sizes[a]}" for a in BATCH_AXES if a != "expert" or sizes[a] > 1)
            raise ConfigError(
                f"global batch {cfg.global_batch} does not divide over the {batch_devices} devices of the batch "
                f"axes ({axes}); use a multiple of {batch_devices}")
        return cfg.global_batch
    per_device = cfg.per_device_batch
    assert per_device is not None  # exactly one of the two is set (checked above)
    if per_device < 1:
        raise ConfigError(f"per_device_batch must be >= 1, got {per_device}")
    return per_device * batch_devices


def check_config(cfg: TrainConfig, num_devices: int, process_count: int = 1) -> None:
    """Every static check that needs no compilation; raises ConfigError with one clear line."""
    m = cfg.model
    sizes = axis_sizes(cfg.mesh, num_devices)
    gb = global_batch_size(cfg, num_devices)
    t = sizes["tensor"]
    if m.n_heads % t:
        raise ConfigError(
            f"n_heads={m.n_heads} does not divide over tensor={t}; use a tensor size dividing {m.n_heads}")
    if m.d_ff % t:
        raise ConfigError(f"d_ff={m.d_ff} does not divide over tensor={t}; use a tensor size dividing {m.d_ff}")
    if m.vocab_size % t:
        raise ConfigError(
            f"vocab_size={m.vocab_size} does not divide over tensor={t}; round the vocabulary up to a multiple of {t}")
    if m.d_model % sizes["fsdp"]:
        raise ConfigError(
            f"d_model={m.d_model} does not divide over fsdp={sizes['fsdp']}; use an fsdp size dividing {m.d_model}")
    if m.d_model % (sizes["fsdp"] * sizes["context"]):  # weights' embed dim: over fsdp x context (sharding.py)
        raise ConfigError(
            f"d_model={m.d_model} does not divide over fsdp={sizes['fsdp']} x context={sizes['context']} (the "
            f"weights' embed dim is sharded over both); use sizes whose product divides {m.d_model}")
    if m.d_model % (sizes["fsdp"] * sizes["context"] * sizes["expert"]):  # ... and expert (sharding.py)
        raise ConfigError(
            f"d_model={m.d_model} does not divide over fsdp={sizes['fsdp']} x context={sizes['context']} x "
            f"expert={sizes['expert']} (the dense weights' embed dim is sharded over all three); use sizes whose "
            f"product divides {m.d_model}")
    if gb % process_count:
        raise ConfigError(f"global batch {gb} does not divide over {process_count} processes")
    for name in ("d_model", "n_layers", "n_heads", "head_dim", "d_ff", "seq_len", "vocab_size"):
        if getattr(m, name) < 1:
            raise ConfigError(f"model.{name} must be >= 1, got {getattr(m, name)}")
    if m.dtype not in ("float32", "bfloat16") or m.param_dtype not in ("float32", "bfloat16"):
        raise ConfigError(f"dtypes must be float32 or bfloat16, got dtype={m.dtype} param_dtype={m.param_dtype}")
    if m.activation not in ("gelu", "gelu_exact", "silu", "relu"):
        raise ConfigError(f"unknown activation {m.activation!r}; choose gelu, gelu_exact, silu or relu")
    _check_family(m, t)
    moe_lib.check(m, sizes)
    if cfg.mesh.rules not in RULE_SETS:
        raise ConfigError(f"unknown sharding rules {cfg.mesh.rules!r}; choose one of {', '.join(RULE_SETS)}")
    if dict(RULE_SETS[cfg.mesh.rules]).get("act_embed") == "tensor" and m.d_model % t:
        raise ConfigError(f"rules={cfg.mesh.rules!r} shards d_model={m.d_model} over tensor={t}, which does not "
                          f"divide it; use a tensor size dividing {m.d_model} or rules='default'")
    if cfg.steps < 1:
        raise ConfigError(f"steps must be >= 1, got {cfg.steps}")


def _check_family(m, tensor: int) -> None:
    """The model-family fields: names known, K/V heads grouping the query heads, RoPE pairs.
    K/V heads that do not divide over tensor are replicated over it (sharding.rules_for)."""
    for field, allowed in (("mlp", MLPS), ("block", BLOCKS), ("position", POSITIONS), ("attention", ATTENTIONS)):
        if getattr(m, field) not in allowed:
            raise ConfigError(f"unknown model.{field} {getattr(m, field)!r}; choose one of {', '.join(allowed)}")
    kv = m.kv_heads
    if not isinstance(kv, int) or kv < 1 or m.n_heads % kv:
        raise ConfigError(f"n_kv_heads={m.n_kv_heads} must divide n_heads={m.n_heads} (1 is multi-query, "
                          f"None or {m.n_heads} multi-head); pick a divisor of {m.n_heads}")
    if m.position == "rope" and m.head_dim % 2:
        raise ConfigError(f"position='rope' rotates pairs of dims and needs an even head_dim, got {m.head_dim}")
    if m.position == "rope" and not m.rope_theta > 0:
        raise ConfigError(f"rope_theta must be > 0, got {m.rope_theta}")
    if m.attention_block < 1:
        raise ConfigError(f"attention_block must be >= 1, got {m.attention_block}")


def build_mesh(mesh_cfg: MeshConfig, devices: Sequence) -> Mesh:
    """A Mesh over `devices` (real devices or a TPU topology's device descriptions)."""
    devices = list(devices)
    ici, dcn = resolve_shapes(mesh_cfg, len(devices))
    if math.prod(dcn) > 1:
        granules = {getattr(d, "slice_index", None) for d in devices}
        if len(granules) > 1 and None not in granules:
            arr = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices, allow_split_physical_axes=True)
        elif len({d.process_index for d in devices}) > 1:
            arr = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices, process_is_granule=True,
                                                       allow_split_physical_axes=True)
        else:  # one granule (e.g. one process of simulated devices): lay DCN out as outer axes
            shape = tuple(i * d for i, d in zip(ici, dcn, strict=True))
            arr = _device_array(shape, devices)
    else:
        arr = _device_array(ici, devices)
    return Mesh(arr, MESH_AXES)


def _device_array(shape, devices) -> np.ndarray:
    try:
        return mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True)
    except (ValueError, NotImplementedError, AssertionError):
        return np.asarray(devices, dtype=object).reshape(shape)

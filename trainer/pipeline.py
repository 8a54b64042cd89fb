"""Pipeline parallelism over the mesh axis `stage`: the layers split into stages, the batch into
microbatches that flow through them, GPipe or circular.

    TrainConfig(mesh=MeshConfig(ici=mesh_shape(stage=4, fsdp=2)),
                pipeline=PipelineConfig(microbatches=8, repeats=2, schedule="circular"))

Layout. With S stages and R repeats each stage holds R chunks of n_layers / (S x R) layers. A
pipelined model stores its layers as one stacked tree (model.PipelinedLayers) of shape
[S, R x layers_per_stage, ...] whose first axis is sharded over `stage`: row s holds, for
repeat r, the layers (r x S + s) x per_stage ... + per_stage - 1 (GPipe, R = 1: the
contiguous block s). `stack_to_stages` / `stages_to_stack` convert from / to the unpipelined
[n_layers, ...] stack of nn.scan.

Schedule (the facts MaxText's and Praxis's GSPMD pipelines rest on, written anew here): a
loop of M x R + S - 1 iterations. In each, every stage runs its current layers on one
microbatch at once: the stage function is vmapped over the stage axis with
spmd_axis_name="stage", so under GSPMD each stage's devices compute their own row. Stage s
at iteration t works on microbatch (t - s) mod M of repeat (t - s) div M; its weights for
that repeat are a dynamic slice of its own row (a gather batched over the stage-sharded
axis, local to the stage). Between iterations the stage outputs shift by one stage
(jnp.roll over the stage-sharded axis: a collective permute); stage 0 takes a fresh
microbatch instead. The last stage's output is written back into the microbatch buffer,
where stage 0 reads it again on the next repeat (circular; M >= S keeps it there long
enough) and where the final outputs are collected.

Bubble: of the S x (M x R + S - 1) stage-iterations, S x (S - 1) compute nothing useful:
bubble_fraction = (S - 1) / (M x R + S - 1) (GPipe: R = 1). The work is done anyway (on
garbage, discarded), so it counts in XLA's executed FLOPs (HFU) and in step time, never in
model FLOPs (flops.py): MFU drops by the bubble, honestly.

Microbatch m is the rows m, m + M, m + 2M, ... of the batch, so that splitting a batch
sharded over data x fsdp into microbatches needs no communication (each device keeps
per-device-batch / M rows of every microbatch).
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from .config import TrainConfig
from .errors import ConfigError

SCHEDULES = ("gpipe", "circular")


def stages_of(sizes: dict[str, int]) -> int:
    return int(sizes.get("stage", 1))


def iterations(stages: int, microbatches: int, repeats: int) -> int:
    """Loop iterations of the schedule: every microbatch through every chunk, plus the fill."""
    return microbatches * repeats + stages - 1


def bubble_fraction(stages: int, microbatches: int, repeats: int = 1) -> float:
    """Share of stage-iterations that compute nothing useful: (S - 1) / (M x R + S - 1)."""
    if stages <= 1:
        return 0.0
    return (stages - 1) / iterations(stages, microbatches, repeats)


def check(cfg: TrainConfig, sizes: dict[str, int], global_batch: int) -> None:
    """Static checks of cfg.pipeline on a mesh of axis `sizes`; ConfigError, one line each."""
    p, m = cfg.pipeline, cfg.model
    stages = stages_of(sizes)
    if p.schedule not in SCHEDULES:
        raise ConfigError(f"unknown pipeline.schedule {p.schedule!r}; choose one of {', '.join(SCHEDULES)}")
    if p.microbatches < 1 or p.repeats < 1:
        raise ConfigError(f"pipeline.microbatches and pipeline.repeats must be >= 1, got microbatches="
                          f"{p.microbatches} repeats={p.repeats}")
    if stages == 1:
        if (p.microbatches, p.repeats) != (1, 1):
            raise ConfigError(f"pipeline.microbatches={p.microbatches} repeats={p.repeats} need a stage axis > 1 "
                              "(the mesh has stage=1); size stage in mesh.ici or mesh.dcn, or set microbatches=1 "
                              "and repeats=1")
        return
    if p.schedule == "gpipe" and p.repeats != 1:
        raise ConfigError(f"schedule='gpipe' passes each microbatch through the stages once, so repeats must be 1 "
                          f"(got {p.repeats}); use schedule='circular' for repeats > 1")
    if not m.scan_layers:
        raise ConfigError(f"pipeline stage={stages} needs model.scan_layers=True (the layers are stacked to split "
                          "them over stages)")
    if m.n_layers % (stages * p.repeats):
        raise ConfigError(f"n_layers={m.n_layers} does not split over stage={stages} x repeats={p.repeats}; "
                          f"use a layer count that is a multiple of {stages * p.repeats}, or change stage/repeats")
    if p.microbatches % stages:
        raise ConfigError(f"pipeline.microbatches={p.microbatches} is not a multiple of stage={stages}; use "
                          f"{stages * max(1, -(-p.microbatches // stages))} (every stage needs a microbatch per "
                          "iteration)")
    batch_devices = sizes["data"] * sizes["fsdp"]
    if global_batch % (p.microbatches * batch_devices):
        raise ConfigError(
            f"global batch {global_batch} does not split into {p.microbatches} microbatches over the "
            f"{batch_devices} devices of the batch axes (data x fsdp): rows per device "
            f"{global_batch // batch_devices} must be a multiple of microbatches={p.microbatches}; change "
            "the batch or the microbatches")


# ----------------------------------------------------------------------------- layouts

def layer_order(n_layers: int, stages: int, repeats: int) -> list[list[int]]:
    """order[s][k]: the layer (of the unpipelined stack) stored at row s, column k."""
    per_stage = n_layers // (stages * repeats)
    return [[(r * stages + s) * per_stage + j for r in range(repeats) for j in range(per_stage)]
            for s in range(stages)]


def stack_to_stages(tree: Any, stages: int, repeats: int) -> Any:
    """[n_layers, ...] leaves (nn.scan's stack) -> the pipelined [S, R x per_stage, ...] layout."""
    def one(x):
        n = x.shape[0]
        per_stage = n // (stages * repeats)
        x = x.reshape((repeats, stages, per_stage) + x.shape[1:])
        return jnp.swapaxes(x, 0, 1).reshape((stages, repeats * per_stage) + x.shape[3:])
    return jax.tree.map(one, tree)


def stages_to_stack(tree: Any, stages: int, repeats: int) -> Any:
    """The inverse of stack_to_stages."""
    def one(x):
        per_stage = x.shape[1] // repeats
        x = x.reshape((stages, repeats, per_stage) + x.shape[2:])
        return jnp.swapaxes(x, 0, 1).reshape((stages * repeats * per_stage,) + x.shape[3:])
    return jax.tree.map(one, tree)


# ----------------------------------------------------------------------------- schedule

def to_microbatches(x_B: jax.Array, microbatches: int) -> jax.Array:
    """[B, ...] -> [M, B / M, ...]; microbatch m holds rows m, m + M, ... (no communication
    when the per-device rows are a multiple of M)."""
    b = x_B.shape[0]
    return jnp.swapaxes(x_B.reshape((b // microbatches, microbatches) + x_B.shape[1:]), 0, 1)


def from_microbatches(x_M: jax.Array) -> jax.Array:
    """The inverse of to_microbatches."""
    m, mb = x_M.shape[:2]
    return jnp.swapaxes(x_M, 0, 1).reshape((m * mb,) + x_M.shape[2:])


def run(stage_fn: Callable, weights: Any, x_MbSE: jax.Array, side_Mb: tuple, *, stages: int, repeats: int,
        constrain_stages: Callable[[jax.Array], jax.Array] = lambda x: x,
        constrain_buffer: Callable[[jax.Array], jax.Array] = lambda x: x) -> jax.Array:
    """Run the pipeline. `stage_fn(w_row, first, x, *side)` applies one stage's chunk of layers,
    rows first .. first + per_stage - 1 of its weights `w_row` (leaves [R x per_stage, ...]), to
    one microbatch. It should slice its chunk out of `w_row` inside the function it
    rematerializes (model.PipelinedLayers checkpoints the whole chunk): a chunk sliced out here
    would be a new array every iteration, and the backward pass would keep one copy of the
    chunk's (cast) weights per iteration and layer (on a 16B model pipelined 4 x 8 layers over 11
    iterations, 22 GiB a chip, benchmarks/RESULTS.md), where slicing the loop-invariant row again
    costs nothing. `weights` has leaves [S, R x per_stage, ...];
    `x_MbSE` the microbatched activations [M, mb, ...]; `side_Mb` arrays [M, mb, ...] that go
    with each microbatch unchanged (segment ids, positions). Returns [M, mb, ...]: every
    microbatch through all n_layers in order."""
    microbatches = x_MbSE.shape[0]
    per_stage = jax.tree.leaves(weights)[0].shape[1] // repeats

    def chunk_fn(w_row, repeat, x, *side):
        return stage_fn(w_row, repeat * per_stage, x, *side)

    vmapped = jax.vmap(chunk_fn, spmd_axis_name="stage")
    stage_ids = jnp.arange(stages)
    is_first = (jax.lax.broadcasted_iota(jnp.int32, (stages,) + (1,) * (x_MbSE.ndim - 1), 0) == 0)

    def step(carry, t):
        outputs_S, buffer_M = carry
        fresh = jax.lax.dynamic_index_in_dim(buffer_M, t % microbatches, 0, keepdims=False)
        inputs_S = constrain_stages(jnp.where(is_first, fresh[None], jnp.roll(outputs_S, 1, axis=0)))
        done = jnp.maximum(t - stage_ids, 0)  # microbatch-passes each stage has finished
        micro_ids = done % microbatches
        repeat_ids = jnp.minimum(done // microbatches, repeats - 1)
        side_S = tuple(s[micro_ids] for s in side_Mb)
        outputs_S = constrain_stages(vmapped(weights, repeat_ids, inputs_S, *side_S))
        # the last stage's microbatch goes back to the buffer (the next repeat's input, or the result)
        last_m = (t - (stages - 1)) % microbatches
        kept = jax.lax.dynamic_index_in_dim(buffer_M, last_m, 0, keepdims=False)
        out = jnp.where(t >= stages - 1, outputs_S[stages - 1], kept)
        buffer_M = constrain_buffer(jax.lax.dynamic_update_index_in_dim(buffer_M, out, last_m, 0))
        return (outputs_S, buffer_M), None

    outputs = constrain_stages(jnp.zeros((stages,) + x_MbSE.shape[1:], x_MbSE.dtype))
    (_, buffer), _ = jax.lax.scan(step, (outputs, constrain_buffer(x_MbSE)),
                                  jnp.arange(iterations(stages, microbatches, repeats)))
    return buffer

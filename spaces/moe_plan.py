"""moe_plan: how to lay out Mixtral 8x7B on a v6e-256 slice, planned on a CPU machine without TPUs.

The model is the mixtral-8x7b preset (paxsearch.trainer.presets: 46.7B parameters, 12.9B active
per token; 8 SwiGLU experts of width 14336, top-2 softmax routing; GQA with 8 K/V heads; 4096-token
sequences, bfloat16 activations and float32 parameters). Every trial is compiled for the TPU
topology v6e:16x16 (jax.experimental.topologies with libtpu: pip install 'paxsearch[tpu]') and
never run (plan mode): per-chip memory is the TPU compiler's own figure, step time and MFU are
PREDICTED by the roofline over the optimized HLO (search/planning/roofline/). MFU counts the
router and the 2 activated experts only (trainer/flops.py), so dropping tokens (capacity) raises
it: the dropped share is a training metric, not a plan figure; train the chosen point before
trusting it.

Decisions (named PyGlove choices):
  mesh              "ExFxT" over the 256 chips (expert, fsdp, tensor): the experts split over 1, 2,
                    4 or 8 chips (each MoE layer's tokens then reach their experts through an
                    all-gather + reduce-scatter (dropless) or an all-to-all (capacity),
                    trainer/moe.py), with or without a tensor axis of 4
  expert_compute    "dropless" (grouped matmuls over the tokens sorted by expert,
                    jax.lax.ragged_dot) or "capacity" (a fixed number of slots per expert)
  capacity_factor   1.0, 1.25 (MaxText's mixtral_8x7b_dropped recipe) or 1.5; only with
                    "capacity" (the constraint keeps dropless to one value, which it ignores)
  per_device_batch  rows of 4096 tokens per chip: 4, 8, 12 (the recipe's 12)
  remat             "full", "minimal", or a custom policy offloading the layer input to host
                    memory (trainer/remat.py)
  flags             compiler flag sets (trainer/flagsets.py): "default", or "v6e_sparsecore"
                    (all-reduces on the SparseCores, MaxText's v6e recipes)
Objectives: predicted MFU (higher) and compiled per-chip memory (lower).
Size: 7 meshes x (dropless + capacity x 3 factors) x 3 batches x 3 remat x 2 flag sets = 504 points.
Static checks remove none of them (8 experts over expert <= 8, 32 heads and 8 K/V heads over
tensor 4, d_model 4096 over fsdp x expert = 256 all divide); `--dry-run` says so, and the
analytic pre-screen refuses what cannot fit the chip before compiling.

Run:  paxsearch run spaces/moe_plan.py --dry-run   (the space and its static feasibility, seconds)
      paxsearch run spaces/moe_plan.py             (TPE, 8 trials: each a compile of a 47B model)
      paxsearch report runs/moe_plan               (Pareto front, labelled "predicted")
"""
import os

import fiddle as fdl
import pyglove as pg

from paxsearch.search import preset
from paxsearch.trainer.config import EvalConfig, MeshConfig, OptimizerConfig, TrainConfig, mesh_shape

CHIPS = 256
MESHES = ["1x256x1", "2x128x1", "4x64x1", "8x32x1", "1x64x4", "4x16x4", "8x8x4"]
# the layer input offloaded to host memory between the forward and the backward (remat.py custom policy)
OFFLOAD = "custom:decoder_input=offload"

STUDY = dict(
    objectives=["mfu", "memory"],  # plan mode: predicted MFU, compiled memory
    tuner="tpe",
    trials=8,
    target=f"tpu:v6e-{CHIPS}",
    # a plan's child compile keeps about two cores busy: one plan per two cores
    workers=max(1, (os.cpu_count() or 2) // 2),
    count_flops=False,  # FLOPs come from the optimized HLO with loop trip counts
    timeout=1800,
)


def ici(text: str) -> tuple[int, ...]:
    """'ExFxT' -> the mesh shape with expert E, fsdp F, tensor T."""
    expert, fsdp, tensor = (int(x) for x in text.split("x"))
    return mesh_shape(expert=expert, fsdp=fsdp, tensor=tensor)


def constraint(d: dict) -> bool:
    """capacity_factor is a decision of capacity only: dropless keeps one value (ignored)."""
    return d["expert_compute"] == "capacity" or d["capacity_factor"] == 1.25


def space():
    mesh = pg.oneof(MESHES, name="mesh")
    return fdl.Config(
        TrainConfig,
        model=preset("mixtral-8x7b", attention="flash",
                     expert_compute=pg.oneof(["dropless", "capacity"], name="expert_compute"),
                     capacity_factor=pg.oneof([1.0, 1.25, 1.5], name="capacity_factor")),
        mesh=fdl.Config(MeshConfig, ici=ici(mesh)),
        per_device_batch=pg.oneof([4, 8, 12], name="per_device_batch"),
        remat=pg.oneof(["full", "minimal", OFFLOAD], name="remat"),
        flags=pg.oneof(["default", "v6e_sparsecore"], name="flags"),
        optimizer=fdl.Config(OptimizerConfig, peak_lr=3e-4, warmup_steps=100),
        steps=1000,
        eval=fdl.Config(EvalConfig, enabled=False),
    )

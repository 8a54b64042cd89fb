"""llama_plan: how to lay out Llama 3 8B on a v5e-64 slice, planned on a CPU machine without TPUs.

The model is the llama3-8b preset (paxsearch.trainer.presets: 8.03B parameters, GQA with 8 K/V
heads, SwiGLU, RoPE theta 500000, vocabulary 128256, 8192-token sequences, bfloat16
activations and float32 parameters). Every trial is compiled for the TPU topology v5e:8x8
(jax.experimental.topologies with libtpu: pip install 'paxsearch[tpu]') and never run (plan
mode): per-chip memory is the TPU compiler's own figure against the chip's 15.75 GiB usable
HBM, step time and MFU are PREDICTED by the roofline over the optimized HLO
(search/planning/roofline/). "flash" is the Pallas splash-attention kernel, compiled for the TPU.

Decisions (named PyGlove choices):
  mesh              "DxFxT" over the 64 chips (data, fsdp, tensor): pure fsdp, data x fsdp,
                    fsdp x tensor 4, fsdp x tensor 8
  per_device_batch  rows of 8192 tokens per chip on the batch axes (data x fsdp)
  remat             rematerialization policy (trainer/remat.py)
  attention         "dot_product" (S x S scores in HBM) or "flash" (splash kernel)
  rules             activation sharding: "default", or "sequence_parallel" (the residual
                    stream's embed dim sharded over tensor, as MaxText does)
  quantization      "none" (bf16 matmuls) or "int8" (the decoder layers' projections as int8
                    matmuls, forward and backward: trainer/quant.py; MaxText's quantization=int8)
Objectives: predicted MFU (higher) and compiled per-chip memory (lower). int8 changes the
loss a little as well as the speed: train the chosen point both ways before trusting it.
The constraint keeps "sequence_parallel" to meshes with a tensor axis (with tensor 1 it is
the same layout as "default"): 96 points. v5e-16 is too small for this model (parameters,
gradients and AdamW moments alone need ~8 GiB a chip, and the pre-screen refuses it); for a
v5e-256 slice set CHIPS = 256 below (MaxText's own v5e recipe for this model,
MaxText/configs/v5e/llama3/llama3_8b.sh, runs per_device_batch_size=1, remat_policy=full,
8192 tokens, fsdp over the slice), and expect compiles ~1.5x longer.

Plan time: a point is planned from the TPU compiler's HLO passes, its code generation never
run (trainer/hlo_passes.py; README "A plan stops the compiler after its HLO passes"): ~10 s a
point on the 2-core development machine, where the full compile took 80-160 s
(benchmarks/bench_plan_method.py; --plan-compile full compiles to the end). Points the
analytic pre-screen refuses (memory of the state alone) and duplicates are settled without
compiling.

Run:  paxsearch run spaces/llama_plan.py --dry-run  (the space and its static feasibility, seconds)
      paxsearch run spaces/llama_plan.py            (TPE, 8 trials: a few minutes on 2 cores)
      paxsearch run spaces/llama_plan.py --trials 96 --tuner grid   (every point)
      paxsearch report runs/llama_plan              (Pareto front, labelled "predicted")
"""
import os

import fiddle as fdl
import pyglove as pg

from paxsearch.search import preset
from paxsearch.trainer.config import EvalConfig, MeshConfig, OptimizerConfig, TrainConfig

CHIPS = 64
MESHES = [f"1x{CHIPS}x1", f"4x{CHIPS // 4}x1", f"1x{CHIPS // 4}x4", f"1x{CHIPS // 8}x8"]

STUDY = dict(
    objectives=["mfu", "memory"],  # plan mode: predicted MFU, compiled memory
    tuner="tpe",
    trials=8,
    target=f"tpu:v5e-{CHIPS}",
    # a plan's child compile keeps about two cores busy: one plan per two cores
    workers=max(1, (os.cpu_count() or 2) // 2),
    count_flops=False,  # FLOPs come from the optimized HLO with loop trip counts
    timeout=1800,  # --plan-compile full: a full compile took up to 10 minutes under load
)


def mesh_shape(text: str) -> tuple[int, int, int]:
    return tuple(int(x) for x in text.split("x"))


def constraint(d: dict) -> bool:
    """sequence_parallel only where the mesh has a tensor axis."""
    return d["rules"] == "default" or mesh_shape(d["mesh"])[2] > 1


def space():
    mesh = pg.oneof(MESHES, name="mesh")
    return fdl.Config(
        TrainConfig,
        model=preset("llama3-8b", attention=pg.oneof(["flash", "dot_product"], name="attention"),
                     quantization=pg.oneof(["none", "int8"], name="quantization")),
        mesh=fdl.Config(MeshConfig, ici=mesh_shape(mesh),
                        rules=pg.oneof(["default", "sequence_parallel"], name="rules")),
        per_device_batch=pg.oneof([1, 2], name="per_device_batch"),
        remat=pg.oneof(["full", "minimal"], name="remat"),
        optimizer=fdl.Config(OptimizerConfig, peak_lr=3e-4, warmup_steps=100),
        steps=1000,
        eval=fdl.Config(EvalConfig, enabled=False),
    )

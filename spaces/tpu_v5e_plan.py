"""tpu_v5e_plan: which mesh, per-device batch and remat policy fit a ~1B model on a v5e-16
slice, and which is predicted fastest, planned on a CPU machine without TPUs.

Every trial is compiled for the TPU topology v5e:4x4 (jax.experimental.topologies with
libtpu: pip install 'paxsearch[tpu]') and never run (plan mode). Per-chip memory is XLA's
TPU compiler's own figure against the chip's 15.75 GiB usable HBM; a config the compiler
refuses, or whose compiled peak exceeds the HBM, is predicted_oom with the numbers. Step
time and MFU are PREDICTED by a roofline over the optimized HLO (search/planning/roofline/:
FLOPs at the bf16 peak, HBM bytes at 819 GB/s, collectives priced at ICI/DCN bandwidth).

Decisions (named PyGlove choices):
  mesh              "DxFxT" over the 16 chips of one slice (data, fsdp, tensor)
  per_device_batch  rows per chip on the batch axes (data x fsdp)
  remat             rematerialization policy (trainer/remat.py)
Objectives: predicted MFU (higher) and compiled per-chip memory (lower).

Multi-slice variant: set SLICES = 2 below (two v5e-16 slices over the data-center network;
the data axis spans the slices, DCN data = 2), or keep this file and run
    paxsearch run spaces/tpu_v5e_plan.py --target tpu:v5e-16,slices=2 --set 'mesh.dcn=(2,1,1)'

Run:  paxsearch run spaces/tpu_v5e_plan.py            (grid, 16 points, ~5 minutes on 2 cores:
                                                        ~20 s per ~1B compile, one per 2 cores;
                                                        an over-capacity step is refused in seconds,
                                                        and a larger batch of a refused point is not
                                                        compiled at all)
      paxsearch run spaces/tpu_v5e_plan.py --dry-run  (the space and its static feasibility)
      paxsearch report runs/tpu_v5e_plan              (Pareto front, labelled "predicted")
"""
import os

import fiddle as fdl
import pyglove as pg

from paxsearch.trainer.config import EvalConfig, MeshConfig, ModelConfig, OptimizerConfig, TrainConfig

SLICES = 1  # 2: two v5e-16 slices joined by DCN (the data axis spans them)
CHIPS_PER_SLICE = 16
MESHES = ["16x1x1", "1x16x1", "2x8x1", "1x4x4"]  # pure data, pure fsdp, data x fsdp, fsdp x tensor
BATCHES = [2, 8]
REMATS = ["full", "minimal"]

# ~0.94B parameters: d_model 2048, 16 layers, 16 heads of 128, d_ff 8192, vocabulary 32768
MODEL = dict(vocab_size=32768, d_model=2048, n_layers=16, n_heads=16, head_dim=128, d_ff=8192, seq_len=1024,
             dtype="bfloat16", param_dtype="float32", scan_layers=True)

STUDY = dict(
    objectives=["mfu", "memory"],  # plan mode: predicted MFU, compiled memory
    tuner="grid",
    trials=len(MESHES) * len(BATCHES) * len(REMATS),
    target=f"tpu:v5e-{CHIPS_PER_SLICE}" + (f",slices={SLICES}" if SLICES > 1 else ""),
    # XLA's TPU compiler keeps about two cores busy per compile (~20 s wall, ~38 s CPU for this
    # model on the 2-core development machine): one compile per two cores
    workers=max(1, (os.cpu_count() or 2) // 2),
    count_flops=False,  # FLOPs come from the optimized HLO with loop trip counts, no probe compiles
    timeout=900,
)


def mesh_shape(text: str) -> tuple[int, int, int]:
    return tuple(int(x) for x in text.split("x"))


def space():
    mesh = pg.oneof(MESHES, name="mesh")
    return fdl.Config(
        TrainConfig,
        model=fdl.Config(ModelConfig, **MODEL),
        mesh=fdl.Config(MeshConfig, ici=mesh_shape(mesh), dcn=(SLICES, 1, 1)),
        per_device_batch=pg.oneof(BATCHES, name="per_device_batch"),
        remat=pg.oneof(REMATS, name="remat"),
        optimizer=fdl.Config(OptimizerConfig, peak_lr=3e-4, warmup_steps=100),
        steps=1000,
        eval=fdl.Config(EvalConfig, enabled=False),
    )

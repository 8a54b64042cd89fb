"""llama70b_plan: how to lay out Llama 3.1 70B on v5p-256 (128 chips), on one slice or two over
the data-center network (DCN), planned on a CPU machine without TPUs. A space that needs every
knob of issue 19: pipeline stages, fsdp, tensor and context sizes, microbatches, custom remat
with host offload, ZeRO-1, gradient accumulation and vocab tiling.

The model is the llama3.1-70b preset (trainer/presets.py: 70,553,706,496 parameters, GQA with 8
K/V heads, SwiGLU, vocabulary 128256, 8192-token sequences, bfloat16 activations and float32
parameters, splash attention on TPU). The target `tpu:v5p-256,slices=auto` compiles each trial
for prod(mesh.dcn) slices of v5p-256 (jax.experimental.topologies with libtpu: pip install
'paxsearch[tpu]'), never runs it: per-chip memory is the TPU compiler's figure against the
chip's 95 GiB, step time and MFU are predicted by the roofline over the optimized HLO.

Decisions (named PyGlove choices):
  mesh              "SxFxCxT" over the 128 chips of a slice (stage, fsdp, context, tensor):
                    stage 1, 2, 4 or 8; context 1, 2 or 4; tensor 1, 2, 4 or 8; fsdp the rest
                    (paxsearch.search.factorizations / mesh_of)
  dcn               "none" (one slice), or a second slice over DCN on the axis named: "data"
                    (data parallel across slices), "fsdp" (parameters sharded across slices)
                    or "stage" (the pipeline's stages doubled across slices)
  microbatches      pipeline microbatches per step (a multiple of the stage count)
  schedule          "gpipe" (repeats 1) or "circular" (repeats 2: each stage holds two chunks
                    of layers; a smaller bubble for twice the stage-to-stage transfers)
  remat             "full", "minimal", or a custom policy (trainer/remat.py): "offload_input_qkv"
                    (the layer input and q/k/v offloaded to host: MaxText's v6e-256 Llama 3.1 70B
                    recipe), "offload_qkv" (q/k/v offloaded: MaxText's qkv_proj_offloaded),
                    "save_dots_except_mlp1" (q/k/v, attention output and the MLP's output matmul
                    kept on device: MaxText's save_dot_except_mlpwi, its v5p Llama2-70B recipe)
  zero1             AdamW moments sharded over the data axis too
  grad_accum_steps  microbatches of gradient accumulation per step
  vocab_tiles       sequence chunks of the unembedding + cross-entropy (no B x S x V logits)
Fixed: 2 rows of 8192 tokens per chip (global batch 256 on one slice, 512 on two).
Objectives: predicted MFU (higher) and compiled per-chip memory (lower).

The constraint keeps one point per mesh without a pipeline (microbatches and schedule unused)
and ZeRO-1 to meshes with a data axis (the DCN data axis). The static checks remove more, each
with its one-line reason (`--dry-run` lists a sample): microbatches not a multiple of the
stages, layers (80) not divisible by stages x repeats, a per-device batch that does not divide
into the accumulation and pipeline microbatches, ...

Planned on 2026-12-02 (2-core development machine shared with other jobs, load 7-10; jax 0.10.2),
each a real compile for v5p-256 (`--trials 1`, the other decisions fixed with --set: dcn=none,
vocab_tiles=1, grad_accum_steps=1, zero1=False):
    mesh=1x128x1x1 remat=offload_input_qkv: fits, 24.9 GiB a chip, predicted step 23.79 s, predicted
        MFU 67.4% (roofline: compute 21.88 s, memory 1.60 s, exposed communication 1.41 s);
        compile 422 s, 467 s wall
    mesh=4x32x1x1 (4 stages, GPipe, 8 microbatches) remat=full: refused by the TPU compiler,
        95.95 GiB a chip > 95.73 usable, 28 s. Re-planned 2026-12-04 (idle machine) after the
        pipelined stage's chunk-level remat (trainer/model.py): fits, 89.2 GiB a chip, predicted
        MFU 42.4%, step 37.8 s; 45 s the trial, 52 s the command. The largest of its 82.5 GiB of
        temporaries (an XLA dump's buffer assignment; some share space): two 32 GiB [8, 32, 8192,
        8192] microbatch buffers that the partitioner all-gathers over fsdp in the backward loop
        (not fixed yet), the 11 x 20 saved layer inputs (27.5 GiB), the logits of 8 rows (15.7 GiB,
        vocab_tiles=1). With the head (final norm, unembedding, loss) split over the stage devices
        too (model.head_batch), the same point: 82.1 GiB, predicted MFU 43.3%, step 37.0 s, 40 s
    TPE's first point (mesh=2x16x4x1 dcn=stage microbatches=16 remat=minimal): refused, 289.7 GiB, 24 s

Run:  paxsearch run spaces/llama70b_plan.py --dry-run   (size, and what the static checks remove)
      paxsearch run spaces/llama70b_plan.py --trials 1  (one compiled point)
      paxsearch run spaces/llama70b_plan.py             (TPE, 16 trials, one compile per two cores)
      paxsearch report runs/llama70b_plan               (labelled "predicted")
"""
import os

import fiddle as fdl
import pyglove as pg

from paxsearch.search import factorizations, mesh_of, preset
from paxsearch.trainer.config import EvalConfig, MeshConfig, OptimizerConfig, PipelineConfig, TrainConfig
from paxsearch.trainer.remat import custom

CHIPS = 128  # v5p-256: 256 TensorCores, 128 chips
ROWS_PER_CHIP = 2
AXES = ("stage", "fsdp", "context", "tensor")
MESHES = factorizations(CHIPS, AXES, limits={"stage": (1, 2, 4, 8), "context": (1, 2, 4), "tensor": (1, 2, 4, 8)})
DCN = ("none", "data", "fsdp", "stage")
SCHEDULES = {"gpipe": 1, "circular": 2}  # schedule -> repeats
REMAT = {
    "full": "full",
    "minimal": "minimal",
    "offload_input_qkv": custom(decoder_input="offload", query_proj="offload", key_proj="offload",
                                value_proj="offload"),
    "offload_qkv": custom(query_proj="offload", key_proj="offload", value_proj="offload"),
    "save_dots_except_mlp1": custom(query_proj="device", key_proj="device", value_proj="device", out_proj="device",
                                    mlp2="device"),
}

STUDY = dict(
    objectives=["mfu", "memory"],  # plan mode: predicted MFU, compiled memory
    tuner="tpe",
    trials=16,
    target=f"tpu:v5p-{2 * CHIPS},slices=auto",  # each trial: prod(mesh.dcn) slices of v5p-256
    # XLA's TPU compiler keeps about two cores busy per compile: one compile per two cores
    workers=max(1, (os.cpu_count() or 2) // 2),
    count_flops=False,  # FLOPs come from the optimized HLO with loop trip counts
    timeout=3000,
)


def stages(d: dict) -> int:
    """The pipeline's stage count: the ICI stage size, doubled when the second slice is on `stage`."""
    return int(d["mesh"].split("x")[0]) * (2 if d["dcn"] == "stage" else 1)


def constraint(d: dict) -> bool:
    one_point_without_pipeline = stages(d) > 1 or (d["microbatches"] == 8 and d["schedule"] == "gpipe")
    return one_point_without_pipeline and (not d["zero1"] or d["dcn"] == "data")


def space():
    mesh = pg.oneof(MESHES, name="mesh")
    dcn = pg.oneof(list(DCN), name="dcn")
    microbatches = pg.oneof([8, 16, 32], name="microbatches")
    schedule = pg.oneof(list(SCHEDULES), name="schedule")
    pipelined = stages({"mesh": mesh, "dcn": dcn}) > 1
    slices = 1 if dcn == "none" else 2
    return fdl.Config(
        TrainConfig,
        model=preset("llama3.1-70b", attention="flash", vocab_tiles=pg.oneof([1, 8], name="vocab_tiles")),
        mesh=fdl.Config(MeshConfig, ici=mesh_of(mesh, AXES),
                        dcn=mesh_of("2", (dcn,)) if slices > 1 else (1, 1, 1, 1, 1)),
        pipeline=fdl.Config(PipelineConfig, microbatches=microbatches if pipelined else 1,
                            repeats=SCHEDULES[schedule] if pipelined else 1,
                            schedule=schedule if pipelined else "gpipe"),
        per_device_batch=None,
        global_batch=ROWS_PER_CHIP * CHIPS * slices,
        grad_accum_steps=pg.oneof([1, 2, 4], name="grad_accum_steps"),
        remat=REMAT[pg.oneof(list(REMAT), name="remat")],
        optimizer=fdl.Config(OptimizerConfig, peak_lr=1.5e-4, warmup_steps=100,
                             zero1=pg.oneof([False, True], name="zero1")),
        steps=1000,
        eval=fdl.Config(EvalConfig, enabled=False),
    )

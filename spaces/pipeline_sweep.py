"""pipeline_sweep: when do pipeline stages pay on 8 devices, and with how many microbatches?

A small Llama-style LM of 8 layers (stacked under nn.scan, as the pipeline needs), trained on 8
simulated CPU devices. Pipeline parallelism splits the layers over the mesh axis `stage`
(trainer/pipeline.py); the batch splits into microbatches that flow through the stages.

Decisions (named PyGlove choices):
  mesh          "SxFxT": every factorization of 8 devices over (stage, fsdp, tensor) with
                stage 1, 2 or 4 (paxsearch.search.factorizations / mesh_of)
  microbatches  pipeline microbatches per step (a multiple of the stage count)
  schedule      "gpipe" (each microbatch passes the stages once) or "circular" (twice:
                repeats=2, each stage holds two chunks of layers; a smaller bubble,
                (S-1)/(M x R + S - 1), for twice the stage-to-stage transfers)
Objectives: loss, MFU, compiled memory. The report adds a "pipeline bubble" column.
The constraint keeps stage 1 to one point (no pipeline: microbatches and schedule unused), and
the tensor axis to divisors of the 4 heads. Other bad points (layers not divisible by
stage x repeats, ...) are removed by the static checks, each with its one-line reason
(`--dry-run` lists them).

Run:  paxsearch run spaces/pipeline_sweep.py --dry-run
      paxsearch run spaces/pipeline_sweep.py --trials 8
"""
import fiddle as fdl
import pyglove as pg

from paxsearch.search import factorizations, mesh_of
from paxsearch.trainer.config import (
    EvalConfig,
    LogConfig,
    MeshConfig,
    ModelConfig,
    OptimizerConfig,
    PipelineConfig,
    TrainConfig,
)

DEVICES = 8
AXES = ("stage", "fsdp", "tensor")
MESHES = factorizations(DEVICES, AXES, limits={"stage": (1, 2, 4)})
SCHEDULES = {"gpipe": 1, "circular": 2}  # schedule -> repeats

STUDY = dict(
    objectives=["loss", "mfu", "memory"],
    trials=8,
    tuner="tpe",
    target=f"cpu:{DEVICES}",
    timeout=600,
    count_flops=False,
)


def sizes(mesh: str) -> dict:
    return dict(zip(AXES, map(int, mesh.split("x")), strict=True))


def constraint(d: dict) -> bool:
    s = sizes(d["mesh"])
    no_pipeline_once = s["stage"] > 1 or (d["microbatches"] == 4 and d["schedule"] == "gpipe")
    return no_pipeline_once and 4 % s["tensor"] == 0


def space():
    mesh = pg.oneof(MESHES, name="mesh")
    microbatches = pg.oneof([4, 8], name="microbatches")
    schedule = pg.oneof(list(SCHEDULES), name="schedule")
    pipelined = sizes(mesh)["stage"] > 1
    return fdl.Config(
        TrainConfig,
        model=fdl.Config(ModelConfig, d_model=64, n_layers=8, n_heads=4, head_dim=16, d_ff=192, seq_len=64,
                         mlp="gated", activation="silu", position="rope", scan_layers=True),
        mesh=fdl.Config(MeshConfig, ici=mesh_of(mesh, AXES)),
        pipeline=fdl.Config(PipelineConfig, microbatches=microbatches if pipelined else 1,
                            repeats=SCHEDULES[schedule] if pipelined else 1,
                            schedule=schedule if pipelined else "gpipe"),
        per_device_batch=8,  # rows per device on data x fsdp: a multiple of every microbatch count
        optimizer=fdl.Config(OptimizerConfig, peak_lr=3e-3, warmup_steps=2),
        steps=10,
        eval=fdl.Config(EvalConfig, enabled=True, max_batches=1),
        log=fdl.Config(LogConfig, every_steps=5),
    )

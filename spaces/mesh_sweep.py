"""mesh_sweep: which parallel layout trains a small LM fastest on 8 devices, and at what memory?

Decisions (each a named PyGlove choice; the names are the Optuna parameters and report columns):
  mesh              every ordered factorization of 8 devices over (data, fsdp, tensor): "DxFxT"
  per_device_batch  rows per device on the batch axes (data x fsdp)
  remat             rematerialization policy (trainer/remat.py)
  model_size        two small decoder-only LMs
Objectives: loss (final train loss, lower), MFU (higher), compiled per-device memory (lower).

The constraint leaves out meshes whose tensor axis does not divide the model's heads, so every
point can run. On simulated CPU devices, fsdp-heavy meshes (1x8x1) step ~5x slower than data
parallelism: collectives between simulated devices are host memory copies. That is a real
finding of the sweep on this platform, not a bug.

Run:  paxsearch run spaces/mesh_sweep.py            (TPE, 16 trials, ~10 minutes on 2 cores)
      paxsearch run spaces/mesh_sweep.py --dry-run  (the space, its size, static feasibility)
"""
import fiddle as fdl
import pyglove as pg

from paxsearch.trainer.config import (DataConfig, EvalConfig, LogConfig, MeshConfig, ModelConfig,
                                      OptimizerConfig, TrainConfig)

DEVICES = 8
MESHES = [f"{d}x{f}x{t}" for d in (1, 2, 4, 8) for f in (1, 2, 4, 8) for t in (1, 2, 4, 8) if d * f * t == DEVICES]
MODELS = {
    "tiny": dict(d_model=64, n_layers=2, n_heads=4, head_dim=16, d_ff=256),
    "small": dict(d_model=128, n_layers=2, n_heads=8, head_dim=16, d_ff=512),
}

STUDY = dict(
    objectives=["loss", "mfu", "memory"],
    trials=16,
    tuner="tpe",
    target=f"cpu:{DEVICES}",
    memory_budget="10MiB",  # per device: larger plans are rejected after compiling, before any step
    timeout=300,
    count_flops=False,  # layers are unrolled below, so XLA's FLOP count is exact without probes
)


def mesh_shape(text: str) -> tuple[int, int, int]:
    return tuple(int(x) for x in text.split("x"))


def constraint(d: dict) -> bool:
    """The tensor axis must divide the model's attention heads."""
    return MODELS[d["model_size"]]["n_heads"] % mesh_shape(d["mesh"])[2] == 0


def space():
    mesh = pg.oneof(MESHES, name="mesh")
    size = pg.oneof(list(MODELS), name="model_size")
    return fdl.Config(
        TrainConfig,
        model=fdl.Config(ModelConfig, seq_len=64, scan_layers=False, **MODELS[size]),
        mesh=fdl.Config(MeshConfig, ici=mesh_shape(mesh)),
        per_device_batch=pg.oneof([1, 2, 4], name="per_device_batch"),
        remat=pg.oneof(["none", "full", "minimal"], name="remat"),
        optimizer=fdl.Config(OptimizerConfig, peak_lr=3e-3, warmup_steps=5),
        data=fdl.Config(DataConfig),
        steps=20,
        eval=fdl.Config(EvalConfig, enabled=True, max_batches=1),
        log=fdl.Config(LogConfig, every_steps=10),
    )

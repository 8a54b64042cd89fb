"""A tiny test space: 3 meshes x 2 per-device batches = 6 points; a model small enough that a
trial is mostly fixed costs (compile ~2 s, a few steps)."""
import fiddle as fdl
import pyglove as pg

from paxsearch.trainer.config import EvalConfig, LogConfig, MeshConfig, ModelConfig, TrainConfig

STUDY = dict(objectives=["loss", "mfu", "memory"], trials=6, tuner="grid", target="cpu:8", timeout=120,
             count_flops=False)


def space():
    mesh = pg.oneof(["8x1x1", "2x2x2", "4x2x1"], name="mesh")
    return fdl.Config(
        TrainConfig,
        model=fdl.Config(ModelConfig, d_model=32, n_layers=1, n_heads=2, head_dim=16, d_ff=64, seq_len=32,
                         scan_layers=False),
        mesh=fdl.Config(MeshConfig, ici=tuple(int(x) for x in mesh.split("x"))),
        per_device_batch=pg.oneof([1, 2], name="per_device_batch"),
        steps=4,
        eval=fdl.Config(EvalConfig, enabled=False),
        log=fdl.Config(LogConfig, every_steps=2),
    )

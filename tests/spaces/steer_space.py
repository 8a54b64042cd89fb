"""A space for steering tests: a wide model (high MFU at batch 4) and a very narrow one
(matmuls of width 8: predicted and measured MFU far below the wide one's), 3 meshes x 2
per-device batches each = 12 points."""
import fiddle as fdl
import pyglove as pg

from paxsearch.trainer.config import EvalConfig, LogConfig, MeshConfig, ModelConfig, TrainConfig

WIDTHS = {"wide": dict(d_model=128, n_heads=4, head_dim=32, d_ff=512),
          "narrow": dict(d_model=8, n_heads=2, head_dim=4, d_ff=16)}

STUDY = dict(objectives=["mfu"], trials=12, tuner="grid", target="cpu:8", timeout=120, count_flops=False,
             steer="global")


def space():
    mesh = pg.oneof(["8x1x1", "4x2x1", "2x2x2"], name="mesh")
    width = pg.oneof(list(WIDTHS), name="width")
    return fdl.Config(
        TrainConfig,
        model=fdl.Config(ModelConfig, n_layers=1, seq_len=64, scan_layers=False, **WIDTHS[width]),
        mesh=fdl.Config(MeshConfig, ici=tuple(int(x) for x in mesh.split("x"))),
        per_device_batch=pg.oneof([2, 4], name="per_device_batch"),
        steps=6,
        eval=fdl.Config(EvalConfig, enabled=False),
        log=fdl.Config(LogConfig, every_steps=2),
    )

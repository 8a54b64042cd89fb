"""Two-process trials: 2 processes x 4 simulated devices, a DCN axis across the processes."""
import fiddle as fdl
import pyglove as pg

from paxsearch.trainer.config import EvalConfig, LogConfig, MeshConfig, ModelConfig, TrainConfig

STUDY = dict(objectives=["loss", "mfu", "memory"], trials=2, tuner="grid", target="cpu:8", processes=2,
             timeout=240, count_flops=False)


def space():
    ici = pg.oneof(["1x4x1", "2x2x1"], name="ici_mesh")
    return fdl.Config(
        TrainConfig,
        model=fdl.Config(ModelConfig, d_model=32, n_layers=1, n_heads=2, head_dim=16, d_ff=64, seq_len=32,
                         scan_layers=False),
        mesh=fdl.Config(MeshConfig, ici=tuple(int(x) for x in ici.split("x")), dcn=(2, 1, 1)),
        per_device_batch=1,
        steps=4,
        eval=fdl.Config(EvalConfig, enabled=False),
        log=fdl.Config(LogConfig, every_steps=2),
    )

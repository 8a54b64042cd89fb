"""A slice gang whose trials need two compiler flag sets: the whole gang starts again with each
(tests/test_slice_gang.py)."""
import fiddle as fdl
import pyglove as pg

from paxsearch.trainer.config import DataConfig, EvalConfig, LogConfig, MeshConfig, ModelConfig, TrainConfig

STUDY = dict(objectives=["loss", "mfu", "memory"], trials=2, tuner="grid", target="cpu:8", timeout=300,
             count_flops=False)


def space():
    return fdl.Config(
        TrainConfig,
        model=fdl.Config(ModelConfig, d_model=32, n_layers=1, n_heads=2, head_dim=16, d_ff=64, seq_len=32,
                         scan_layers=False),
        mesh=fdl.Config(MeshConfig, ici=(4, 2, 1)),
        per_device_batch=1,
        steps=2,
        flags=pg.oneof(["default", "cpu_eigen_dots"], name="flags"),
        data=fdl.Config(DataConfig, num_shards=2),
        eval=fdl.Config(EvalConfig, enabled=False),
        log=fdl.Config(LogConfig, every_steps=1),
    )

"""Slice-gang trials: 8 devices per trial, one process per host (2 hosts x 4 simulated devices,
tests/test_slice_gang.py), four mesh layouts, data in 2 fixed shards so that the global batches do
not depend on how many hosts read them."""
import fiddle as fdl
import pyglove as pg

from paxsearch.trainer.config import DataConfig, EvalConfig, LogConfig, MeshConfig, ModelConfig, TrainConfig

STUDY = dict(objectives=["loss", "mfu", "memory"], trials=4, tuner="grid", target="cpu:8", timeout=300,
             count_flops=False)


def space():
    ici = pg.oneof(["8x1x1", "4x2x1", "2x4x1", "2x2x2"], name="ici_mesh")
    return fdl.Config(
        TrainConfig,
        model=fdl.Config(ModelConfig, d_model=32, n_layers=1, n_heads=2, head_dim=16, d_ff=64, seq_len=32,
                         scan_layers=False),
        mesh=fdl.Config(MeshConfig, ici=tuple(int(x) for x in ici.split("x"))),
        per_device_batch=1,
        steps=4,
        data=fdl.Config(DataConfig, num_shards=2),
        eval=fdl.Config(EvalConfig, enabled=False),
        log=fdl.Config(LogConfig, every_steps=2),
    )

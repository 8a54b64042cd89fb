"""A space for the pruner: three learning rates that train and one (1e-9) that does not move
the loss; single objective loss, the median pruner, each trial reporting its loss every step."""
import fiddle as fdl
import pyglove as pg

from paxsearch.trainer.config import EvalConfig, LogConfig, MeshConfig, ModelConfig, OptimizerConfig, TrainConfig

BAD_LR = 1e-9
STUDY = dict(objectives=["loss"], trials=4, tuner="grid", target="cpu:8", timeout=300, pruner="median",
             count_flops=False)


def space():
    return fdl.Config(
        TrainConfig,
        model=fdl.Config(ModelConfig, d_model=32, n_layers=1, n_heads=2, head_dim=16, d_ff=64, seq_len=32,
                         scan_layers=False),
        mesh=fdl.Config(MeshConfig, ici=(8, 1, 1)),
        optimizer=fdl.Config(OptimizerConfig, warmup_steps=1,
                             peak_lr=pg.oneof([1e-2, 2e-2, 3e-2, BAD_LR], name="lr")),
        per_device_batch=2,
        steps=8,
        eval=fdl.Config(EvalConfig, enabled=False),
        log=fdl.Config(LogConfig, every_steps=1),
    )

"""model_size: width and depth against loss at a fixed token budget.

Every trial sees the same tokens (STUDY tokens=: global batch 16 x seq 64 x 30 steps on 8
data-parallel devices), and loss is the held-out eval loss, so the loss compares model shapes
at equal data. Single objective (loss), so the
median pruner stops trials whose intermediate loss trails the others.

Decisions: d_model (width), n_layers (depth, an integer range), peak_lr (log-uniform).
Run:  paxsearch run spaces/model_size.py
"""
import fiddle as fdl
import pyglove as pg

from paxsearch.search import intv
from paxsearch.trainer.config import EvalConfig, LogConfig, MeshConfig, ModelConfig, OptimizerConfig, TrainConfig

STUDY = dict(objectives=["loss"], trials=10, tuner="tpe", target="cpu:8", pruner="median", timeout=300,
             count_flops=False, tokens=16 * 64 * 30)


def space():
    width = pg.oneof([64, 128, 192], name="d_model")
    return fdl.Config(
        TrainConfig,
        model=fdl.Config(ModelConfig, d_model=width, n_heads=4, head_dim=width // 4, d_ff=4 * width,
                         n_layers=intv(1, 4, name="n_layers"), seq_len=64, scan_layers=False),
        mesh=fdl.Config(MeshConfig, ici=(8, 1, 1)),
        per_device_batch=None,
        global_batch=16,  # fixed token budget: 16 x 64 tokens per step
        optimizer=fdl.Config(OptimizerConfig, peak_lr=pg.floatv(1e-3, 1e-2, scale="log", name="peak_lr"),
                             warmup_steps=5),
        steps=30,  # STUDY tokens= sets it: 16 x 64 x 30 tokens / (16 x 64) a step
        eval=fdl.Config(EvalConfig, enabled=True, max_batches=1),
        log=fdl.Config(LogConfig, every_steps=5),
    )

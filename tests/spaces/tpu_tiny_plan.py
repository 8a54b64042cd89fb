"""A plan-only test space for tpu:v5e-16 (compiled for the TPU topology, never run):
2 models x 3 per-device batches x 2 learning rates = 12 points, of which only two compile.

- model "huge" (~7.5B parameters) needs more than the 256 MiB budget for its parameters and
  AdamW state alone: every such point is rejected by the analytic pre-screen.
- peak_lr does not change the compiled step: the second learning rate of each compiled
  point reuses the first one's plan (duplicate).
- per_device_batch 64 exceeds the budget once compiled; 256 is then ruled out without
  compiling (a larger batch of the same model, mesh and remat).
"""
import fiddle as fdl
import pyglove as pg

from paxsearch.trainer.config import EvalConfig, MeshConfig, ModelConfig, OptimizerConfig, TrainConfig

MODELS = {
    "small": dict(vocab_size=4096, d_model=256, n_layers=2, n_heads=16, head_dim=16, d_ff=1024),
    "huge": dict(vocab_size=131072, d_model=4096, n_layers=32, n_heads=32, head_dim=128, d_ff=16384),
}

STUDY = dict(objectives=["mfu", "memory"], tuner="grid", trials=12, target="tpu:v5e-16", memory_budget="256MiB",
             timeout=300, count_flops=False)


def space():
    size = pg.oneof(list(MODELS), name="model_size")
    return fdl.Config(
        TrainConfig,
        model=fdl.Config(ModelConfig, seq_len=256, dtype="bfloat16", param_dtype="float32", **MODELS[size]),
        mesh=fdl.Config(MeshConfig, ici=(1, 16, 1)),
        per_device_batch=pg.oneof([1, 64, 256], name="per_device_batch"),
        remat="none",
        optimizer=fdl.Config(OptimizerConfig, peak_lr=pg.oneof([1e-3, 3e-3], name="peak_lr")),
        steps=100,
        eval=fdl.Config(EvalConfig, enabled=False),
    )

"""A plan-only multi-slice test space: the slice count is a decision (target slices=auto).

A tiny model with fsdp over the 4 chips of a v5e-4 slice and the data axis over DCN on 1 or
2 slices (decision `slices`: mesh.dcn (1,1,1) / (2,1,1)), per-chip batch fixed: each trial is compiled for
prod(mesh.dcn) slices of v5e-4 (4 or 8 compile-only devices), never run.
"""
import fiddle as fdl
import pyglove as pg

from paxsearch.trainer.config import EvalConfig, MeshConfig, ModelConfig, OptimizerConfig, TrainConfig

STUDY = dict(objectives=["mfu", "memory"], tuner="grid", trials=2, target="tpu:v5e-4,slices=auto",
             timeout=300, count_flops=False)


def space():
    return fdl.Config(
        TrainConfig,
        model=fdl.Config(ModelConfig, vocab_size=1024, d_model=256, n_layers=2, n_heads=4, head_dim=64, d_ff=1024,
                         seq_len=128, dtype="bfloat16", param_dtype="float32"),
        mesh=fdl.Config(MeshConfig, ici=(1, 4, 1), dcn=(pg.oneof([1, 2], name="slices"), 1, 1)),
        per_device_batch=2,
        remat="none",
        optimizer=fdl.Config(OptimizerConfig, peak_lr=1e-3),
        steps=100,
        eval=fdl.Config(EvalConfig, enabled=False),
    )

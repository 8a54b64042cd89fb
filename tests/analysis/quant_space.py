"""quant_space: int8 against bf16 matmuls as a decision, small enough to train on the 8 CPU devices
(a test space of the report's quantization comparison, analysis/quality.py; not a module of tests).

A small Llama-style LM (mesh_sweep's "small": d_model 128, 2 layers, 8 heads) on an fsdp mesh of 8;
decisions: quantization "none" / "int8" (trainer/quant.py) and per-device batch 1 / 2, so that every
int8 point has a bf16 twin. Every trial sees the same 16,384 training tokens; the loss objective is
the held-out eval loss after them. XLA:CPU has no int8 fast path: the speed gain here says nothing
about a TPU's; the comparison's arithmetic and its wording are what this space checks.

Run:  paxsearch run tests/analysis/quant_space.py --tuner grid   (4 trials)
"""
import fiddle as fdl
import pyglove as pg

from paxsearch.trainer.config import (
    DataConfig,
    EvalConfig,
    LogConfig,
    MeshConfig,
    ModelConfig,
    OptimizerConfig,
    TrainConfig,
    mesh_shape,
)

STUDY = dict(objectives=["loss", "mfu", "memory"], trials=4, tuner="grid", target="cpu:8", timeout=300,
             tokens=16384, count_flops=False)


def space():
    return fdl.Config(
        TrainConfig,
        model=fdl.Config(ModelConfig, d_model=128, n_layers=2, n_heads=8, n_kv_heads=2, head_dim=16, d_ff=384,
                         seq_len=64, mlp="gated", activation="silu", position="rope", tie_embeddings=False,
                         scan_layers=False, quantization=pg.oneof(["none", "int8"], name="quantization")),
        mesh=fdl.Config(MeshConfig, ici=mesh_shape(fsdp=8)),
        per_device_batch=pg.oneof([1, 2], name="per_device_batch"),
        optimizer=fdl.Config(OptimizerConfig, peak_lr=3e-3, warmup_steps=2),
        data=fdl.Config(DataConfig),
        steps=16,  # replaced by the token budget
        eval=fdl.Config(EvalConfig, enabled=True, max_batches=1),
        log=fdl.Config(LogConfig, every_steps=8),
    )

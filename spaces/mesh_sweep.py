"""mesh_sweep: which parallel layout trains a small Llama-style LM fastest on 8 devices, and at what memory?

The models are Llama-shaped (RoPE, SwiGLU MLP with 3 matrices, grouped-query attention with 2
K/V heads, untied embeddings, RMSNorm), only tiny, so that a trial trains in seconds on CPU.

Decisions (each a named PyGlove choice; the names are the Optuna parameters and report columns):
  mesh              every ordered factorization of 8 devices over (data, fsdp, tensor): "DxFxT"
                    (paxsearch.search.factorizations; add "stage" to AXES to search pipeline
                    stages too, with a PipelineConfig)
  model_size        two small Llama-style LMs (4 or 8 query heads, 2 K/V heads)
  per_device_batch  rows per device on the batch axes (data x fsdp)
  remat             rematerialization policy (trainer/remat.py)
  attention         "dot_product" (S x S scores in memory) or "flash" (on CPU the blockwise
                    online-softmax kernel, 32-token blocks; splash on TPU, cuDNN on GPU)
  rules             activation sharding: "default", or "sequence_parallel" (the residual
                    stream's embed dim sharded over tensor, as MaxText does)
  flags             compiler flag set (trainer/flagsets.py): "default", or "cpu_eigen_dots"
                    (XLA's own dot emitter instead of YNNPACK fusions); workers start per set
Objectives: loss (held-out eval loss after the same 8,192 training tokens in every trial, so
a small batch does not win by seeing less data; steps = tokens / (global batch x seq_len)),
MFU (higher), compiled per-device memory (lower).

The constraint leaves out meshes whose tensor axis does not divide the model's query heads
(K/V heads that do not divide are replicated over tensor), and "sequence_parallel" where the
tensor axis is 1 (it is then the same layout as "default"), so every point can run and no
two points are one config. On simulated CPU devices, fsdp-heavy meshes (1x8x1) step ~5x
slower than data parallelism: collectives between simulated devices are host memory copies.
That is a real finding of the sweep on this platform, not a bug.

Run:  paxsearch run spaces/mesh_sweep.py            (TPE, 16 trials, ~2-3 minutes on 2 cores)
      paxsearch run spaces/mesh_sweep.py --dry-run  (the space, its size, static feasibility)
"""
import fiddle as fdl
import pyglove as pg

from paxsearch.search import factorizations, mesh_of
from paxsearch.trainer.config import (
    DataConfig,
    EvalConfig,
    LogConfig,
    MeshConfig,
    ModelConfig,
    OptimizerConfig,
    TrainConfig,
)

DEVICES = 8
AXES = ("data", "fsdp", "tensor")  # the mesh decision's "DxFxT" sizes, in this order
MESHES = factorizations(DEVICES, AXES)
LLAMA_STYLE = dict(mlp="gated", activation="silu", position="rope", n_kv_heads=2, tie_embeddings=False)
MODELS = {
    "tiny": dict(d_model=64, n_layers=2, n_heads=4, head_dim=16, d_ff=192),
    "small": dict(d_model=128, n_layers=2, n_heads=8, head_dim=16, d_ff=384),
}

STUDY = dict(
    objectives=["loss", "mfu", "memory"],
    trials=16,
    tuner="tpe",
    target=f"cpu:{DEVICES}",
    memory_budget="10MiB",  # per device: larger plans are rejected after compiling, before any step
    timeout=300,
    tokens=8192,  # per trial: steps = 8192 / (global batch x 64), from 4 to 128 steps
    count_flops=False,  # layers are unrolled below, so XLA's FLOP count is exact without probes
)


def mesh_shape(text: str) -> tuple[int, ...]:
    """The full shape (config.MESH_AXES) of a mesh decision."""
    return mesh_of(text, AXES)


def constraint(d: dict) -> bool:
    """The tensor axis divides the query heads; sequence_parallel only where tensor > 1."""
    tensor = dict(zip(AXES, map(int, d["mesh"].split("x")), strict=True))["tensor"]
    return MODELS[d["model_size"]]["n_heads"] % tensor == 0 and (d["rules"] == "default" or tensor > 1)


def space():
    mesh = pg.oneof(MESHES, name="mesh")
    size = pg.oneof(list(MODELS), name="model_size")
    return fdl.Config(
        TrainConfig,
        model=fdl.Config(ModelConfig, seq_len=64, scan_layers=False, **LLAMA_STYLE, **MODELS[size],
                         attention=pg.oneof(["dot_product", "flash"], name="attention"), attention_block=32),
        mesh=fdl.Config(MeshConfig, ici=mesh_shape(mesh), rules=pg.oneof(["default", "sequence_parallel"],
                                                                        name="rules")),
        per_device_batch=pg.oneof([1, 2, 4], name="per_device_batch"),
        remat=pg.oneof(["none", "full", "minimal"], name="remat"),
        optimizer=fdl.Config(OptimizerConfig, peak_lr=3e-3, warmup_steps=2),
        data=fdl.Config(DataConfig),
        steps=20,  # replaced by the token budget
        eval=fdl.Config(EvalConfig, enabled=True, max_batches=1),
        log=fdl.Config(LogConfig, every_steps=10),
        flags=pg.oneof(["default", "cpu_eigen_dots"], name="flags"),
    )

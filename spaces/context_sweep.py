"""context_sweep: when does splitting the sequence over devices pay, on 8 devices?

A small Llama-style LM with a 512-token sequence, trained on 8 simulated CPU devices. Context
parallelism splits the sequence over the mesh axis `context` (trainer/context.py): each
device holds 2 of the 2 x context chunks (the load-balanced layout causal attention needs),
and attention all-gathers keys and values over `context`.

Decisions (named PyGlove choices):
  mesh       "CxFxT": every factorization of 8 devices over (context, fsdp, tensor) with
             context 1, 2, 4 or 8 (paxsearch.search.factorizations / mesh_of)
  attention  "dot_product" (the S x S scores in memory) or "flash" (the CPU blockwise kernel,
             blocks of 64 tokens; on TPU the splash kernel)
Objectives: loss, MFU, compiled memory.
The constraint keeps the tensor axis to divisors of the 4 heads. Other bad points are removed
by the static checks, each with its one-line reason (`--dry-run` lists them): at context 8
the 16 chunks of 32 tokens do not hold whole 64-token attention blocks.

Run:  paxsearch run spaces/context_sweep.py --dry-run
      paxsearch run spaces/context_sweep.py --trials 8
"""
import fiddle as fdl
import pyglove as pg

from paxsearch.search import factorizations, mesh_of
from paxsearch.trainer.config import EvalConfig, LogConfig, MeshConfig, ModelConfig, OptimizerConfig, TrainConfig

DEVICES = 8
AXES = ("context", "fsdp", "tensor")
MESHES = factorizations(DEVICES, AXES)

STUDY = dict(
    objectives=["loss", "mfu", "memory"],
    trials=8,
    tuner="tpe",
    target=f"cpu:{DEVICES}",
    timeout=600,
    count_flops=False,
)


def constraint(d: dict) -> bool:
    return 4 % int(d["mesh"].split("x")[2]) == 0


def space():
    mesh = pg.oneof(MESHES, name="mesh")
    attention = pg.oneof(["dot_product", "flash"], name="attention")
    return fdl.Config(
        TrainConfig,
        model=fdl.Config(ModelConfig, d_model=64, n_layers=2, n_heads=4, head_dim=16, d_ff=192, seq_len=512,
                         mlp="gated", activation="silu", position="rope", attention=attention, attention_block=64),
        mesh=fdl.Config(MeshConfig, ici=mesh_of(mesh, AXES)),
        per_device_batch=None,
        global_batch=8,  # divides over every data x fsdp size of the meshes
        optimizer=fdl.Config(OptimizerConfig, peak_lr=3e-3, warmup_steps=2),
        steps=10,
        eval=fdl.Config(EvalConfig, enabled=True, max_batches=1),
        log=fdl.Config(LogConfig, every_steps=5),
    )

"""memory_knobs_plan: which memory knobs let a ~1B model fit a v5e-16 slice at a large batch,
and at what predicted MFU, planned on a CPU machine without TPUs (plan mode, needs libtpu).

Decisions (named PyGlove choices; each is a field of the stored, exported config):
  mesh               "DxFxT" over the 16 chips (data, fsdp, tensor)
  grad_accum_steps   microbatches per step (TrainConfig.grad_accum_steps): same update,
                     1/k of the activations
  vocab_tiles        sequence chunks of the unembedding + cross-entropy (ModelConfig.vocab_tiles)
  zero1              AdamW moments sharded over data as well (OptimizerConfig.zero1)
  offload_state      AdamW moments in pinned host memory between steps (OptimizerConfig.offload_state)
  offload_params     parameters in pinned host memory between steps (TrainConfig.offload_params)
  remat_decoder_input, remat_qkv, remat_mlp
                     a custom remat policy (trainer/remat.py): per tagged tensor recompute,
                     keep on device or offload to host; q/k/v share one choice, as do the
                     MLP's input and output matmuls. TrainConfig.remat holds the canonical
                     string, e.g. "custom:decoder_input=offload,query_proj=offload,..."
Objectives: predicted MFU (higher) and compiled per-chip memory (lower).

The constraint leaves out ZeRO-1 where the data axis is 1 (it is refused there) and ZeRO-1
together with optimizer-state offload (the moments are in host memory either way).
On a CPU target the offload choices are refused in one line (the CPU has no host offload).

Run:  paxsearch run spaces/memory_knobs_plan.py --dry-run   (the space, its size, static checks)
      paxsearch run spaces/memory_knobs_plan.py             (TPE, 24 trials, compiled for v5e:4x4)
"""
import fiddle as fdl
import pyglove as pg

from paxsearch.trainer.config import EvalConfig, MeshConfig, ModelConfig, OptimizerConfig, TrainConfig
from paxsearch.trainer.remat import custom

MESHES = ["16x1x1", "2x8x1", "1x16x1"]
# ~0.94B parameters: d_model 2048, 16 layers, 16 heads of 128, d_ff 8192, vocabulary 32768
MODEL = dict(vocab_size=32768, d_model=2048, n_layers=16, n_heads=16, head_dim=128, d_ff=8192, seq_len=1024,
             dtype="bfloat16", param_dtype="float32", scan_layers=True)
REMAT_CHOICES = ["recompute", "device", "offload"]

STUDY = dict(objectives=["mfu", "memory"], tuner="tpe", trials=24, target="tpu:v5e-16", count_flops=False,
             timeout=900)


def constraint(d: dict) -> bool:
    data = int(d["mesh"].split("x")[0])
    return not d["zero1"] or (data > 1 and not d["offload_state"])


def space():
    mesh = pg.oneof(MESHES, name="mesh")
    qkv = pg.oneof(REMAT_CHOICES, name="remat_qkv")
    mlp = pg.oneof(REMAT_CHOICES, name="remat_mlp")
    remat = custom(decoder_input=pg.oneof(REMAT_CHOICES, name="remat_decoder_input"),
                   query_proj=qkv, key_proj=qkv, value_proj=qkv, mlp1=mlp, mlp2=mlp)
    return fdl.Config(
        TrainConfig,
        model=fdl.Config(ModelConfig, **MODEL, vocab_tiles=pg.oneof([1, 4], name="vocab_tiles")),
        mesh=fdl.Config(MeshConfig, ici=tuple(int(x) for x in mesh.split("x"))),
        per_device_batch=8,
        grad_accum_steps=pg.oneof([1, 2, 4], name="grad_accum_steps"),
        offload_params=pg.oneof([False, True], name="offload_params"),
        remat=remat,
        optimizer=fdl.Config(OptimizerConfig, zero1=pg.oneof([False, True], name="zero1"),
                             offload_state=pg.oneof([False, True], name="offload_state")),
        steps=100,
        eval=fdl.Config(EvalConfig, enabled=False),
    )

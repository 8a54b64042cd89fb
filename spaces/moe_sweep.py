"""moe_sweep: how to lay out a small mixture of experts on 8 devices, and what dropping tokens costs.

The model is the moe-tiny preset (paxsearch.trainer.presets: 3.18M parameters, 1.41M active per
token; one leading dense layer, then 3 MoE layers of 8 SwiGLU experts of width 256, top-2 softmax
routing, one shared expert; 128-token sequences), small enough to train on simulated CPU devices.

Decisions (named PyGlove choices; the names are the Optuna parameters and report columns):
  mesh              "ExF" over the 8 devices (expert, fsdp): the experts split over 1, 2, 4 or 8
                    devices (trainer/moe.py: tokens reach their experts by an all-gather and a
                    reduce-scatter (dropless) or an all-to-all (capacity)), the rest fsdp
  expert_compute    "dropless" (every routed token computed, grouped matmuls) or "capacity"
                    (each expert takes at most capacity_factor x its even share of a device's
                    routes; the rest are dropped)
  capacity_factor   1.0 or 2.0; only with "capacity" (the constraint keeps dropless to 1.0, which
                    it ignores)
  per_device_batch  rows of 128 tokens per device (global batch 8 or 16)
Objectives: loss (held-out eval loss after the same 16,384 training tokens in every trial), MFU
(higher; MoE model FLOPs count the router and the 2 activated experts, so a dropped route still
counts: dropping raises MFU), compiled per-device memory (lower). Every trained trial stores the
share of routes dropped over capacity (`dropped_fraction`, its last logged interval) and the
load-balancing loss; the report puts the dropped share beside MFU, and the recommendation says
when the trial it names drops tokens.
Size: 4 meshes x (dropless + capacity x 2 factors) x 2 batches = 24 points; static checks remove
none (8 experts over expert <= 8, d_model 128 over 8 devices).

Run:  paxsearch run spaces/moe_sweep.py --dry-run  (the space, its size, static feasibility)
      paxsearch run spaces/moe_sweep.py            (TPE, 8 trials, a few minutes on 2 cores)
      paxsearch report runs/moe_sweep              (Pareto front, dropped share beside MFU)
"""
import fiddle as fdl
import pyglove as pg

from paxsearch.search import preset
from paxsearch.trainer.config import EvalConfig, LogConfig, MeshConfig, OptimizerConfig, TrainConfig, mesh_shape

DEVICES = 8
MESHES = ["1x8", "2x4", "4x2", "8x1"]  # expert x fsdp

STUDY = dict(
    objectives=["loss", "mfu", "memory"],
    trials=8,
    tuner="tpe",
    target=f"cpu:{DEVICES}",
    timeout=300,
    tokens=16384,  # per trial: steps = 16384 / (global batch x 128): 16 or 8 steps
    count_flops=False,  # layers unrolled below: XLA's FLOP count is exact without probes
)


def ici(text: str) -> tuple[int, ...]:
    """'ExF' -> the mesh shape with expert E and fsdp F."""
    expert, fsdp = (int(x) for x in text.split("x"))
    return mesh_shape(expert=expert, fsdp=fsdp)


def constraint(d: dict) -> bool:
    """capacity_factor is a decision of capacity only: dropless keeps one value (ignored)."""
    return d["expert_compute"] == "capacity" or d["capacity_factor"] == 1.0


def space():
    mesh = pg.oneof(MESHES, name="mesh")
    return fdl.Config(
        TrainConfig,
        model=preset("moe-tiny", scan_layers=False,
                     expert_compute=pg.oneof(["dropless", "capacity"], name="expert_compute"),
                     capacity_factor=pg.oneof([1.0, 2.0], name="capacity_factor")),
        mesh=fdl.Config(MeshConfig, ici=ici(mesh)),
        per_device_batch=pg.oneof([1, 2], name="per_device_batch"),
        optimizer=fdl.Config(OptimizerConfig, peak_lr=3e-3, warmup_steps=4),
        steps=16,  # replaced by the token budget
        eval=fdl.Config(EvalConfig, enabled=True, max_batches=1),
        log=fdl.Config(LogConfig, every_steps=4),
    )

"""The one formula for the bytes a train step keeps of its state: parameters, gradients and the
AdamW moments, per device.

    train_state_bytes(param_count, param_dtype_bytes=4, shards=16)                 # fully sharded
    train_state_bytes(n, 4, shards, moment_shards=shards * data)                   # ZeRO-1
    train_state_bytes(n, 4, shards, offload_moments=True)                          # moments on the host

What the trainer holds (trainer/model.py, trainer/step.py): parameters in `param_dtype`, their
gradients in the same dtype, and AdamW's two moments (optax's mu and nu, in the parameters'
dtype). All of it is live at the update, since global-norm clipping needs every gradient
before any parameter changes, so this is a lower bound of a compiled step's peak (activations
and temporaries are not counted). Parameters and gradients are split over the `shards` that
split the weights; the moments over `moment_shards` (ZeRO-1: the weights' shards times the data
axis); offloaded moments live in host memory and are not counted (offloaded parameters still
come to the device for the step, so they are).
Pure arithmetic: imports nothing of JAX.
"""
from __future__ import annotations

import math

ADAMW_MOMENTS = 2  # optax.adamw: the first and second moment, each the parameters' shape and dtype


def dtype_bytes(name: str) -> int:
    """Bytes per element of a parameter dtype name ("float32", "bfloat16")."""
    return 2 if name == "bfloat16" else 4


def train_state_bytes(param_count: int, param_dtype_bytes: int, shards: int = 1, moment_shards: int | None = None,
                      offload_moments: bool = False) -> int:
    """Per-device bytes of parameters + gradients (both `param_dtype_bytes` per element, over
    `shards`) + AdamW's two moments (same dtype, over `moment_shards`, default `shards`; none when
    `offload_moments`). Each of the two terms is rounded up to whole bytes."""
    weights = math.ceil(param_count * param_dtype_bytes * 2 / max(shards, 1))  # parameters and their gradients
    if offload_moments:
        return int(weights)
    moments = math.ceil(param_count * param_dtype_bytes * ADAMW_MOMENTS / max(moment_shards or shards, 1))
    return int(weights + moments)

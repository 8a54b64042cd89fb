"""Rematerialization policies: stable names mapped to jax.checkpoint_policies.

| name          | saved for the backward pass                                     |
|---------------|-----------------------------------------------------------------|
| none          | everything (no remat)                                           |
| full          | nothing but each layer's input (nothing_saveable)               |
| dots          | every matmul output (checkpoint_dots)                           |
| dots_no_batch | matmul outputs without batch dims (dots_with_no_batch_dims_saveable) |
| qkv_proj      | the q/k/v and attention-output projections (by checkpoint_name) |
| minimal       | q/k/v, attention context, output projection and second MLP      |
|               | matmul; not the first MLP matmul nor the attention logits       |
|               | (like Paxml's SAVE_DOT_EXCEPT_LOGITS_FFN1)                      |
| offload       | the minimal set, offloaded to pinned host memory (TPU/GPU only) |

Tags (model.py): q/k/v projections (before RoPE), attention context, output projection,
MLP1 = the MLP's input matmul(s): a gated MLP's gate and up matmuls are both MLP1, so
"minimal" recomputes both; MLP2 = the MLP's output matmul. The flash attentions (CPU blockwise, TPU splash) keep
only q, k, v, their output and the row log-sum-exp for the backward pass (never S x S); the
output and log-sum-exp carry the context tag, so "minimal" keeps them and "full" recomputes
the attention forward.
"""
from __future__ import annotations

import jax

from .errors import ConfigError, UnsupportedOnPlatform

# checkpoint_name tags used in model.py
QUERY, KEY, VALUE, CONTEXT, OUT = "query_proj", "key_proj", "value_proj", "context", "out_proj"
MLP1, MLP2 = "mlp1", "mlp2"

POLICIES = ("none", "full", "dots", "dots_no_batch", "qkv_proj", "minimal", "offload")
OFFLOAD_PLATFORMS = ("tpu", "gpu", "cuda", "rocm")


def check_policy(name: str, platform: str) -> None:
    if name not in POLICIES:
        raise ConfigError(f"unknown remat policy {name!r}; choose one of {', '.join(POLICIES)}")
    if name == "offload" and platform not in OFFLOAD_PLATFORMS:
        raise UnsupportedOnPlatform(
            f"remat policy 'offload' needs host-memory offload, which platform {platform!r} lacks; "
            f"use it on TPU or GPU, or pick 'minimal' here")


def policy(name: str):
    """The jax.checkpoint policy for `name`, or None for 'none' (no remat at all)."""
    cp = jax.checkpoint_policies
    saved_minimal = (QUERY, KEY, VALUE, CONTEXT, OUT, MLP2)
    table = {
        "none": None,
        "full": cp.nothing_saveable,
        "dots": cp.checkpoint_dots,
        "dots_no_batch": cp.dots_with_no_batch_dims_saveable,
        "qkv_proj": cp.save_only_these_names(QUERY, KEY, VALUE, OUT),
        "minimal": cp.save_only_these_names(*saved_minimal),
        "offload": cp.save_and_offload_only_these_names(
            names_which_can_be_saved=[], names_which_can_be_offloaded=list(saved_minimal),
            offload_src="device", offload_dst="pinned_host"),
    }
    if name not in table:
        raise ConfigError(f"unknown remat policy {name!r}; choose one of {', '.join(POLICIES)}")
    return table[name]

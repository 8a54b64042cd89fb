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

Custom policies name a choice per tagged tensor, MaxText-style, in one string:

    "custom:decoder_input=offload,query_proj=offload,key_proj=offload,value_proj=offload"

Tensors (tags below): decoder_input (each layer's input), query_proj, key_proj, value_proj,
context, out_proj, mlp1, mlp2. Choices: recompute (the default of every tensor not named),
device (saved in device memory), offload (saved in pinned host memory: TPU/GPU only, refused
on CPU in one line). Everything untagged is recomputed. `custom(**choices)` builds the
canonical string (tensors in the order above, recompute left out), so a space makes each
tensor's choice a PyGlove decision and passes the string as TrainConfig.remat.

Tags (model.py): decoder_input (the block's input, before its first norm), q/k/v projections
(before RoPE), attention context, output projection,
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
LAYER_INPUT = "decoder_input"
QUERY, KEY, VALUE, CONTEXT, OUT = "query_proj", "key_proj", "value_proj", "context", "out_proj"
MLP1, MLP2 = "mlp1", "mlp2"
TENSORS = (LAYER_INPUT, QUERY, KEY, VALUE, CONTEXT, OUT, MLP1, MLP2)  # what a custom policy names
CHOICES = ("recompute", "device", "offload")
CUSTOM = "custom:"

POLICIES = ("none", "full", "dots", "dots_no_batch", "qkv_proj", "minimal", "offload")
OFFLOAD_PLATFORMS = ("tpu", "gpu", "cuda", "rocm")


def custom(**choices: str) -> str:
    """The canonical custom-policy string of {tensor: choice} (recompute entries left out)."""
    parse_custom(CUSTOM + ",".join(f"{t}={c}" for t, c in choices.items()))  # ConfigError on bad names
    return CUSTOM + ",".join(f"{t}={choices[t]}" for t in TENSORS if choices.get(t, "recompute") != "recompute")


def parse_custom(name: str) -> dict[str, str]:
    """{tensor: choice} of every tensor of a "custom:..." policy; ConfigError (one line) on a
    bad entry."""
    choices = dict.fromkeys(TENSORS, "recompute")
    seen = set()
    for item in filter(None, (x.strip() for x in name[len(CUSTOM):].split(","))):
        tensor, eq, choice = (x.strip() for x in item.partition("="))
        if not eq or tensor not in TENSORS or choice not in CHOICES or tensor in seen:
            raise ConfigError(
                f"bad entry {item!r} in remat policy {name!r}: write tensor=choice once per tensor, tensors "
                f"{', '.join(TENSORS)}; choices {', '.join(CHOICES)}")
        seen.add(tensor)
        choices[tensor] = choice
    return choices


def offloads(name: str) -> bool:
    """Whether policy `name` offloads anything to host memory."""
    return name == "offload" or (name.startswith(CUSTOM) and "offload" in parse_custom(name).values())


def check_policy(name: str, platform: str) -> None:
    if not isinstance(name, str) or (name not in POLICIES and not name.startswith(CUSTOM)):
        raise ConfigError(f"unknown remat policy {name!r}; choose one of {', '.join(POLICIES)}, "
                          f"or a custom policy such as 'custom:decoder_input=offload,query_proj=device'")
    if name.startswith(CUSTOM) and offloads(name) and platform not in OFFLOAD_PLATFORMS:
        raise UnsupportedOnPlatform(
            f"remat policy {name!r} offloads to host memory, which platform {platform!r} lacks; use it on TPU "
            f"or GPU, or choose recompute / device for every tensor here")
    if name == "offload" and platform not in OFFLOAD_PLATFORMS:
        raise UnsupportedOnPlatform(
            f"remat policy 'offload' needs host-memory offload, which platform {platform!r} lacks; "
            f"use it on TPU or GPU, or pick 'minimal' here")


# A pipelined stage's layer inputs (trainer/model.py PipelinedLayers): what the stage's chunk of
# layers keeps when it is rematerialized as a whole, besides what the layers' policy keeps
PIPELINE_LAYER_INPUT = "pipeline_layer_input"


def keeping(policy, *names: str):
    """`policy`, also saving the values named `names` (jax.ad_checkpoint.checkpoint_name). Unlike
    jax's save_from_both_policies it takes the offloading policies too: whatever `policy` decides
    for any other value stands, offload included."""
    named = jax.checkpoint_policies.save_only_these_names(*names)

    def combined(prim, *args, **params):
        return True if named(prim, *args, **params) else policy(prim, *args, **params)

    return combined


def policy(name: str):
    """The jax.checkpoint policy for `name`, or None for 'none' (no remat at all)."""
    cp = jax.checkpoint_policies
    if name.startswith(CUSTOM):
        choices = parse_custom(name)
        keep = [t for t in TENSORS if choices[t] == "device"]
        off = [t for t in TENSORS if choices[t] == "offload"]
        if not off:
            return cp.save_only_these_names(*keep)
        return cp.save_and_offload_only_these_names(
            names_which_can_be_saved=keep, names_which_can_be_offloaded=off,
            offload_src="device", offload_dst="pinned_host")
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

"""Context parallelism over the mesh axis `context`: the sequence split over C devices, with the
load-balanced layout that causal attention needs.

    TrainConfig(mesh=MeshConfig(ici=mesh_shape(context=2, fsdp=4)))

Activations' length dim is sharded over `context` (sharding.LOGICAL_RULES: "length"). Inside
attention each shard keeps its own queries; keys and values are all-gathered over `context`
(trainer/attention.py). A plain split would give shard C - 1 the most causal work (its queries
see the whole prefix) and shard 0 the least. So the sequence is cut into 2C chunks and shard i
holds chunks i and 2C - 1 - i (the load-balanced layout of MaxText's default context-parallel
strategy, written anew here): every shard then does the same causal work.

The step (step.make_loss_sums) puts inputs, positions, segment ids, targets and weights into
that layout at the model input; nothing is undone after, since the loss is a sum over tokens.
Attention masks causality by each token's position in the original order (`order`), so the
result is the same as context = 1 token for token. A model built with context_shards = C takes
and returns sequences in this layout.
"""
from __future__ import annotations

import numpy as np

from .config import TrainConfig
from .errors import ConfigError


def size_of(sizes: dict[str, int]) -> int:
    return int(sizes.get("context", 1))


def order(seq_len: int, context: int) -> np.ndarray:
    """order[j]: the original position of the token at position j of the load-balanced layout
    (identity for context 1)."""
    return np.asarray(reorder(np.arange(seq_len)[None], context)[0])


def reorder(x, context: int, axis: int = 1):
    """Natural order -> load-balanced layout along `axis` (numpy or jax arrays): the 2C chunks
    in the order 0, 2C-1, 1, 2C-2, ..., C-1, C, so that shard i of C holds chunks i and 2C-1-i."""
    if context <= 1:
        return x
    xp = _xp(x)
    s = x.shape[axis]
    c2 = s // (2 * context)
    shape = x.shape[:axis] + (2, context, c2) + x.shape[axis + 1:]
    halves = x.reshape(shape)  # [..., half, shard, chunk, ...]: chunk i of the first half, C + i of the second
    first = xp.take(halves, 0, axis=axis)
    second = xp.flip(xp.take(halves, 1, axis=axis), axis=axis)  # chunk 2C-1-i at shard i
    return xp.stack([first, second], axis=axis + 1).reshape(x.shape)


def restore(x, context: int, axis: int = 1):
    """The inverse of `reorder`: load-balanced layout -> natural order along `axis`."""
    if context <= 1:
        return x
    xp = _xp(x)
    s = x.shape[axis]
    c2 = s // (2 * context)
    pairs = x.reshape(x.shape[:axis] + (context, 2, c2) + x.shape[axis + 1:])  # [..., shard, which, chunk, ...]
    first = xp.take(pairs, 0, axis=axis + 1)
    second = xp.flip(xp.take(pairs, 1, axis=axis + 1), axis=axis)
    return xp.concatenate([first, second], axis=axis).reshape(x.shape)


def reorder_batch(batch: dict, context: int) -> dict:
    """Every [B, S] array of a batch in the load-balanced layout."""
    return {k: reorder(v, context) for k, v in batch.items()}


def _xp(x):
    if isinstance(x, np.ndarray):
        return np
    import jax.numpy as jnp
    return jnp


def check(cfg: TrainConfig, sizes: dict[str, int], attention_impl: str | None) -> None:
    """Static checks of a context axis > 1; ConfigError, one line each. `attention_impl` is the
    attention implementation the platform resolves (None: not known here)."""
    c, m = size_of(sizes), cfg.model
    if c <= 1:
        return
    if m.seq_len % (2 * c):
        step = 2 * c
        raise ConfigError(f"seq_len={m.seq_len} does not split into 2 x context={step} load-balanced chunks; use a "
                          f"seq_len that is a multiple of {step} (e.g. {-(-m.seq_len // step) * step}), or a smaller "
                          "context")
    chunk = m.seq_len // (2 * c)
    if attention_impl == "blockwise" and chunk % m.attention_block:
        raise ConfigError(f"blockwise attention with context={c}: each of the 2 x {c} chunks of seq_len={m.seq_len} "
                          f"holds {chunk} tokens, not a multiple of attention_block={m.attention_block}; use an "
                          f"attention_block dividing {chunk}")
    if attention_impl == "splash" and chunk % 128:
        raise ConfigError(f"splash attention with context={c}: each of the 2 x {c} chunks of seq_len={m.seq_len} "
                          f"holds {chunk} tokens, not a multiple of 128 (the kernel's tile); use a seq_len that is a "
                          f"multiple of {256 * c}, or a smaller context")
    if attention_impl == "cudnn":
        raise ConfigError(f"context={c} is not implemented for cuDNN attention; use attention='dot_product' or "
                          "context 1 on GPU")
    if m.vocab_tiles > 1 and (m.seq_len // m.vocab_tiles) % c:
        raise ConfigError(f"vocab_tiles={m.vocab_tiles} cuts seq_len={m.seq_len} into chunks of "
                          f"{m.seq_len // m.vocab_tiles} tokens, which do not split over context={c}; use vocab_tiles "
                          f"dividing {m.seq_len // c}")

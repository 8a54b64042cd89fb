"""Vocab tiling: the unembedding and the cross-entropy over sequence chunks, one at a time.

An untiled loss holds the B x S x V logits (and, for the backward pass, their softmax): at
a 128k vocabulary that is often the largest tensor of the step. With ModelConfig.vocab_tiles
= T the final hidden states are cut into T chunks of S / T positions; a jax.lax.scan computes
one chunk's logits, log-sum-exp and target logits at a time. The chunk function is under
jax.checkpoint (nothing saved), so the backward pass recomputes each chunk's logits from
its hidden states and never holds more than B x S/T x V either. Same loss and gradients as
untiled; the extra unembedding forward is hardware FLOPs (HFU), not model FLOPs.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from . import sharding
from .config import ModelConfig
from .errors import ConfigError
from .xent import token_xent


def check(m: ModelConfig) -> None:
    t = m.vocab_tiles
    if not isinstance(t, int) or isinstance(t, bool) or t < 1:
        raise ConfigError(f"model.vocab_tiles must be an integer >= 1, got {t!r}")
    if m.seq_len % t:
        raise ConfigError(f"model.vocab_tiles={t} does not divide seq_len={m.seq_len}; use a divisor of {m.seq_len}")


def unembedding(params, m: ModelConfig):
    """The (E, V) unembedding matrix of a TransformerLM's (unboxed) parameters."""
    if m.tie_embeddings:
        return params["embed"]["embedding"].T
    return params["unembed"]["kernel"]


def token_losses(logits_BSV, targets_BS, weights_BS):
    """(sum of weighted token losses, sum of weights); logits taken in float32, and no float32
    copy of them kept for the backward pass (trainer/xent.py)."""
    return jnp.sum(token_xent(logits_BSV, targets_BS) * weights_BS), jnp.sum(weights_BS)


def tiled_loss_sums(hidden_BSE, unembed_EV, targets_BS, weights_BS, tiles: int, dtype, unroll: bool = False,
                    batch_axis: str = "batch"):
    """token_losses of hidden_BSE @ unembed_EV, computed over `tiles` sequence chunks.
    `unroll` unrolls the chunk loop (for XLA's cost analysis, which counts a loop body once);
    `batch_axis`: the logical batch axis of the chunks' logits (the model's head_batch)."""
    b, s, e = hidden_BSE.shape
    c = s // tiles

    def chunks(x):  # (B, S, ...) -> (T, B, S/T, ...)
        return x.reshape(b, tiles, c, *x.shape[2:]).swapaxes(0, 1)

    @jax.checkpoint  # default policy: nothing saved, the backward recomputes the chunk's logits
    def chunk_sums(h_BCE, t_BC, w_BC):
        logits_BCV = jnp.dot(h_BCE.astype(dtype), unembed_EV.astype(dtype))
        logits_BCV = sharding.constrain(logits_BCV, (batch_axis, "length", "act_vocab"))
        return token_losses(logits_BCV, t_BC, w_BC)

    def body(carry, xs):
        l, w = chunk_sums(*xs)
        return (carry[0] + l, carry[1] + w), None

    init = (jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32))
    (loss_sum, weight_sum), _ = jax.lax.scan(
        body, init, (chunks(hidden_BSE), chunks(targets_BS), chunks(weights_BS)), unroll=tiles if unroll else 1)
    return loss_sum, weight_sum

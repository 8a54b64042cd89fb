"""Token cross-entropy whose backward pass keeps the logits in their own dtype.

The loss is taken in float32 (logsumexp and the target's logit over a float32 view of the
logits). Differentiated by JAX as written, the float32 view (`logits.astype(float32)`) is a
residual of the backward pass: with bfloat16 logits XLA keeps a float32 copy of the whole
B x S x V tensor alive from the forward to the backward pass, twice the bytes of the logits
themselves (at B x S = 5 x 8192 tokens per chip and a 128256 vocabulary, 19.6 GiB beside the
9.8 GiB bfloat16 logits: the largest buffer of the Llama3.1-70B recipe's step on v6e-256,
benchmarks/RESULTS.md). Here the backward pass saves only the logits as they came (bfloat16)
and the float32 log-sum-exp per token (B x S), and recomputes the softmax in float32 inside
its own elementwise expression: (softmax(logits) - onehot(target)) x g, cast to the logits'
dtype. The target's logit is a masked sum, not a gather: on v6e the TPU compiler offloads a
gather to the SparseCore and materializes the float32 logits it gathers from (seen in the
same step: with the gather, the float32 copy stayed; with the masked sum, it is gone). Same
loss and the same gradient (float32 arithmetic throughout; the cotangent is cast to the
logits' dtype exactly as the transpose of `astype` casts it).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def _is_target(logits_BSV, targets_BS):
    return jnp.arange(logits_BSV.shape[-1], dtype=targets_BS.dtype) == targets_BS[..., None]


def _losses(logits_BSV, targets_BS):
    x = logits_BSV.astype(jnp.float32)
    lse_BS = jax.nn.logsumexp(x, axis=-1)
    # the target's logit as a masked sum (one non-zero term: exact), a reduction XLA fuses with
    # the log-sum-exp's; a gather (take_along_axis) makes the TPU compiler materialize the float32
    # logits for its SparseCore gather offload
    target_BS = jnp.sum(jnp.where(_is_target(logits_BSV, targets_BS), x, 0.0), axis=-1)
    return lse_BS - target_BS, lse_BS


@jax.custom_vjp
def token_xent(logits_BSV, targets_BS):
    """Per-token cross-entropy (float32, B x S) of logits B x S x V against integer targets."""
    return _losses(logits_BSV, targets_BS)[0]


def _fwd(logits_BSV, targets_BS):
    loss_BS, lse_BS = _losses(logits_BSV, targets_BS)
    return loss_BS, (logits_BSV, targets_BS, lse_BS)


def _bwd(res, g_BS):
    logits_BSV, targets_BS, lse_BS = res
    p_BSV = jnp.exp(logits_BSV.astype(jnp.float32) - lse_BS[..., None])
    d_BSV = (p_BSV - _is_target(logits_BSV, targets_BS).astype(jnp.float32)) * g_BS[..., None]
    return d_BSV.astype(logits_BSV.dtype), None


token_xent.defvjp(_fwd, _bwd)

"""Quantized training: the decoder layers' projections as int8 x int8 -> int32 matmuls.

ModelConfig.quantization:
  "none"      every matmul in the compute dtype (the default).
  "int8"      the forward matmul and both backward matmuls (input and weight gradients) of
              every dense projection of the decoder layers (attention query, key, value, out;
              the MLP's input, gate, up and output matrices) in int8 with int32 accumulation,
              as AQT's int8 config (MaxText `quantization: int8`) does.
  "int8_fwd"  the forward matmul in int8, both backward matmuls in the compute dtype.
The embedding, the unembedding (tied or not) and attention's own QK^T / AV products stay in
the compute dtype, as in MaxText. Model FLOPs and MFU do not change (MFU against the bf16
peak, MaxText's convention: trainer/flops.py).

Scales: symmetric, round-to-nearest, 127 levels each side, one scale per row of each operand
along its non-contracted dims: per token for the activations (forward: over the input
features), per output channel for the weights; in the backward pass per token for the
output gradient of the input-gradient matmul, and per channel (over the tokens) for both
operands of the weight-gradient matmul. A scale is the row's absolute max, so nothing
clips, and the rounding passes its gradient straight through (STE): the backward pass is
the float one with its operands rounded. Gradients are rounded to nearest, not
stochastically (AQT's int8 config adds uniform noise to them; the loss test in
tests/trainer/test_quant.py bounds what that leaves out on the synthetic task).
Residuals are the float operands (requantized along the backward's axes), so a quantized
projection keeps what the float one keeps for its backward pass.

Why not a library: Qwix 0.1.8 and AQT (aqtp 0.9.0) both install beside jax 0.10.2 / flax
0.12.8 without changing them, and Qwix's quantize_model does emit s8 dots on a flax Dense.
But Qwix quantizes a model by intercepting its dot_general / einsum calls matched by module
path regexes, which runs against this project's one-config, no-metaprogramming style and has
to reach the Block templates PipelinedLayers applies under vmap; AQT is in maintenance
(MaxText moved to Qwix); and the math needed here is three dot_generals with
preferred_element_type=int32 under one custom_vjp, without a new dependency of the trainer.

fp8 is refused: none of TPU v5e, v5p, v6e runs fp8 matmuls above the bf16 rate (NVIDIA
H100 / H200 and later and TPU v7 do).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import jax
import jax.numpy as jnp

from .config import QUANTIZATIONS, ModelConfig
from .errors import ConfigError

FP8_CHIPS = "NVIDIA H100 / H200 and later, TPU v7 (Ironwood)"
LEVELS = 127.0  # symmetric int8: -127..127 (-128 unused, so the range is symmetric)


def check(m: ModelConfig) -> None:
    """One ConfigError line for a quantization this trainer cannot run."""
    q = m.quantization
    if isinstance(q, str) and q.lower().startswith("fp8"):
        raise ConfigError(f"model.quantization={q!r}: fp8 matmuls run no faster than bf16 on TPU v5e, v5p and v6e, "
                          f"so this trainer does not offer them (fp8 runs natively on {FP8_CHIPS}); "
                          f"choose one of {', '.join(QUANTIZATIONS)}")
    if q not in QUANTIZATIONS:
        raise ConfigError(f"unknown model.quantization {q!r}; choose one of {', '.join(QUANTIZATIONS)}")


def quantize(a, axes: Sequence[int]):
    """(int8 values, float32 scale): `a` ~= values * scale, one scale per row along `axes`
    (the scale keeps `axes` as size-1 dims)."""
    a32 = a.astype(jnp.float32)
    amax = jnp.max(jnp.abs(a32), axis=tuple(axes), keepdims=True)
    scale = jnp.where(amax > 0, amax, 1.0) / LEVELS
    return jnp.clip(jnp.round(a32 / scale), -LEVELS, LEVELS).astype(jnp.int8), scale


def int8_matmul(a, b, a_axes: Sequence[int], b_axes: Sequence[int], dtype):
    """dot_general(a, b) contracting a's `a_axes` with b's `b_axes` (no batch dims), as int8 x
    int8 -> int32, rescaled to `dtype`. Output dims: a's free dims, then b's, in order."""
    qa, sa = quantize(a, a_axes)
    qb, sb = quantize(b, b_axes)
    acc = jax.lax.dot_general(qa, qb, ((tuple(a_axes), tuple(b_axes)), ((), ())),
                              preferred_element_type=jnp.int32)
    a_free = [d for d in range(a.ndim) if d not in a_axes]
    b_free = [d for d in range(b.ndim) if d not in b_axes]
    sa_free = sa.reshape([a.shape[d] for d in a_free] + [1] * len(b_free))
    sb_free = sb.reshape([b.shape[d] for d in b_free])
    return (acc.astype(jnp.float32) * sa_free * sb_free).astype(dtype)


def _float_matmul(a, b, a_axes, b_axes, dtype):
    return jax.lax.dot_general(a, b, ((tuple(a_axes), tuple(b_axes)), ((), ())),
                               preferred_element_type=jnp.float32).astype(dtype)


@partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def qdot(x, w, n: int, bwd_int8: bool):
    """tensordot(x, w, n): x[*B, *I] . w[*I, *O] -> [*B, *O], forward in int8 (per-token
    scales of x, per-channel scales of w); backward matmuls in int8 when `bwd_int8`, else in
    x's dtype. Gradients pass the rounding straight through."""
    return int8_matmul(x, w, range(x.ndim - n, x.ndim), range(n), x.dtype)


def _qdot_fwd(x, w, n, bwd_int8):
    return qdot(x, w, n, bwd_int8), (x, w)


def _qdot_bwd(n, bwd_int8, res, g):
    x, w = res
    n_b, n_o = x.ndim - n, w.ndim - n
    matmul = int8_matmul if bwd_int8 else _float_matmul
    # dx[*B, *I] = g[*B, *O] . w[*I, *O] over O: per-token scales of g, per-input-channel of w
    dx = matmul(g, w, range(n_b, n_b + n_o), range(n, n + n_o), x.dtype)
    # dw[*I, *O] = x[*B, *I] . g[*B, *O] over the tokens B: per-channel scales of both
    dw = matmul(x, g, range(n_b), range(n_b), w.dtype)
    return dx, dw


qdot.defvjp(_qdot_fwd, _qdot_bwd)


def dot_general(mode: str) -> Callable:
    """A `lax.dot_general` stand-in for nn.DenseGeneral(dot_general=...) in quantization
    `mode` ("int8" or "int8_fwd"): contracts the input's last dims with the kernel's first."""

    def fn(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None):
        (lc, rc), (lb, rb) = dimension_numbers
        n = len(lc)
        if lb or rb or tuple(lc) != tuple(range(lhs.ndim - n, lhs.ndim)) or tuple(rc) != tuple(range(n)):
            raise ValueError(f"quantized dot_general contracts the input's last dims with the kernel's first, "
                             f"without batch dims; got {dimension_numbers}")
        return qdot(lhs, rhs, n, mode == "int8")

    return fn


def tensordot(x, w, n: int, mode: str):
    """jnp.tensordot(x, w, axes=n) in quantization `mode` ("none": the float one)."""
    if mode == "none":
        return jnp.tensordot(x, w, axes=n)
    return qdot(x, w, n, mode == "int8")

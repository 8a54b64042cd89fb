"""trainer/xent.py: the cross-entropy's backward pass keeps no float32 copy of bfloat16 logits,
with the loss and gradient of the plain formula."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from paxsearch.trainer.xent import token_xent

B, S, V = 2, 16, 512


def plain(logits, targets):
    x = logits.astype(jnp.float32)
    return jax.nn.logsumexp(x, axis=-1) - jnp.take_along_axis(x, targets[..., None], -1)[..., 0]


def _inputs(dtype):
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
    logits = (3 * jax.random.normal(k1, (B, S, V))).astype(dtype)
    targets = jax.random.randint(k2, (B, S), 0, V)
    weights = jax.random.uniform(k3, (B, S))
    return logits, targets, weights


def _weighted(fn, targets, w):
    return jax.value_and_grad(lambda x: jnp.sum(fn(x, targets) * w))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["float32", "bfloat16"])
def test_same_loss_and_gradient_as_the_plain_formula(dtype):
    logits, targets, w = _inputs(dtype)
    ours = _weighted(token_xent, targets, w)(logits)
    ref = _weighted(plain, targets, w)(logits)
    np.testing.assert_allclose(ours[0], ref[0], rtol=1e-6)
    assert ours[1].dtype == dtype
    if dtype == jnp.float32:
        np.testing.assert_allclose(ours[1], ref[1], rtol=1e-6, atol=1e-7)
    else:  # bfloat16: the float32 cotangent rounded once, as the transpose of astype rounds it
        diff = np.abs(np.asarray(ours[1], np.float32) - np.asarray(ref[1], np.float32))
        assert diff.max() <= 2 ** -8 * np.abs(np.asarray(ref[1], np.float32)).max()


def _float32_logit_residuals(fn, logits, targets):
    """The float32 B x S x V arrays the backward pass keeps (jax.vjp's function holds its
    residuals as pytree leaves)."""
    _, backward = jax.vjp(lambda x: fn(x, targets), logits)
    return [r for r in jax.tree.leaves(backward) if r.shape == (B, S, V) and r.dtype == jnp.float32]


def test_backward_pass_saves_no_float32_copy_of_bfloat16_logits():
    logits, targets, _ = _inputs(jnp.bfloat16)
    assert _float32_logit_residuals(plain, logits, targets)  # the plain formula keeps one
    assert not _float32_logit_residuals(token_xent, logits, targets)

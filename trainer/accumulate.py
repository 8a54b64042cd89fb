"""Gradient accumulation: one train step as k microbatches of global_batch / k rows.

Each microbatch runs its own forward and backward pass (a jax.lax.scan over microbatches,
so only one microbatch's activations are live at a time); the gradients of the summed token
losses are added up and divided once by the step's total token weight, so the loss and the
update equal those of one batch of all the rows (TrainConfig.grad_accum_steps).

Microbatch j holds the rows j, j + k, j + 2k, ... of the global batch. Each device holds a
contiguous block of global_batch / devices rows, so when k divides that block every device
keeps a share of every microbatch and the split moves no data between devices.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from . import mesh as mesh_lib
from . import sharding
from .config import TrainConfig
from .errors import ConfigError


def check(cfg: TrainConfig, num_devices: int) -> None:
    """grad_accum_steps >= 1, and the global batch splits into that many microbatches that
    still divide over the batch axes; ConfigError (one line) otherwise."""
    k = cfg.grad_accum_steps
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ConfigError(f"grad_accum_steps must be an integer >= 1, got {k!r}")
    if k == 1:
        return
    sizes = mesh_lib.axis_sizes(cfg.mesh, num_devices)
    batch_devices = 1
    for axis in mesh_lib.BATCH_AXES:
        batch_devices *= sizes[axis]
    gb = mesh_lib.global_batch_size(cfg, num_devices)
    if gb % (k * batch_devices):
        raise ConfigError(
            f"global batch {gb} does not split into grad_accum_steps={k} microbatches that divide over the "
            f"{batch_devices} devices of the batch axes; use a global batch that is a multiple of "
            f"{k * batch_devices} (k x batch devices) or a grad_accum_steps dividing {gb // batch_devices}")


def split(batch: dict, k: int) -> dict:
    """(B, ...) arrays -> (k, B / k, ...): microbatch j holds rows j, j + k, ... (see above)."""
    def one(x):
        micro = x.reshape(x.shape[0] // k, k, *x.shape[1:]).swapaxes(0, 1)
        return sharding.constrain(micro, (None, "batch", "length")[:micro.ndim])
    return jax.tree.map(one, batch)


def value_and_grad(loss_sums, params, batch: dict, k: int, unroll: bool = False):
    """(loss, grads) of the mean token loss over `batch`, computed over k microbatches.

    `loss_sums(params, batch) -> (sum of weighted token losses, sum of weights)`. Gradients
    are accumulated in float32 and returned in the parameters' dtypes. `unroll` unrolls the
    microbatch loop (XLA's cost analysis counts a loop body once; the FLOP probes unroll)."""
    grad_fn = jax.value_and_grad(loss_sums, has_aux=True)

    def body(carry, micro):
        g_acc, l_acc, w_acc = carry
        (l, w), g = grad_fn(params, micro)
        g_acc = jax.tree.map(lambda a, b: a + b.astype(jnp.float32), g_acc, g)
        return (g_acc, l_acc + l, w_acc + w), None

    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    init = (zeros, jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32))
    (g_sum, l_sum, w_sum), _ = jax.lax.scan(body, init, split(batch, k), unroll=k if unroll else 1)
    denom = jnp.maximum(w_sum, 1.0)
    grads = jax.tree.map(lambda g, p: (g / denom).astype(p.dtype), g_sum, params)
    return l_sum / denom, grads

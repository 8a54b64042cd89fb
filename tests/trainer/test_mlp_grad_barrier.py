"""The MLP-gradient fusion barrier (XLA:CPU speed, benchmarks/RESULTS.md "Trainer vs MaxText"):
it changes how XLA fuses the backward pass, never the values."""
import dataclasses

import jax
import jax.numpy as jnp
import pytest

from paxsearch.trainer import plan as plan_lib
from paxsearch.trainer import step as step_lib
from paxsearch.trainer.config import ModelConfig, TrainConfig

TINY = ModelConfig(vocab_size=128, d_model=32, n_layers=2, n_heads=4, head_dim=8, d_ff=64, seq_len=32,
                   attention="dot_product")
FAMILY = {
    "dense_gelu": TINY,
    "swiglu": dataclasses.replace(TINY, mlp="gated", activation="silu", position="rope"),
}


def _loss_and_grads(cfg: TrainConfig, barrier: bool, remat: str):
    cfg = dataclasses.replace(cfg, remat=remat)
    model = step_lib.make_model(cfg).clone(attention_impl="dot_product", mlp_grad_barrier=barrier)
    tokens = jax.random.randint(jax.random.key(1), (2, cfg.model.seq_len), 1, cfg.model.vocab_size)
    positions = jnp.broadcast_to(jnp.arange(cfg.model.seq_len), tokens.shape)
    segments = jnp.ones_like(tokens)
    # jitted: an eager Flax init of the scanned model compiles op by op (~20 CPU-s here)
    init = jax.jit(lambda: model.init(jax.random.key(0), tokens, positions, segments)["params"])
    params = step_lib.unbox(init())

    def loss(p):
        logits = model.apply({"params": p}, tokens, positions, segments)
        return step_lib.weighted_xent(logits, jnp.roll(tokens, -1, 1), jnp.ones(tokens.shape))[0]

    grad_fn = jax.jit(jax.value_and_grad(loss))
    return grad_fn(params), str(jax.make_jaxpr(jax.grad(loss))(params))


@pytest.mark.parametrize("remat,name", [
    ("none", "dense_gelu"),  # the other three: quick-loop budget (issue 18), each compiles twice; CI runs them
    *[pytest.param(r, n, marks=pytest.mark.slow) for r, n in (("none", "swiglu"), ("full", "dense_gelu"),
                                                              ("full", "swiglu"))]])
def test_barrier_keeps_loss_and_gradients(name, remat):
    cfg = TrainConfig(model=FAMILY[name])
    (loss0, g0), jaxpr0 = _loss_and_grads(cfg, False, remat)
    (loss1, g1), jaxpr1 = _loss_and_grads(cfg, True, remat)
    assert "optimization_barrier" in jaxpr1 and "optimization_barrier" not in jaxpr0
    assert float(loss1) == float(loss0)
    for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1), strict=True):
        assert jnp.allclose(a, b, rtol=1e-6, atol=1e-7), float(jnp.max(jnp.abs(a - b)))


def test_barrier_only_where_xla_cpu_needs_it():
    cfg = TrainConfig(model=FAMILY["swiglu"])
    assert plan_lib.make_model(cfg, "cpu").mlp_grad_barrier
    assert not plan_lib.make_model(cfg, "gpu").mlp_grad_barrier

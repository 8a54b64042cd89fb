"""The optimizer, the loss, and the pure train / eval step functions."""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from . import accumulate, sharding
from . import context as context_lib
from . import moe as moe_lib
from . import vocab_tiling as tiling
from .config import OptimizerConfig, TrainConfig
from .model import DTYPES, TransformerLM


def learning_rate_schedule(opt: OptimizerConfig, total_steps: int) -> optax.Schedule:
    decay = opt.decay_steps or total_steps
    warmup = min(opt.warmup_steps, max(decay - 1, 0))
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=opt.peak_lr, warmup_steps=warmup,
        decay_steps=max(decay, warmup + 1), end_value=opt.peak_lr * opt.end_lr_ratio)


def make_optimizer(opt: OptimizerConfig, total_steps: int) -> optax.GradientTransformation:
    decay_mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)
    return optax.chain(
        optax.clip_by_global_norm(opt.clip_norm),
        optax.adamw(learning_rate_schedule(opt, total_steps), b1=opt.b1, b2=opt.b2, eps=opt.eps,
                    weight_decay=opt.weight_decay, mask=decay_mask),
    )


def make_model(cfg: TrainConfig) -> TransformerLM:
    return TransformerLM(cfg.model, remat=cfg.remat)


def init_state(cfg: TrainConfig, model: TransformerLM, tx, rng):
    """{params, opt_state, step}, with parameters still boxed in their logical axis names."""
    m = cfg.model
    tokens = jnp.zeros((1, m.seq_len), jnp.int32)
    params = model.init(rng, tokens, tokens, jnp.ones_like(tokens))["params"]
    return {"params": params, "opt_state": tx.init(params), "step": jnp.zeros((), jnp.int32)}


weighted_xent = tiling.token_losses  # (sum of weighted token losses, sum of weights)


def make_loss_sums(model: TransformerLM, unroll: bool = False, moe_stats: bool = False):
    """`loss_sums(params, batch) -> (sum of weighted token losses, sum of weights)`, through
    vocab tiling when model.cfg.vocab_tiles > 1 (trainer/vocab_tiling.py). With `moe_stats` (a
    mixture-of-experts model) it returns (loss sum, weight sum, {moe.STATS name: value})."""
    m = model.cfg

    def loss_sums(params, batch):
        if model.context_shards > 1:  # the load-balanced layout of context parallelism; the loss is a token sum
            batch = {k: sharding.constrain(v, ("batch", "length"))
                     for k, v in context_lib.reorder_batch(batch, model.context_shards).items()}
        args = (batch["inputs"], batch["positions"], batch["segment_ids"])
        stats: dict = {}

        def apply(*a, **kw):
            if not m.n_experts:
                return model.apply({"params": params}, *a, **kw)
            out, sown = model.apply({"params": params}, *a, mutable=[moe_lib.COLLECTION], **kw)
            # nothing sown where no layer is MoE (plan.py's 1-layer FLOP probe of a model with a leading dense layer)
            sown = sown.get(moe_lib.COLLECTION, {})
            stats.update({k: sown[k][0] if k in sown else jnp.zeros((), jnp.float32) for k in moe_lib.STATS})
            return out

        if m.vocab_tiles > 1:
            hidden = apply(*args, return_hidden=True)
            sums = tiling.tiled_loss_sums(hidden, tiling.unembedding(params, m), batch["targets"], batch["weights"],
                                          m.vocab_tiles, DTYPES[m.dtype], unroll, model.head_batch)
        else:
            sums = weighted_xent(apply(*args), batch["targets"], batch["weights"])
        return (*sums, stats) if moe_stats else sums

    return loss_sums


def make_moe_objective(model: TransformerLM, unroll: bool = False):
    """`objective(params, batch) -> (training objective, (mean token loss, MoE stats))` of a
    mixture-of-experts model: the mean token loss + load_balance_weight x the load-balancing loss
    (+ the routing bias's objective, of value 0: trainer/moe.py)."""
    m = model.cfg
    sums = make_loss_sums(model, unroll, moe_stats=True)

    def objective(params, batch):
        loss_sum, weight_sum, stats = sums(params, batch)
        loss = loss_sum / jnp.maximum(weight_sum, 1.0)
        total = loss + m.load_balance_weight * stats["load_balance_loss"] + stats["routing_bias_objective"]
        return total, (loss, stats)

    return objective


def make_train_step(model: TransformerLM, tx, schedule, grad_accum_steps: int = 1, unroll: bool = False,
                    device_shardings=None, grad_shardings=None):
    """The train step; `grad_accum_steps` microbatches per step (trainer/accumulate.py).
    `unroll`: microbatch and vocab-tile loops unrolled (for XLA's cost analysis only).
    `device_shardings`: the state's shardings in device memory, where some of it is stored in
    host memory between steps; `grad_shardings`: a constraint on the gradients (ZeRO-1).
    Both from trainer/placement.py."""
    loss_sums = make_loss_sums(model, unroll)

    def loss_fn(params, batch):
        loss_sum, weight_sum = loss_sums(params, batch)
        return loss_sum / jnp.maximum(weight_sum, 1.0)

    def train_step(state, batch):
        if device_shardings is not None:  # offloaded arrays come to the device for the step
            state = jax.device_put(state, device_shardings)
        moe_metrics = {}
        if model.cfg.n_experts:  # one microbatch (moe.check_train refuses gradient accumulation)
            (_, (loss, stats)), grads = jax.value_and_grad(make_moe_objective(model, unroll), has_aux=True)(
                state["params"], batch)
            moe_metrics = {"load_balance_loss": stats["load_balance_loss"],
                           "dropped_fraction": stats["dropped_fraction"]}
        elif grad_accum_steps > 1:
            loss, grads = accumulate.value_and_grad(loss_sums, state["params"], batch, grad_accum_steps, unroll)
        else:
            loss, grads = jax.value_and_grad(loss_fn)(state["params"], batch)
        if grad_shardings is not None:
            grads = jax.lax.with_sharding_constraint(grads, grad_shardings)
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        metrics = {
            "loss": loss,
            "grad_norm": optax.global_norm(grads),
            "param_norm": optax.global_norm(params),
            "learning_rate": schedule(state["step"]),
            **moe_metrics,
        }
        return {"params": params, "opt_state": opt_state, "step": state["step"] + 1}, metrics

    return train_step


def make_eval_step(model: TransformerLM):
    return make_loss_sums(model)


def unbox(tree):
    """Strip the logical-axis boxes (shardings come from the jit's in/out shardings)."""
    is_box = lambda x: isinstance(x, nn.meta.AxisMetadata)
    return jax.tree.map(lambda x: x.unbox(apply_constraint=False) if is_box(x) else x, tree, is_leaf=is_box)

"""Decoder-only Transformer LM in Flax Linen, with logical axis names on every parameter
and on the main activations (see sharding.LOGICAL_RULES for their mesh axes)."""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from . import remat as remat_lib
from .config import ModelConfig

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
# Not counted in model FLOPs. On XLA:CPU tanh is slow: gelu costs ~40% of a d_model=512 step
# there, relu almost nothing (benchmarks/RESULTS.md).
ACTIVATIONS = {
    "gelu": jax.nn.gelu,
    "gelu_exact": lambda x: jax.nn.gelu(x, approximate=False),
    "silu": jax.nn.silu,
    "relu": jax.nn.relu,
}


def _init(names, scale=1.0):
    return nn.with_logical_partitioning(nn.initializers.variance_scaling(scale, "fan_in", "truncated_normal"), names)


class RMSNorm(nn.Module):
    cfg: ModelConfig

    @nn.compact
    def __call__(self, x):
        scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones, ("norm",)),
                           (x.shape[-1],), DTYPES[self.cfg.param_dtype])
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-6)
        return (y * scale.astype(jnp.float32)).astype(x.dtype)


class Proj(nn.Module):
    """x[..., *in_dims] @ kernel[*in_dims, *features]. Unlike nn.DenseGeneral it creates the
    kernel in its final shape, so its logical-axis constraint applies under a mesh."""

    in_dims: tuple[int, ...]
    features: tuple[int, ...]
    names: tuple[str, ...]
    cfg: ModelConfig

    @nn.compact
    def __call__(self, x):
        n_in = len(self.in_dims)
        init = nn.initializers.variance_scaling(
            1.0, "fan_in", "truncated_normal", in_axis=tuple(range(n_in)),
            out_axis=tuple(range(n_in, n_in + len(self.features))))
        kernel = self.param("kernel", nn.with_logical_partitioning(init, self.names),
                            self.in_dims + self.features, DTYPES[self.cfg.param_dtype])
        return jnp.tensordot(x.astype(DTYPES[self.cfg.dtype]), kernel.astype(DTYPES[self.cfg.dtype]), axes=n_in)


class Block(nn.Module):
    """Pre-norm attention + MLP. Carry-style signature for nn.scan."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, x_BSE, segment_ids_BS):
        c = self.cfg
        # Causal attention within each packed segment (segment id 0 is padding).
        q_idx, k_idx = jnp.arange(c.seq_len)[:, None], jnp.arange(c.seq_len)[None, :]
        mask_BQK = (q_idx >= k_idx)[None] & (segment_ids_BS[:, :, None] == segment_ids_BS[:, None, :])
        dt, pdt = DTYPES[c.dtype], DTYPES[c.param_dtype]
        dense = lambda feats, axis, names, name: nn.DenseGeneral(
            feats, axis=axis, use_bias=False, dtype=dt, param_dtype=pdt, kernel_init=_init(names), name=name)

        h = RMSNorm(c, name="attn_norm")(x_BSE)
        qkv = lambda name: Proj((c.d_model,), (c.n_heads, c.head_dim), ("embed", "heads", "kv"), c, name=name)(h)
        q_BSHD = checkpoint_name(qkv("query"), remat_lib.QUERY)
        k_BSHD = checkpoint_name(qkv("key"), remat_lib.KEY)
        v_BSHD = checkpoint_name(qkv("value"), remat_lib.VALUE)
        act = ("batch", "length", "act_heads", "act_kv")
        q_BSHD, k_BSHD, v_BSHD = (nn.with_logical_constraint(t, act) for t in (q_BSHD, k_BSHD, v_BSHD))

        logits_BHQK = jnp.einsum("bqhd,bkhd->bhqk", q_BSHD, k_BSHD).astype(jnp.float32) * (c.head_dim ** -0.5)
        logits_BHQK = jnp.where(mask_BQK[:, None], logits_BHQK, jnp.finfo(jnp.float32).min)
        probs_BHQK = jax.nn.softmax(logits_BHQK, axis=-1).astype(dt)
        attn_BSHD = jnp.einsum("bhqk,bkhd->bqhd", probs_BHQK, v_BSHD)
        attn_BSHD = checkpoint_name(nn.with_logical_constraint(attn_BSHD, act), remat_lib.CONTEXT)
        out_BSE = checkpoint_name(Proj((c.n_heads, c.head_dim), (c.d_model,), ("heads", "kv", "embed"), c,
                                       name="out")(attn_BSHD), remat_lib.OUT)
        x_BSE = nn.with_logical_constraint(x_BSE + out_BSE, ("batch", "length", "act_embed"))

        h = RMSNorm(c, name="mlp_norm")(x_BSE)
        ff_BSF = checkpoint_name(dense(c.d_ff, -1, ("embed", "mlp"), "mlp_in")(h), remat_lib.MLP1)
        ff_BSF = nn.with_logical_constraint(ACTIVATIONS[c.activation](ff_BSF), ("batch", "length", "act_mlp"))
        ff_BSE = checkpoint_name(dense(c.d_model, -1, ("mlp", "embed"), "mlp_out")(ff_BSF), remat_lib.MLP2)
        x_BSE = nn.with_logical_constraint(x_BSE + ff_BSE, ("batch", "length", "act_embed"))
        return x_BSE, None


class TransformerLM(nn.Module):
    cfg: ModelConfig
    remat: str = "none"

    @nn.compact
    def __call__(self, tokens_BS, positions_BS, segment_ids_BS):
        c = self.cfg
        dt, pdt = DTYPES[c.dtype], DTYPES[c.param_dtype]
        embed = nn.Embed(c.vocab_size, c.d_model, dtype=dt, param_dtype=pdt, name="embed",
                         embedding_init=nn.with_logical_partitioning(nn.initializers.normal(1.0), ("vocab", "embed")))
        pos_embed = nn.Embed(c.seq_len, c.d_model, dtype=dt, param_dtype=pdt, name="pos_embed",
                             embedding_init=nn.with_logical_partitioning(nn.initializers.normal(0.02), (None, "embed")))
        x_BSE = embed(tokens_BS) + pos_embed(positions_BS)
        x_BSE = nn.with_logical_constraint(x_BSE.astype(dt), ("batch", "length", "act_embed"))

        block = Block
        pol = remat_lib.policy(self.remat)
        if self.remat != "none":
            block = nn.remat(Block, policy=pol, prevent_cse=not c.scan_layers)
        if c.scan_layers:
            stack = nn.scan(block, variable_axes={"params": 0}, split_rngs={"params": True},
                            in_axes=nn.broadcast, length=c.n_layers,
                            metadata_params={nn.PARTITION_NAME: "layers"})(c, name="layers")
            x_BSE, _ = stack(x_BSE, segment_ids_BS)
        else:
            for i in range(c.n_layers):
                x_BSE, _ = block(c, name=f"layer_{i}")(x_BSE, segment_ids_BS)

        x_BSE = RMSNorm(c, name="final_norm")(x_BSE)
        logits_BSV = nn.DenseGeneral(c.vocab_size, use_bias=False, dtype=dt, param_dtype=pdt, name="unembed",
                                     kernel_init=_init(("embed", "vocab")))(x_BSE)
        return nn.with_logical_constraint(logits_BSV, ("batch", "length", "act_vocab"))

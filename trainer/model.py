"""Decoder-only Transformer LM in Flax Linen, with logical axis names on every parameter
and on the main activations (see sharding.RULE_SETS for their mesh axes).

The family (ModelConfig): learned or rotary positions, multi-head / grouped-query /
multi-query attention (n_kv_heads) or multi-head latent attention (attention_type "mla",
trainer/mla.py), dense or gated MLPs (SwiGLU, GeGLU), tied or separate
unembedding, and one of the attention implementations of attention.py.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from . import attention as attention_lib
from . import mla as mla_lib
from . import moe as moe_lib
from . import pipeline as pipeline_lib
from . import quant
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


def grads_behind_barrier(fn):
    """`fn` with the same values and gradients, but the gradients of its inputs pass through
    an optimization barrier. On XLA:CPU the elementwise backward of an MLP activation is
    otherwise fused into the transposing copy that feeds the weight-gradient matmul: the
    derivative is then evaluated in transposed (strided) order, and once more in row order
    for the input gradient, ~15% of a small model's step (benchmarks/RESULTS.md)."""

    @jax.custom_vjp
    def wrapped(*xs):
        return fn(*xs)

    def fwd(*xs):
        return jax.vjp(fn, *xs)  # (value, the vjp closure as residual: autodiff's own residuals)

    def bwd(vjp_fn, g):
        return jax.lax.optimization_barrier(vjp_fn(g))

    wrapped.defvjp(fwd, bwd)
    return wrapped


def _init(names, scale=1.0):
    return nn.with_logical_partitioning(nn.initializers.variance_scaling(scale, "fan_in", "truncated_normal"), names)


def rope(x_BSHD, positions_BS, theta: float):
    """Rotary position embedding (the rotate-half form of GPT-NeoX / Llama): the pairs
    (x[i], x[i + D/2]) turn by the angle position x theta^(-2i/D)."""
    half = x_BSHD.shape[-1] // 2
    inv_freq = theta ** (-jnp.arange(half, dtype=jnp.float32) * 2.0 / x_BSHD.shape[-1])
    angle_BSF = positions_BS.astype(jnp.float32)[..., None] * inv_freq
    sin, cos = jnp.sin(angle_BSF)[:, :, None, :], jnp.cos(angle_BSF)[:, :, None, :]
    x1, x2 = x_BSHD[..., :half].astype(jnp.float32), x_BSHD[..., half:].astype(jnp.float32)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x_BSHD.dtype)


class RMSNorm(nn.Module):
    cfg: ModelConfig

    @nn.compact
    def __call__(self, x):
        # unbox=True is flax's default, stated so that the type is the array's, not LogicallyPartitioned's
        scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones, ("norm",)),
                           (x.shape[-1],), DTYPES[self.cfg.param_dtype], unbox=True)
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-6)
        return (y * scale.astype(jnp.float32)).astype(x.dtype)


class Proj(nn.Module):
    """x[..., *in_dims] @ kernel[*in_dims, *features]. Unlike nn.DenseGeneral it creates the
    kernel in its final shape, so its logical-axis constraint applies under a mesh. In int8 when
    cfg.quantization says so (trainer/quant.py)."""

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
        # unbox=True (the default): typed as the array, not LogicallyPartitioned
        kernel = self.param("kernel", nn.with_logical_partitioning(init, self.names),
                            self.in_dims + self.features, DTYPES[self.cfg.param_dtype], unbox=True)
        dt = DTYPES[self.cfg.dtype]
        return quant.tensordot(x.astype(dt), kernel.astype(dt), n_in, self.cfg.quantization)


class Block(nn.Module):
    """Pre-norm attention + MLP, sequential or parallel (ModelConfig.block). Carry-style
    signature for nn.scan."""

    cfg: ModelConfig
    attention_impl: str = "dot_product"  # a concrete attention.IMPLEMENTATIONS name
    mlp_grad_barrier: bool = False  # grads_behind_barrier on the MLP activation (XLA:CPU speed)
    context: int = 1  # context parallelism: the sequence in trainer/context.py's layout over this many shards
    moe: bool = False  # the MLP is a mixture of experts (trainer/moe.py); the layer then returns its MoE stats
    moe_grouped_matmul: str = "ragged_dot"  # moe.MoE.grouped_matmul (moe.grouped_matmul() of model.grouped_matmul)

    @nn.compact
    def __call__(self, x_BSE, segment_ids_BS, positions_BS):
        c = self.cfg
        dt, pdt = DTYPES[c.dtype], DTYPES[c.param_dtype]
        kv = c.kv_heads
        # the MLP's matmuls in int8 when c.quantization says so (trainer/quant.py)
        dot = quant.dot_general(c.quantization) if c.quantization != "none" else None
        dense = lambda feats, names, name: nn.DenseGeneral(
            feats, axis=-1, use_bias=False, dtype=dt, param_dtype=pdt, kernel_init=_init(names), name=name,
            dot_general=dot)

        parallel = c.block == "parallel"
        x_BSE = checkpoint_name(x_BSE, remat_lib.LAYER_INPUT)
        h = RMSNorm(c, name="norm" if parallel else "attn_norm")(x_BSE)
        if c.attention_type == "mla":  # multi-head latent attention (trainer/mla.py)
            out_BSE = mla_lib.MLA(c, self.attention_impl, self.context, name="mla")(h, segment_ids_BS, positions_BS)
        else:
            q_BSHD = Proj((c.d_model,), (c.n_heads, c.head_dim), ("embed", "heads", "kv"), c, name="query")(h)
            kv_proj = lambda name: Proj((c.d_model,), (kv, c.head_dim), ("embed", "kv_heads", "kv"), c, name=name)(h)
            q_BSHD = checkpoint_name(q_BSHD, remat_lib.QUERY)
            k_BSKD = checkpoint_name(kv_proj("key"), remat_lib.KEY)
            v_BSKD = checkpoint_name(kv_proj("value"), remat_lib.VALUE)
            if c.position == "rope":
                q_BSHD = rope(q_BSHD, positions_BS, c.rope_theta)
                k_BSKD = rope(k_BSKD, positions_BS, c.rope_theta)
            q_act, kv_act = ("batch", "length", "act_heads", "act_kv"), ("batch", "length", "act_kv_heads", "act_kv")
            q_BSHD = nn.with_logical_constraint(q_BSHD, q_act)
            k_BSKD, v_BSKD = (nn.with_logical_constraint(t, kv_act) for t in (k_BSKD, v_BSKD))

            attn_BSHD = attention_lib.attend(q_BSHD, k_BSKD, v_BSKD, segment_ids_BS, self.attention_impl,
                                             c.attention_block, self.context)
            attn_BSHD = checkpoint_name(nn.with_logical_constraint(attn_BSHD, q_act), remat_lib.CONTEXT)
            out_BSE = checkpoint_name(Proj((c.n_heads, c.head_dim), (c.d_model,), ("heads", "kv", "embed"), c,
                                           name="out")(attn_BSHD), remat_lib.OUT)
        if parallel:  # the MLP reads the same norm(x) as attention
            out_BSE = nn.with_logical_constraint(out_BSE, ("batch", "length", "act_embed"))
        else:  # the MLP reads the stream after attention, through its own norm
            x_BSE = nn.with_logical_constraint(x_BSE + out_BSE, ("batch", "length", "act_embed"))
            h = RMSNorm(c, name="mlp_norm")(x_BSE)
        act = ACTIVATIONS[c.activation]
        barrier = grads_behind_barrier if self.mlp_grad_barrier else (lambda fn: fn)
        if self.moe:  # router + experts in place of the MLP (trainer/moe.py)
            ff_BSE, moe_stats = moe_lib.MoE(c, self.moe_grouped_matmul, name="moe")(h)
            ff_BSE = checkpoint_name(ff_BSE, remat_lib.MLP2)
            if parallel:
                ff_BSE = nn.with_logical_constraint(ff_BSE, ("batch", "length", "act_embed"))
                x_BSE = x_BSE + (out_BSE + ff_BSE)
            else:
                x_BSE = x_BSE + ff_BSE
            return nn.with_logical_constraint(x_BSE, ("batch", "length", "act_embed")), moe_stats
        if c.mlp == "gated":  # (act(x W_gate) * x W_up) W_out; both input matmuls are tagged MLP1
            gate_BSF = checkpoint_name(dense(c.d_ff, ("embed", "mlp"), "mlp_gate")(h), remat_lib.MLP1)
            up_BSF = checkpoint_name(dense(c.d_ff, ("embed", "mlp"), "mlp_up")(h), remat_lib.MLP1)
            ff_BSF = barrier(lambda gate, up: act(gate) * up)(gate_BSF, up_BSF)
        else:
            ff_BSF = barrier(act)(checkpoint_name(dense(c.d_ff, ("embed", "mlp"), "mlp_in")(h), remat_lib.MLP1))
        ff_BSF = nn.with_logical_constraint(ff_BSF, ("batch", "length", "act_mlp"))
        ff_BSE = checkpoint_name(dense(c.d_model, ("mlp", "embed"), "mlp_out")(ff_BSF), remat_lib.MLP2)
        if parallel:  # both branches read norm(x), x still the block's input: one residual add of their sum
            ff_BSE = nn.with_logical_constraint(ff_BSE, ("batch", "length", "act_embed"))
            x_BSE = x_BSE + (out_BSE + ff_BSE)
        else:
            x_BSE = x_BSE + ff_BSE
        x_BSE = nn.with_logical_constraint(x_BSE, ("batch", "length", "act_embed"))
        return x_BSE, None


class PipelinedLayers(nn.Module):
    """The layers split over pipeline stages (trainer/pipeline.py): one stacked parameter tree
    "layers" with leaves [stages, repeats x layers per stage, ...] (logical axes "stage",
    "layers"; row s holds stage s's chunks), run by pipeline.run over microbatches."""

    cfg: ModelConfig
    stages: int
    microbatches: int
    repeats: int = 1
    remat: str = "none"
    attention_impl: str = "dot_product"
    mlp_grad_barrier: bool = False
    context: int = 1

    @nn.compact
    def __call__(self, x_BSE, segment_ids_BS, positions_BS):
        c = self.cfg
        block = Block(c, self.attention_impl, self.mlp_grad_barrier, self.context, parent=None)  # a template
        columns = c.n_layers // self.stages
        is_box = lambda x: isinstance(x, nn.LogicallyPartitioned)

        def init(rng):
            sample = (jnp.zeros((1, c.seq_len, c.d_model), DTYPES[c.dtype]), jnp.ones((1, c.seq_len), jnp.int32),
                      jnp.zeros((1, c.seq_len), jnp.int32))
            keys = jax.random.split(rng, c.n_layers).reshape((self.stages, columns))
            boxed = jax.vmap(jax.vmap(lambda k: block.init(k, *sample)["params"]))(keys)
            return jax.tree.map(lambda b: b.replace(names=("stage", "layers") + tuple(b.names)), boxed, is_leaf=is_box)

        weights = self.param("layers", init)
        if self.is_initializing():  # the parameters are made; the init batch need not split into microbatches
            return x_BSE

        per_stage = columns // self.repeats

        def layer(w, h, segment_ids, positions):
            return block.apply({"params": w}, h, segment_ids, positions)[0]

        if self.remat != "none":
            layer = jax.checkpoint(layer, policy=remat_lib.policy(self.remat), prevent_cse=False)

        def stage_fn(w_row, first, h, segment_ids, positions):
            chunk = jax.tree.map(lambda a: jax.lax.dynamic_slice_in_dim(a, first, per_stage, 0), w_row)

            def step(h, w_l):
                return layer(w_l, checkpoint_name(h, remat_lib.PIPELINE_LAYER_INPUT), segment_ids, positions), None

            return jax.lax.scan(step, h, chunk)[0]

        if self.remat != "none":
            # The whole chunk is rematerialized too, keeping what the layers' policy keeps and each
            # layer's input: the chunk's weights, sliced out of the stage's loop-invariant row, are
            # sliced again in the backward pass instead of kept once per iteration and layer (16B,
            # 4 stages x 8 layers, 11 iterations: 22 GiB a chip; benchmarks/RESULTS.md)
            stage_fn = jax.checkpoint(stage_fn, policy=remat_lib.keeping(remat_lib.policy(self.remat),
                                                                         remat_lib.PIPELINE_LAYER_INPUT),
                                      prevent_cse=False)

        micro = lambda a: pipeline_lib.to_microbatches(a, self.microbatches)
        x_MbSE = nn.with_logical_constraint(micro(x_BSE), (None, "batch", "length", "act_embed"))
        out_MbSE = pipeline_lib.run(
            stage_fn, weights, x_MbSE, (micro(segment_ids_BS), micro(positions_BS)), stages=self.stages,
            repeats=self.repeats,
            constrain_stages=lambda a: nn.with_logical_constraint(a, ("act_stage", "batch", "length", "act_embed")),
            constrain_buffer=lambda a: nn.with_logical_constraint(a, (None, "batch", "length", "act_embed")))
        return nn.with_logical_constraint(pipeline_lib.from_microbatches(out_MbSE), ("batch", "length", "act_embed"))


class TransformerLM(nn.Module):
    cfg: ModelConfig
    remat: str = "none"
    # a concrete attention.IMPLEMENTATIONS name; None: attention.implementation(cfg, default backend)
    attention_impl: str | None = None
    mlp_grad_barrier: bool = False  # set for XLA:CPU by plan.make_model (Block.mlp_grad_barrier)
    # pipeline parallelism (trainer/pipeline.py): stages > 1 runs the layers as PipelinedLayers;
    # plan.make_model sets these from the mesh's stage axis and TrainConfig.pipeline
    pipeline_stages: int = 1
    pipeline_microbatches: int = 1
    pipeline_repeats: int = 1
    # the logical batch axis of what runs after the layers: "stage_batch" splits the final norm,
    # the unembedding and the loss of a pipelined model over the stage devices too
    # (plan.make_model sets it where the global batch divides over data x stage x fsdp)
    head_batch: str = "batch"
    # context parallelism (trainer/context.py): > 1 when the mesh's context axis splits the sequence;
    # the model then takes and returns sequences in the load-balanced layout (step.make_loss_sums
    # puts the batch into it); plan.make_model sets it from the mesh
    context_shards: int = 1
    # a MoE layer's grouped matmul (moe.MoE.grouped_matmul): moe.grouped_matmul(), set by plan.make_model
    moe_grouped_matmul: str = "ragged_dot"

    @nn.compact
    def __call__(self, tokens_BS, positions_BS, segment_ids_BS, return_hidden: bool = False):
        """The B x S x V logits, or with `return_hidden` the final-norm hidden states B x S x E
        (vocab tiling unembeds those itself: trainer/vocab_tiling.py)."""
        c = self.cfg
        dt, pdt = DTYPES[c.dtype], DTYPES[c.param_dtype]
        impl = self.attention_impl or attention_lib.implementation(c, jax.default_backend())
        # a tied table is also the unembedding: init it like one (logits of unit scale)
        embed_init = nn.initializers.normal(c.d_model ** -0.5 if c.tie_embeddings else 1.0)
        embed = nn.Embed(c.vocab_size, c.d_model, dtype=dt, param_dtype=pdt, name="embed",
                         embedding_init=nn.with_logical_partitioning(embed_init, ("vocab", "embed")))
        x_BSE = embed(tokens_BS)
        if c.position == "learned":
            pos_embed = nn.Embed(c.seq_len, c.d_model, dtype=dt, param_dtype=pdt, name="pos_embed",
                                 embedding_init=nn.with_logical_partitioning(nn.initializers.normal(0.02),
                                                                             (None, "embed")))
            x_BSE = x_BSE + pos_embed(positions_BS)
        x_BSE = nn.with_logical_constraint(x_BSE.astype(dt), ("batch", "length", "act_embed"))

        block = Block
        pol = remat_lib.policy(self.remat)
        if self.remat != "none":
            block = nn.remat(Block, policy=pol, prevent_cse=not c.scan_layers)
        if self.pipeline_stages > 1:
            x_BSE = PipelinedLayers(c, self.pipeline_stages, self.pipeline_microbatches, self.pipeline_repeats,
                                    self.remat, impl, self.mlp_grad_barrier, self.context_shards, name="pipeline")(
                x_BSE, segment_ids_BS, positions_BS)
            x_BSE = nn.with_logical_constraint(x_BSE, (self.head_batch, "length", "act_embed"))
        elif c.scan_layers and c.n_experts:
            # the leading dense layers as a stack of their own, then the MoE layers (moe_every 1:
            # moe.check refuses interleaving under scan)
            moe_stats = []
            for name, count, moe in (("dense_layers", c.first_dense_layers, False),
                                     ("layers", c.n_layers - c.first_dense_layers, True)):
                if count:
                    scanned = nn.scan(block, variable_axes={"params": 0}, split_rngs={"params": True},
                                      in_axes=(nn.broadcast, nn.broadcast), length=count,
                                      metadata_params={nn.PARTITION_NAME: "layers"})
                    x_BSE, stats = scanned(c, impl, self.mlp_grad_barrier, self.context_shards, moe,
                                           self.moe_grouped_matmul, name=name)(x_BSE, segment_ids_BS, positions_BS)
                    if moe:
                        moe_stats.append(stats)
            self._sow_moe(moe_stats)
        elif c.scan_layers:
            scanned = nn.scan(block, variable_axes={"params": 0}, split_rngs={"params": True},
                              in_axes=(nn.broadcast, nn.broadcast), length=c.n_layers,
                              metadata_params={nn.PARTITION_NAME: "layers"})
            stack = scanned(c, impl, self.mlp_grad_barrier, self.context_shards, name="layers")
            x_BSE, _ = stack(x_BSE, segment_ids_BS, positions_BS)
        else:
            moe_stats = []
            for i in range(c.n_layers):
                moe = moe_lib.is_moe_layer(c, i)
                layer = block(c, impl, self.mlp_grad_barrier, self.context_shards, moe, self.moe_grouped_matmul,
                              name=f"layer_{i}")
                x_BSE, stats = layer(x_BSE, segment_ids_BS, positions_BS)
                if moe:
                    moe_stats.append(jax.tree.map(lambda a: a[None], stats))
            if moe_stats:
                self._sow_moe(moe_stats)

        x_BSE = RMSNorm(c, name="final_norm")(x_BSE)
        if return_hidden:
            return x_BSE
        if c.tie_embeddings:
            logits_BSV = embed.attend(x_BSE)
        else:
            logits_BSV = nn.DenseGeneral(c.vocab_size, use_bias=False, dtype=dt, param_dtype=pdt, name="unembed",
                                         kernel_init=_init(("embed", "vocab")))(x_BSE)
        return nn.with_logical_constraint(logits_BSV, (self.head_batch, "length", "act_vocab"))

    def _sow_moe(self, per_layer: list) -> None:
        """The MoE layers' stats (each a dict of [layers] arrays) into the moe.COLLECTION collection:
        the load-balancing loss and dropped share averaged over the MoE layers, the routing bias's
        objective summed (step.py reads them)."""
        stacked = {k: jnp.concatenate([s[k] for s in per_layer]) for k in moe_lib.STATS}
        for name, values in stacked.items():
            reduce = jnp.sum if name == "routing_bias_objective" else jnp.mean
            self.sow(moe_lib.COLLECTION, name, reduce(values))

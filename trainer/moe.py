"""The mixture-of-experts layer (ModelConfig.n_experts > 0): a router and the experts.

A MoE layer replaces a decoder layer's MLP (model.Block): each token's router scores pick
`experts_per_token` (k) of `n_experts` experts, whose MLPs (gated or not, as ModelConfig.mlp,
width `expert_d_ff`) run on it, and the outputs are summed with the routing weights; shared
experts (`n_shared_experts`) run on every token.

Routers (ModelConfig.router):
- "softmax" (Mixtral, Qwen3-MoE): softmax over the logits, top-k, the k weights renormalized.
- "sigmoid" (DeepSeek V3): sigmoid scores; the top-k is chosen on scores + a routing bias, the
  weights are the chosen scores normalized. DeepSeek V3 moves the bias outside the gradient
  (b_e -= gamma x sign(load_e - mean load)); here the bias's gradient is defined as the load error
  (load_e - 1 / n_experts) through a term of value exactly 0 added to the training objective, so the
  optimizer (AdamW: a sign-like step) moves it the same way. Its load-balancing loss is reported and
  added only with its weight (the presets set 0).
Load-balancing loss (Switch / Mixtral): n_experts x sum_e f_e x P_e over the step's tokens, f_e the
share of the k x tokens routed to e, P_e the mean router probability of e; averaged over the MoE
layers, x load_balance_weight into the training loss (step.py), reported as its own metric.

Expert compute (ModelConfig.expert_compute), on each device's tokens:
- "dropless": the (token, choice) pairs sorted by expert, one grouped matmul per weight
  (jax.lax.ragged_dot). Under expert parallelism (the mesh axis `expert`) the tokens and their
  routes are all-gathered over the expert axis, each device runs its own experts' groups, and the
  outputs come back summed by a reduce-scatter (psum_scatter): capacity-free and exact.
  The grouped matmul (ModelConfig.grouped_matmul, resolved per platform by grouped_matmul() in
  plan.make_model): "auto" is "ragged_dot" on TPU and GPU, where it is one ragged-dot instruction;
  "megablox" (TPU only) is the Pallas megablox kernel as MaxText's megablox=True (gmm, its gradient gmm
  and tgmm; tiling MEGABLOX_TILING, MaxText's default, the k and n tiles clamped to the matrices; the
  sorted routes padded to a multiple of the row tile, the rows after the groups set to 0, which the
  kernel leaves unwritten); "auto" on XLA:CPU is "blocks", as XLA:CPU has no ragged dot (JAX lowers
  ragged_dot there as a dense matmul of every row with every expert's weights, masked: n_experts /
  experts_per_token x the work, 3 s a moe-tiny step against 1 s): the routes laid out with each
  expert's rows from the start of a block of BLOCK rows, the whole MLP one batched matmul per weight
  of the blocks with their expert's weights, at most (local experts x BLOCK) padding rows of extra
  work. All give the same values (to the order of the sums).
  jax.lax.ragged_all_to_all would send each device only its tokens, but XLA:CPU in jax 0.10.2
  cannot run it ("HLO opcode ragged-all-to-all is not supported by XLA:CPU"), so the tests here
  could not hold it to the same loss; it is not used.
- "capacity": each expert takes at most C = ceil(k x tokens x capacity_factor / n_experts) of a
  device's (token, choice) pairs, first choices before second ones, in token order; the rest are
  dropped (their share is the `dropped_fraction` metric). Dispatch is a [experts, C, d_model]
  buffer; under expert parallelism it goes to the experts' devices with jax.lax.all_to_all and back.
Dispatch and combine (_through_buffer) are row gathers in both directions, forward and backward: a
TPU runs a scatter (and a scatter-add: what autodiff makes of a gather, and what segment_sum is) a
row at a time (v5e: 27 ns a 2 KiB row, 23 for a scatter-add, against 3.9 for a gather; ~40-60 ms of
a 280 ms step of an 8-expert model). Each buffer row knows its route (or none) and each route its
buffer row (or none): the tokens go in as x[token of each row], come back as the sum over a token's
k routes of weight x out[row of the route], and each of these is a custom_vjp (_gather_rows) whose
gradient is the gather the other way. What is left to scatter is int32 index maps (the inverse of
the sort, each capacity slot's route), the router's [tokens, experts] top-k, and on XLA:CPU the
"blocks" matmul's sum of each block's copy of its expert's weights.
Dropless and capacity run inside jax.shard_map over the whole mesh: tokens split over the batch axes (data, fsdp,
expert) and context, expert weights over expert (experts) and tensor (their hidden dim; a psum over
tensor sums the partial outputs); XLA all-gathers the weights' fsdp shards before the layer, as for
any fsdp weight. Without a mesh (shape-only uses, e.g. a parameter count) the same code runs with
no collectives.

Not (yet) with MoE: int8 quantization of the experts (ModelConfig.quantization applies to the
attention projections; the experts and shared experts stay in `dtype`), pipeline stages and
gradient accumulation (check / check_train refuse both in one line).
"""
from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from .config import EXPERT_COMPUTES, GROUPED_MATMULS, ROUTERS, ModelConfig, expert_width, is_moe_layer, moe_layers
from .errors import ConfigError

__all__ = ["MoE", "check", "check_train", "capacity", "drops_per_device", "expert_width", "is_moe_layer",
           "moe_layers"]
COLLECTION = "moe_stats"  # what TransformerLM sows: the step's MoE metrics (step.py reads them)
STATS = ("load_balance_loss", "dropped_fraction", "routing_bias_objective")
BATCH_AXES = ("data", "fsdp", "expert")  # the mesh axes a MoE layer's tokens split over (with context)
GROUPED_MATMUL_IMPLS = ("ragged_dot", "blocks", "megablox")  # MoE.grouped_matmul: grouped_matmul() picks one
# (row tile, contraction tile, output tile) of the megablox kernel: MaxText's defaults (tile_batch_seq 512,
# tile_embed_dim 1024, tile_mlp_dim 1024; the same for wi and wo), at which the roofline's measured v5e rates
# were taken (trainer/hardware.py V5E_MEGABLOX_RATES)
MEGABLOX_TILING = (512, 1024, 1024)
_MEGABLOX_INTERPRET = False  # the kernel in Pallas's interpret mode (tests on CPU only)
# rows of a block of the "blocks" grouped matmul. Each block copies its expert's weights (and its weight gradient
# is summed back from the copies), so small blocks trade padding for weight traffic: one MoE layer's value and
# gradient (d_model 256, SwiGLU width 1024, 8 experts, top 2; one CPU device) took 320 / 208 / 194 ms at 32 / 128 /
# 512 rows with 2 local experts and 2048 routes (expert parallelism 4), 156 / 73 / 78 ms at 32 / 128 / 256 with 4
# and 1024, 100 / 74 / 157 ms at 32 / 128 / 256 with 8 and 512 (benchmarks/RESULTS.md, MoE against MaxText)
BLOCK = 128
_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
_ACTIVATIONS = {"gelu": jax.nn.gelu, "gelu_exact": lambda x: jax.nn.gelu(x, approximate=False),
                "silu": jax.nn.silu, "relu": jax.nn.relu}


def drops_per_device(m: ModelConfig) -> bool:
    """Whether what the model computes depends on how the batch is split over devices: capacity
    experts drop each device's own overflow (capacity() counts one device's tokens)."""
    return m.n_experts > 0 and m.expert_compute == "capacity"


def capacity(tokens: int, m: ModelConfig) -> int:
    """Slots per expert for `tokens` tokens of one device: ceil(k x tokens x capacity_factor / n_experts)."""
    return max(1, math.ceil(m.experts_per_token * tokens * m.capacity_factor / m.n_experts))


def check(m: ModelConfig, sizes: dict[str, int] | None = None) -> None:
    """The MoE fields, and their fit to the mesh `sizes` ({axis: size}); ConfigError, one line."""
    expert = (sizes or {}).get("expert", 1)
    if not m.n_experts:
        if expert > 1:
            raise ConfigError(f"mesh axis expert={expert} needs a mixture-of-experts model (model.n_experts > 0); "
                              "put those devices on data or fsdp instead")
        return
    ints = ("n_experts", "experts_per_token", "n_shared_experts", "expert_d_ff", "first_dense_layers", "moe_every")
    for name in ints:
        v = getattr(m, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ConfigError(f"model.{name} must be an integer >= 0, got {v!r}")
    if not 1 <= m.experts_per_token <= m.n_experts:
        raise ConfigError(f"model.experts_per_token={m.experts_per_token} must be between 1 and "
                          f"n_experts={m.n_experts}")
    if m.moe_every < 1:
        raise ConfigError(f"model.moe_every must be >= 1 (1: every layer after the dense ones), got {m.moe_every}")
    if m.first_dense_layers >= m.n_layers:
        raise ConfigError(f"model.first_dense_layers={m.first_dense_layers} leaves no MoE layer of "
                          f"n_layers={m.n_layers}; use fewer leading dense layers or n_experts=0")
    if not moe_layers(m):
        raise ConfigError(f"moe_every={m.moe_every} after first_dense_layers={m.first_dense_layers} puts no MoE layer "
                          f"in n_layers={m.n_layers}")
    if m.router not in ROUTERS:
        raise ConfigError(f"unknown model.router {m.router!r}; choose one of {', '.join(ROUTERS)}")
    if m.expert_compute not in EXPERT_COMPUTES:
        raise ConfigError(f"unknown model.expert_compute {m.expert_compute!r}; choose one of "
                          f"{', '.join(EXPERT_COMPUTES)}")
    if m.grouped_matmul not in GROUPED_MATMULS:
        raise ConfigError(f"unknown model.grouped_matmul {m.grouped_matmul!r}; choose one of "
                          f"{', '.join(GROUPED_MATMULS)}")
    if m.grouped_matmul != "auto" and m.expert_compute != "dropless":
        raise ConfigError(f"model.grouped_matmul={m.grouped_matmul!r} is the dropless experts' grouped matmul; "
                          f"expert_compute={m.expert_compute!r} runs batched matmuls: use grouped_matmul='auto' or "
                          "expert_compute='dropless'")
    if m.grouped_matmul == "megablox" and (expert_width(m) % 128 or m.d_model % 128):
        # the v5e chip (jax 0.10.2): at width 704 the backward kernels do not compile ("the last two dimensions of
        # your block shape are divisible by 8 and 128 respectively, or be equal to ... the array")
        raise ConfigError(f"model.grouped_matmul='megablox' needs d_model and the experts' width in multiples of 128 "
                          f"(the kernel's tiles), got {m.d_model} and {expert_width(m)}; use grouped_matmul='auto'")
    if m.expert_compute == "capacity" and not m.capacity_factor > 0:
        raise ConfigError(f"model.capacity_factor must be > 0 with expert_compute='capacity', got {m.capacity_factor}")
    if not m.load_balance_weight >= 0:
        raise ConfigError(f"model.load_balance_weight must be >= 0, got {m.load_balance_weight}")
    if m.scan_layers and m.moe_every > 1:
        raise ConfigError(f"moe_every={m.moe_every} interleaves dense and MoE layers, which one scanned stack of "
                          "identical layers cannot hold; set model.scan_layers=False (or moe_every=1)")
    if sizes is None:
        return
    if m.n_experts % expert:
        raise ConfigError(f"n_experts={m.n_experts} does not divide over expert={expert}; use an expert axis size "
                          f"dividing {m.n_experts}")
    tensor = sizes.get("tensor", 1)
    width = expert_width(m)
    if width % tensor or (m.n_shared_experts * width) % tensor:
        raise ConfigError(f"expert_d_ff={width} does not divide over tensor={tensor}; use a tensor size dividing "
                          f"{width}")
    if sizes.get("stage", 1) > 1:
        raise ConfigError(f"a mixture-of-experts model cannot be pipelined (stage={sizes['stage']}) here yet; "
                          "use stage=1 and split the devices over expert, fsdp or data")


def grouped_matmul(m: ModelConfig, platform: str) -> str:
    """The grouped matmul (MoE.grouped_matmul, one of GROUPED_MATMUL_IMPLS) that model.grouped_matmul
    means on `platform`: "auto" is "blocks" on XLA:CPU and "ragged_dot" elsewhere; "megablox" runs on
    TPU only (ConfigError, one line, elsewhere)."""
    if m.grouped_matmul == "megablox" and m.n_experts:
        if platform != "tpu":
            raise ConfigError(f"model.grouped_matmul='megablox' is a TPU kernel (Pallas) and cannot run on {platform}; "
                              "use grouped_matmul='auto' (or 'ragged_dot')")
        return "megablox"
    if m.grouped_matmul == "ragged_dot":
        return "ragged_dot"
    return "blocks" if platform == "cpu" else "ragged_dot"


def check_train(cfg) -> None:
    """What a MoE model's train step does not do yet: gradient accumulation (its load-balancing
    loss is a step-wide statistic); ConfigError, one line."""
    if cfg.model.n_experts and cfg.grad_accum_steps > 1:
        raise ConfigError(f"grad_accum_steps={cfg.grad_accum_steps} is not supported with a mixture-of-experts model "
                          "yet; use grad_accum_steps=1 and a smaller per-device batch")


def _expert_init(in_axis: int, out_axis: int):
    return nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal", in_axis=in_axis, out_axis=out_axis,
                                            batch_axis=(0,))


class MoE(nn.Module):
    """Router + experts (+ shared experts) on the normed residual stream h_BSE; returns the
    B x S x E output and the layer's statistics (STATS)."""

    cfg: ModelConfig
    grouped_matmul: str = "ragged_dot"  # GROUPED_MATMUL_IMPLS (grouped_matmul(): see the module doc)

    @nn.compact
    def __call__(self, h_BSE):
        c = self.cfg
        n_e, width, d = c.n_experts, expert_width(c), c.d_model
        dt, pdt = _DTYPES[c.dtype], _DTYPES[c.param_dtype]
        router = self.param("router", nn.with_logical_partitioning(
            nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal"), ("embed", None)), (d, n_e), pdt,
            unbox=True)
        bias = None
        if c.router == "sigmoid":
            bias = self.param("router_bias", nn.with_logical_partitioning(nn.initializers.zeros, (None,)), (n_e,),
                              jnp.float32, unbox=True)
        w = lambda name, shape, names, init: self.param(name, nn.with_logical_partitioning(init, names), shape, pdt,
                                                         unbox=True)
        w_in = w("wi", (n_e, d, width), ("exp", "expert_embed", "expert_mlp"), _expert_init(1, 2))
        w_up = (w("wi_up", (n_e, d, width), ("exp", "expert_embed", "expert_mlp"), _expert_init(1, 2))
                if c.mlp == "gated" else None)
        w_out = w("wo", (n_e, width, d), ("exp", "expert_mlp", "expert_embed"), _expert_init(1, 2))

        weights = (router, bias, w_in.astype(dt), None if w_up is None else w_up.astype(dt), w_out.astype(dt))
        mesh = jax.sharding.get_abstract_mesh()
        if self.is_initializing():  # the parameters are made; init's sample batch need not split over the mesh
            zero = jnp.zeros((), jnp.float32)
            y_BSE = jnp.zeros(h_BSE.shape, dt)
            sums = {"counts": jnp.zeros((n_e,), jnp.float32), "prob_sums": jnp.zeros((n_e,), jnp.float32),
                    "tokens": zero, "dropped": zero}
        elif mesh.empty:
            y_BSE, sums = _local(c, h_BSE.astype(dt), *weights, axes={"grouped_matmul": self.grouped_matmul})
        else:
            y_BSE, sums = _sharded(c, mesh, h_BSE.astype(dt), *weights, grouped_matmul=self.grouped_matmul)
        stats = _stats(c, sums, bias)
        if c.n_shared_experts:
            y_BSE = y_BSE + _shared(c, h_BSE, self).astype(y_BSE.dtype)
        return y_BSE, stats


def _shared(c: ModelConfig, h_BSE, module: nn.Module):
    """The shared experts: one dense MLP of width n_shared_experts x expert_d_ff that every token
    runs (as DeepSeek's and Llama 4's), sharded as the dense MLP is."""
    dt, pdt = _DTYPES[c.dtype], _DTYPES[c.param_dtype]
    width = c.n_shared_experts * expert_width(c)
    init = lambda names: nn.with_logical_partitioning(
        nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal"), names)
    dense = lambda feats, names, name: nn.DenseGeneral(feats, use_bias=False, dtype=dt, param_dtype=pdt,
                                                       kernel_init=init(names), name=name, parent=module)
    act = _ACTIVATIONS[c.activation]
    if c.mlp == "gated":
        ff = act(dense(width, ("embed", "mlp"), "shared_gate")(h_BSE)) * dense(width, ("embed", "mlp"), "shared_up")(
            h_BSE)
    else:
        ff = act(dense(width, ("embed", "mlp"), "shared_in")(h_BSE))
    ff = nn.with_logical_constraint(ff, ("batch", "length", "act_mlp"))
    return dense(c.d_model, ("mlp", "embed"), "shared_out")(ff)


def _stats(c: ModelConfig, sums: dict, bias):
    """The layer's metrics from the step-wide sums: the load-balancing loss, the dropped share,
    and the routing bias's objective (value 0, gradient the load error: see the module doc)."""
    n_e, k = c.n_experts, c.experts_per_token
    tokens = jnp.maximum(sums["tokens"], 1.0)
    load = sums["counts"] / (tokens * k)  # f_e: share of the k x tokens routes
    prob = sums["prob_sums"] / tokens  # P_e: mean router probability
    stats = {"load_balance_loss": n_e * jnp.sum(load * prob),
             "dropped_fraction": sums["dropped"] / (tokens * k)}
    if bias is not None:
        term = jnp.sum(jax.lax.stop_gradient(load - 1.0 / n_e) * bias)
        stats["routing_bias_objective"] = term - jax.lax.stop_gradient(term)
    else:
        stats["routing_bias_objective"] = jnp.zeros((), jnp.float32)
    return stats


def _route(c: ModelConfig, x_TD, router, bias):
    """(top-k weights T x k, top-k expert ids T x k, router probabilities T x E), in float32."""
    logits = jnp.dot(x_TD.astype(jnp.float32), router.astype(jnp.float32))
    k = c.experts_per_token
    if c.router == "softmax":
        probs = jax.nn.softmax(logits, axis=-1)
        top_w, top_i = jax.lax.top_k(probs, k)
    else:
        scores = jax.nn.sigmoid(logits)
        _, top_i = jax.lax.top_k(scores + jax.lax.stop_gradient(bias), k)
        top_w = jnp.take_along_axis(scores, top_i, axis=-1)
        probs = scores / jnp.sum(scores, axis=-1, keepdims=True)
    top_w = top_w / jnp.sum(top_w, axis=-1, keepdims=True)
    return top_w, top_i, probs


def _sharded(c: ModelConfig, mesh, h_BSE, router, bias, w_in, w_up, w_out, grouped_matmul: str = "ragged_dot"):
    """_local inside a shard_map over the whole mesh (see the module doc for the layout)."""
    names = set(mesh.axis_names)
    batch = tuple(a for a in BATCH_AXES if a in names)
    length = "context" if "context" in names else None
    tensor = "tensor" if "tensor" in names else None
    expert = "expert" if "expert" in names else None
    x_spec = P(batch, length, None)
    w_spec, wo_spec = P(expert, None, tensor), P(expert, tensor, None)
    axes = {"batch": batch + ((length,) if length else ()), "tensor": tensor, "expert": expert,
            "expert_size": dict(mesh.shape).get("expert", 1), "grouped_matmul": grouped_matmul}
    sums_spec = {"counts": P(), "prob_sums": P(), "tokens": P(), "dropped": P()}

    def body(h, router, bias, w_in, w_up, w_out):
        return _local(c, h, router, bias, w_in, w_up, w_out, axes)

    # the megablox kernel's pallas_call declares no varying mesh axes for its output: shard_map cannot check
    # them (as MaxText's, its shard_map then runs unchecked)
    fn = jax.shard_map(body, mesh=mesh, in_specs=(x_spec, P(), P(), w_spec, w_spec, wo_spec),
                       out_specs=(x_spec, sums_spec), check_vma=grouped_matmul != "megablox")
    return fn(h_BSE, router, bias, w_in, w_up, w_out)


def _local(c: ModelConfig, h_BSE, router, bias, w_in, w_up, w_out, axes: dict):
    """One device's share: its tokens routed, sent to their experts and back. `axes` names the
    mesh axes of the collectives ({} without a mesh)."""
    b, s, d = h_BSE.shape
    x_TD = h_BSE.reshape(b * s, d)
    top_w, top_i, probs = _route(c, x_TD, router, bias)
    onehot = jax.nn.one_hot(top_i, c.n_experts, dtype=jnp.float32).sum(axis=1)  # T x E: routes per expert
    if c.expert_compute == "dropless":
        y_TD, dropped = _dropless(c, x_TD, top_w, top_i, w_in, w_up, w_out, axes), jnp.zeros((), jnp.float32)
    else:
        y_TD, dropped = _capacity(c, x_TD, top_w, top_i, w_in, w_up, w_out, axes)
    if axes.get("tensor"):  # partial sums over the experts' hidden dim
        y_TD = jax.lax.psum(y_TD, axes["tensor"])
    sums = {"counts": onehot.sum(axis=0), "prob_sums": probs.sum(axis=0),
            "tokens": jnp.asarray(b * s, jnp.float32), "dropped": dropped}
    if axes.get("batch"):
        sums = jax.lax.psum(sums, axes["batch"])
    return y_TD.reshape(b, s, d).astype(h_BSE.dtype), sums


def _mlp(c: ModelConfig, grouped, x, w_in, w_up, w_out):
    """The experts' MLP through `grouped(lhs, rhs)` (a ragged_dot over groups or a batched einsum)."""
    act = _ACTIVATIONS[c.activation]
    h = act(grouped(x, w_in))
    if w_up is not None:
        h = h * grouped(x, w_up)
    return grouped(h.astype(x.dtype), w_out)


def _dropless(c: ModelConfig, x_TD, top_w, top_i, w_in, w_up, w_out, axes: dict):
    """Every route computed: the (token, choice) pairs of this device's experts sorted by expert,
    grouped matmuls (jax.lax.ragged_dot, or the "blocks" layout), the outputs weighted and summed
    back per token; rows in and out by _through_buffer (gathers both ways)."""
    k, n_local = c.experts_per_token, w_in.shape[0]
    expert, p = axes.get("expert"), axes.get("expert_size", 1)
    first = 0
    if expert and p > 1:  # every device's tokens and routes, this device's experts
        x_TD, top_w, top_i = (jax.lax.all_gather(a, expert, axis=0, tiled=True) for a in (x_TD, top_w, top_i))
        first = jax.lax.axis_index(expert) * n_local
    routes = top_i.size  # token-major: route r is token r // k's choice r % k
    local_e = top_i.reshape(-1) - first
    mine = (local_e >= 0) & (local_e < n_local)
    key = jnp.where(mine, local_e, n_local)  # other devices' routes sort last, outside every group
    order = jnp.argsort(key, stable=True)  # sorted position -> route
    # route -> sorted position (an int32 scatter of one index a route)
    position = jnp.zeros_like(order).at[order].set(jnp.arange(routes, dtype=order.dtype), unique_indices=True)
    group_sizes = jnp.bincount(key, length=n_local + 1)[:n_local].astype(jnp.int32)
    n_mine = jnp.sum(group_sizes)
    impl = axes.get("grouped_matmul", "ragged_dot")
    if impl == "blocks":
        row_of_sorted, sorted_of_row, grouped = _blocks_layout(group_sizes, routes)
        place = row_of_sorted[position]
        src = order.at[sorted_of_row].get(mode="fill", fill_value=routes)
    else:  # the buffer is the sorted routes, this device's first (the others' rows stay empty), for megablox
        # padded to a multiple of its row tile
        tm = MEGABLOX_TILING[0]
        rows = -(-routes // tm) * tm if impl == "megablox" else routes
        place = jnp.where(position < n_mine, position, rows)
        src = jnp.where(jnp.arange(rows) < n_mine, jnp.pad(order, (0, rows - routes)), routes)
        grouped = (_megablox_matmul(group_sizes, n_mine) if impl == "megablox"
                   else lambda lhs, rhs: jax.lax.ragged_dot(lhs, rhs, group_sizes))
    y_TD = _through_buffer(x_TD, top_w.reshape(-1), place, src, k,
                           lambda xs: _mlp(c, grouped, xs, w_in, w_up, w_out))
    if expert and p > 1:  # each device's tokens back, summed over the devices' experts
        y_TD = jax.lax.psum_scatter(y_TD, expert, scatter_dimension=0, tiled=True)
    return y_TD


def _blocks_layout(group_sizes, rows: int):
    """The "blocks" grouped matmul's buffer for `rows` routes sorted by group (the groups first, then
    rows of no group): each group's rows from the start of a block of BLOCK rows, the rest of its last
    block empty. (padded row of each sorted row [rows] (n_blocks x BLOCK: none), sorted row of each padded
    row [n_blocks x BLOCK] (rows: none), `grouped(lhs, rhs)`: lhs's blocks of one group g each times rhs[g],
    as one batched matmul)."""
    groups = group_sizes.shape[0]
    block = min(BLOCK, rows)
    n_blocks = -(-(rows + groups * (block - 1)) // block)  # the padded rows, however the rows fall
    padded = -(-group_sizes // block) * block
    padded_end = jnp.cumsum(padded)
    padded_start = padded_end - padded
    end = jnp.cumsum(group_sizes)
    start = end - group_sizes
    row = jnp.arange(rows)
    group = jnp.searchsorted(end, row, side="right")  # == groups past the last group
    g = jnp.minimum(group, groups - 1)
    row_of_sorted = jnp.where(group < groups, padded_start[g] + row - start[g], n_blocks * block)
    padded_row = jnp.arange(n_blocks * block)
    padded_group = jnp.searchsorted(padded_end, padded_row, side="right")  # == groups past the last block
    pg = jnp.minimum(padded_group, groups - 1)
    offset = padded_row - padded_start[pg]
    filled = (padded_group < groups) & (offset < group_sizes[pg])
    sorted_of_row = jnp.where(filled, start[pg] + offset, rows)
    # each block's group (blocks past the last group: group 0, on empty rows)
    block_group = padded_group[::block]
    block_group = jnp.where(block_group < groups, block_group, 0)

    def grouped(lhs, rhs):
        out = jnp.einsum("nbk,nkf->nbf", lhs.reshape(n_blocks, block, -1), rhs[block_group])
        return out.reshape(n_blocks * block, -1)

    return row_of_sorted, sorted_of_row, grouped


def _megablox_matmul(group_sizes, n_mine):
    """`grouped(lhs, rhs)` as jax.lax.ragged_dot, through the Pallas megablox kernel (gmm, its gradient
    gmm and tgmm): lhs's rows a multiple of MEGABLOX_TILING's row tile, the k and n tiles clamped to
    the matrices (as MaxText). The kernel leaves the rows after the groups unwritten: set to 0 here."""
    from jax.experimental.pallas.ops.tpu.megablox import ops as megablox

    def grouped(lhs, rhs):
        m, k = lhs.shape
        tm, tk, tn = MEGABLOX_TILING
        tiling = (min(tm, m), min(tk, k), min(tn, rhs.shape[2]))
        out = megablox.gmm(lhs, rhs, group_sizes, lhs.dtype, tiling, None, None, False, _MEGABLOX_INTERPRET)
        return jnp.where((jnp.arange(m) < n_mine)[:, None], out, 0)

    return grouped


def _capacity(c: ModelConfig, x_TD, top_w, top_i, w_in, w_up, w_out, axes: dict):
    """At most capacity() routes per expert from this device, first choices first; the rest
    dropped; rows in and out of the [experts, C, D] buffer by _through_buffer (gathers both ways).
    (output T x D, dropped routes)."""
    t, d = x_TD.shape
    k, n_e, n_local = c.experts_per_token, c.n_experts, w_in.shape[0]
    expert, p = axes.get("expert"), axes.get("expert_size", 1)
    cap = capacity(t, c)
    slots = n_e * cap
    e_flat = top_i.T.reshape(-1)  # choice-major: every token's first choice before any second one
    onehot = jax.nn.one_hot(e_flat, n_e, dtype=jnp.int32)
    position = jnp.sum((jnp.cumsum(onehot, axis=0) - 1) * onehot, axis=1)  # in its expert's queue
    keep = position < cap
    slot = e_flat * cap + position  # in the buffer, where kept
    route = jnp.arange(t * k)
    # each slot's route, token-major (r % t's choice r // t): an int32 scatter of one index a route; the
    # dropped routes aim past the slots, each at its own index, and are left out
    src = jnp.full((slots,), t * k, route.dtype).at[jnp.where(keep, slot, slots + route)].set(
        (route % t) * k + route // t, mode="drop", unique_indices=True)
    place = jnp.where(keep, slot, slots).reshape(k, t).T.reshape(-1)  # each token-major route's slot

    def compute(xs):
        buf_ECD = xs.reshape(n_e, cap, d)
        if expert and p > 1:  # to the experts' devices: [source device x local experts, C, D]
            buf_ECD = jax.lax.all_to_all(buf_ECD, expert, 0, 0, tiled=True)
            buf = buf_ECD.reshape(p, n_local, cap, d).swapaxes(0, 1).reshape(n_local, p * cap, d)
        else:
            buf = buf_ECD
        out = _mlp(c, lambda lhs, rhs: jnp.einsum("ecd,edf->ecf", lhs, rhs), buf, w_in, w_up, w_out)
        if expert and p > 1:  # and back to the tokens' devices
            out = out.reshape(n_local, p, cap, d).swapaxes(0, 1).reshape(n_e, cap, d)
            out = jax.lax.all_to_all(out, expert, 0, 0, tiled=True)
        return out.reshape(slots, d)

    y_TD = _through_buffer(x_TD, top_w.reshape(-1), place, src, k, compute)
    return y_TD, jnp.sum(~keep).astype(jnp.float32)


def _through_buffer(x_TD, w_route, place, src, k: int, compute):
    """The routes' rows through an expert buffer and back: buffer row b holds the token of route
    src[b] (token-major routes, T x k of them; src[b] = T x k: an empty row of zeros), `compute` maps
    the buffer's rows to the experts' outputs, and token t gets the sum over its k routes r of
    weight w_route[r] x the output at row place[r] (place[r] >= the buffer's rows: none, 0). place
    and src are inverse maps between the routes and the rows that hold them. Both directions, and
    their gradients, are row gathers (_gather_rows): no scatter of d_model-wide rows."""
    t = x_TD.shape[0]
    token = jnp.where(src < t * k, src // k, t)  # each buffer row's token (t: none)
    xs = _gather_rows(x_TD, token, place, 1, k)
    ys = compute(xs)
    weight = _gather_rows(w_route, src, place, 1, 1)  # each buffer row's routing weight (0: empty)
    return _gather_rows(ys.astype(jnp.float32) * weight[:, None], place, token, k, 1)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _gather_rows(x, index, back_index, fan: int, back_fan: int):
    """out[i] = sum over j < fan of x[index[i x fan + j]] (an index >= len(x): a zero row), whose
    gradient is the same op the other way: dx[n] = sum over j < back_fan of dout[back_index[n x
    back_fan + j]]. back_index must list, for each row n of x, every (i, j) that reads it (by i; its
    other entries >= len(out)): the caller's inverse map. Autodiff of a plain gather would give a
    scatter-add, which a TPU runs a row at a time (~27 ns a 2 KiB row, against ~4 for a gather)."""
    return _summed_rows(x, index, fan)


def _summed_rows(x, index, fan: int):
    rows = x.at[index].get(mode="fill", fill_value=0)
    return rows if fan == 1 else rows.reshape(-1, fan, *x.shape[1:]).sum(axis=1)


def _gather_rows_fwd(x, index, back_index, fan: int, back_fan: int):
    return _summed_rows(x, index, fan), (index, back_index)


def _gather_rows_bwd(fan: int, back_fan: int, res, dout):
    index, back_index = res
    return _gather_rows(dout, back_index, index, back_fan, fan), None, None


_gather_rows.defvjp(_gather_rows_fwd, _gather_rows_bwd)

"""Named rules tables from logical axis names (used by model code) to mesh axes.

| rules             | activations' embed dim (the residual stream)                        |
|-------------------|----------------------------------------------------------------------|
| default           | replicated over tensor: every tensor shard holds the whole stream    |
| sequence_parallel | sharded over tensor, as MaxText's `activation_embed` rule: the       |
|                   | residual stream, norms and the MLP/attention inputs are split over    |
|                   | tensor, and XLA all-gathers / reduce-scatters around the projections |

`rules_for(name, model, axis_sizes)` resolves a table for one model and mesh: K/V heads
that do not divide over tensor (e.g. multi-query attention with tensor=2) are replicated
over tensor instead of sharded.
"""
from __future__ import annotations

import flax.linen as nn
import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from .errors import ConfigError

Rules = tuple[tuple[str, str | tuple[str, ...] | None], ...]

# Parameters: sharded over fsdp (and context and expert, which otherwise would replicate them) on
# their embed dim, over tensor on heads / mlp / vocab; a MoE layer's expert weights (trainer/moe.py)
# over expert on their leading (experts) dim, fsdp and context on embed, tensor on their hidden dim.
# Activations: batch over data+fsdp+expert (outside the MoE layers the expert axis splits the batch, as
# MaxText's does), heads and mlp hidden over tensor. With expert = 1 (every dense model) the rules
# shard exactly as they did before the expert axis.
LOGICAL_RULES: Rules = (
    ("batch", ("data", "fsdp", "expert")),
    ("length", "context"),  # context parallelism (trainer/context.py); a no-op at context 1
    ("act_embed", None),
    ("act_heads", "tensor"),
    ("act_kv_heads", "tensor"),
    ("act_mlp", "tensor"),
    ("act_vocab", "tensor"),
    ("act_kv", None),
    ("embed", ("fsdp", "context", "expert")),  # context and expert devices share the weights' shards too, as MaxText's
    # rules do
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("kv", None),
    ("mlp", "tensor"),
    ("vocab", "tensor"),
    ("layers", None),
    ("norm", None),
    # multi-head latent attention (trainer/mla.py), as MaxText's rules: the up-projections' latent (input)
    # dim over the weights' embed axes, the down-projections' latent (output) dim whole
    ("q_lora", ("fsdp", "context", "expert")),
    ("kv_lora", ("fsdp", "context", "expert")),
    ("q_lora_up", None),
    ("kv_lora_up", None),
    # mixture of experts (trainer/moe.py): the experts' dim, and the expert weights' embed and hidden dims
    ("exp", "expert"),
    ("expert_embed", ("fsdp", "context")),
    ("expert_mlp", "tensor"),
    # pipeline (trainer/pipeline.py): the stacked layers' stage dimension and the stages' activations
    ("stage", "stage"),
    ("act_stage", "stage"),
    # what runs after a pipeline (final norm, unembedding, loss) splits its batch over the stage
    # devices too, as MaxText's data sharding does, instead of every stage repeating it
    ("stage_batch", ("data", "stage", "fsdp", "expert")),
)


def _replace(rules: Rules, **updates) -> Rules:
    return tuple((name, updates.get(name, axes)) for name, axes in rules)


RULE_SETS: dict[str, Rules] = {
    "default": LOGICAL_RULES,
    "sequence_parallel": _replace(LOGICAL_RULES, act_embed="tensor"),
}


def get_rules(name: str) -> Rules:
    if name not in RULE_SETS:
        raise ConfigError(f"unknown sharding rules {name!r}; choose one of {', '.join(RULE_SETS)}")
    return RULE_SETS[name]


def rules_for(name: str, model=None, axis_sizes: dict[str, int] | None = None) -> Rules:
    """The named table, with K/V heads replicated over tensor where they do not divide over it, and
    a latent-attention rank (q_lora_rank, kv_lora_rank) whole where it does not divide over the
    weights' embed axes (fsdp x context x expert)."""
    rules = get_rules(name)
    if model is not None and axis_sizes is not None:
        kv = model.kv_heads
        if kv % axis_sizes.get("tensor", 1):
            rules = _replace(rules, kv_heads=None, act_kv_heads=None)
        if getattr(model, "attention_type", "mha") == "mla":
            shards = axis_sizes.get("fsdp", 1) * axis_sizes.get("context", 1) * axis_sizes.get("expert", 1)
            whole = {f"{n}_lora": None for n in ("q", "kv") if getattr(model, f"{n}_lora_rank") % shards}
            rules = _replace(rules, **whole)
    return rules


def logical_to_sharding(logical_tree, mesh, rules: Rules = LOGICAL_RULES) -> object:
    """NamedShardings for a tree of logical PartitionSpecs (from nn.get_partition_spec)."""
    return nn.logical_to_mesh_sharding(logical_tree, mesh, rules)


def batch_sharding(mesh) -> NamedSharding:
    return NamedSharding(mesh, P(tuple(a for a in ("data", "fsdp", "expert") if a in mesh.axis_names), None))


def replicated(mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def with_rules(rules: Rules = LOGICAL_RULES):
    """Context that makes nn.with_logical_constraint resolve against `rules`."""
    return nn.logical_axis_rules(rules)


def constrain(x: jax.Array, names: tuple) -> jax.Array:
    return nn.with_logical_constraint(x, names)

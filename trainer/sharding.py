"""The one rules table from logical axis names (used by model code) to mesh axes."""
from __future__ import annotations

import flax.linen as nn
import jax
from jax.sharding import NamedSharding, PartitionSpec as P

# Parameters: sharded over fsdp on their embed dim, over tensor on heads / mlp / vocab.
# Activations: batch over data+fsdp, heads and mlp hidden over tensor.
LOGICAL_RULES: tuple[tuple[str, object], ...] = (
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("act_embed", None),
    ("act_heads", "tensor"),
    ("act_mlp", "tensor"),
    ("act_vocab", "tensor"),
    ("act_kv", None),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv", None),
    ("mlp", "tensor"),
    ("vocab", "tensor"),
    ("layers", None),
    ("norm", None),
)


def logical_to_sharding(logical_tree, mesh) -> object:
    """NamedShardings for a tree of logical PartitionSpecs (from nn.get_partition_spec)."""
    return nn.logical_to_mesh_sharding(logical_tree, mesh, LOGICAL_RULES)


def batch_sharding(mesh) -> NamedSharding:
    return NamedSharding(mesh, P(("data", "fsdp"), None))


def replicated(mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def with_rules():
    """Context that makes nn.with_logical_constraint resolve against LOGICAL_RULES."""
    return nn.logical_axis_rules(LOGICAL_RULES)


def constrain(x: jax.Array, names: tuple) -> jax.Array:
    return nn.with_logical_constraint(x, names)

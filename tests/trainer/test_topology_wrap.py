"""Compile-only TPU slices carry the wraparound links of the real slice (trainer/topology.py
TpuSlice.wrap): a full v5e pod is a 2D torus, so the compiler overlaps the tensor-axis permutes
of a windowed einsum with the matmuls, as it does for MaxText's compile of the same slice; a
slice with no wraparound keeps them synchronous."""
import re

import pytest

from paxsearch.trainer import topology

from ..search_util import needs_libtpu


@pytest.mark.parametrize("name, wrap", [
    ("v5e-8", (False, False, False)), ("v5e-64", (False, False, False)), ("v5e-128", (False, True, False)),
    ("v5e-256", (True, True, False)), ("v6e-256", (True, True, False)), ("v4-32", (False, False, False)),
    ("v4-128", (True, True, True)), ("v5p-64", (False, False, False)), ("v5p-128", (True, True, True)),
    ("v5p-1024", (True, True, True)),
])
def test_wraparound_follows_the_slice_shape(name, wrap):
    assert topology.parse_slice(name).wrap == wrap


def _permutes(name: str, fsdp: int, tensor: int) -> tuple[int, int]:
    """(synchronous, asynchronous) collective-permutes in a sharded MLP's gradient step compiled
    for `name`, batch over fsdp and both activations over tensor (a windowed einsum each way)."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import mesh_utils
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    devices = topology.topology_devices(name)
    mesh = Mesh(mesh_utils.create_device_mesh((fsdp, tensor), devices, allow_split_physical_axes=True),
                ("fsdp", "tensor"))
    act = NamedSharding(mesh, P("fsdp", None, "tensor"))

    def loss(params, x):
        w1, w2 = params
        h = jax.lax.with_sharding_constraint(
            jax.nn.relu(jnp.einsum("bse,ef->bsf", jax.lax.with_sharding_constraint(x, act), w1)), act)
        y = jax.lax.with_sharding_constraint(jnp.einsum("bsf,fe->bse", h, w2), act)
        return jnp.mean(y.astype(jnp.float32) ** 2)

    e, f = 4096, 16384
    x = jax.ShapeDtypeStruct((16 * fsdp, 2048, e), jnp.bfloat16, sharding=act)
    w1 = jax.ShapeDtypeStruct((e, f), jnp.bfloat16, sharding=NamedSharding(mesh, P("fsdp", "tensor")))
    w2 = jax.ShapeDtypeStruct((f, e), jnp.bfloat16, sharding=NamedSharding(mesh, P("tensor", "fsdp")))
    hlo = jax.jit(jax.grad(loss)).lower((w1, w2), x).compile().as_text()
    return len(re.findall(r"= [^=]*? collective-permute\(", hlo)), hlo.count("collective-permute-start(")


@pytest.mark.slow  # quick-loop budget: two compiles for 256- and 32-chip slices (30 CPU-s); CI runs it
@needs_libtpu
def test_a_full_pod_overlaps_the_tensor_axis_permutes_and_an_open_slice_does_not():
    sync, overlapped = _permutes("v5e-256", 16, 16)  # 16 x 16: both dimensions wrap
    assert overlapped > 0 and sync == 0
    sync, overlapped = _permutes("v5e-32", 2, 16)  # 4 x 8: an open mesh, as the real slice is
    assert sync > 0

"""Compile-only TPU slices carry the wraparound links of the real slice (search/planning/topology.py
TpuSlice.wrap): a full v5e pod is a 2D torus, so the compiler overlaps the tensor-axis permutes
of a windowed einsum with the matmuls, as it does for MaxText's compile of the same slice; a
slice with no wraparound keeps them synchronous."""
import re

import pytest

from paxsearch.search.planning import topology

from ...search_util import needs_libtpu


@pytest.mark.parametrize("name, wrap", [
    ("v5e-8", (False, False, False)), ("v5e-64", (False, False, False)), ("v5e-128", (False, True, False)),
    ("v5e-256", (True, True, False)), ("v6e-256", (True, True, False)), ("v4-32", (False, False, False)),
    ("v4-128", (True, True, True)), ("v5p-64", (False, False, False)), ("v5p-128", (True, True, True)),
    ("v5p-1024", (True, True, True)),
])
def test_wraparound_follows_the_slice_shape(name, wrap):
    assert topology.parse_slice(name).wrap == wrap


@needs_libtpu
@pytest.mark.parametrize("name", ["v5e-32", "v5e-128", "v5e-256", "v5p-64", "v5p-128"])
def test_the_planner_reads_the_wraparound_from_the_devices_coordinates(name):
    # the roofline prices a ring collective along an open dimension one way per link (tests/roofline/
    # test_ici_efficiency.py); it learns which dimensions wrap from the compile-only devices it plans
    from paxsearch.search.planning.predict import hardware_for

    tpu_slice = topology.parse_slice(name)
    assert hardware_for(topology.topology_devices(name)).torus_wrap == tpu_slice.wrap
    assert hardware_for([], tpu_slice.chip.name).torus_wrap is None  # no devices: every dim wraps, as before


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


def test_a_v5p_slice_names_another_of_its_topologies():
    """'v5p-1024@4x8x16': the same 512 chips as 4 x 8 x 16 cubes' worth, still a torus in all three
    dimensions; the usual shape drops the suffix; the accelerator type libtpu is told stays v5p-1024."""
    s = topology.parse_slice("v5p-1024@4x8x16")
    assert (s.name, s.shape, s.chips, s.wrap) == ("v5p-1024@4x8x16", (4, 8, 16), 512, (True, True, True))
    assert s.topology_name == "v5p:4x8x16" and s.accelerator_type == "v5p-1024"
    assert (s.base_name, s.chosen_topology) == ("v5p-1024", "4x8x16")
    assert topology.parse_slice("v5p-1024").chosen_topology == ""
    assert topology.parse_slice("v5p-1024@8x8x8") == topology.parse_slice("v5p-1024")
    from paxsearch.search.planning.targets import parse_target
    t = parse_target("tpu:v5p-1024@4x8x16")
    assert (t.name, t.slice_name, t.num_devices) == ("tpu:v5p-1024@4x8x16", "v5p-1024@4x8x16", 512)


@pytest.mark.parametrize("name, says", [
    ("v5e-256@16x16", "one topology per size (16x16)"),
    ("v5p-1024@4x8x8", "4x8x8 holds 256 chips, v5p-1024 has 512"),
    ("v5p-1024@2x16x16", "each dimension is a multiple of 4"),
    ("v5p-32@4x2x2", "smaller slices have one topology (2x2x4 here)"),
    ("v5p-1024@4x8", "three chip counts AxBxC"),
])
def test_a_topology_that_the_slice_cannot_have_is_one_line(name, says):
    with pytest.raises(topology.ConfigError) as e:
        topology.parse_slice(name)
    assert says in str(e.value) and "\n" not in str(e.value)


@needs_libtpu
def test_a_tensor_axis_of_16_needs_a_dimension_of_16():
    """Why a published run with tensor 16 on 512 v5p chips (MaxText 512B, benchmarks/published.py) had
    the 4x8x16 topology: jax's create_device_mesh of Dec 2023 (no allow_split_physical_axes) cannot
    lay an axis of 16 on 8 x 8 x 8 and can on 4 x 8 x 16."""
    from jax.experimental import mesh_utils

    with pytest.raises(NotImplementedError, match="Failed to find assignment"):
        mesh_utils.create_device_mesh((1, 32, 16), topology.topology_devices("v5p-1024"))
    mesh = mesh_utils.create_device_mesh((1, 32, 16), topology.topology_devices("v5p-1024@4x8x16"))
    ring = [d.coords for d in mesh[0, 0, :]]
    assert sorted(c[2] for c in ring) == list(range(16)) and len({(c[0], c[1]) for c in ring}) == 1

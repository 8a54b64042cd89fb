"""A ragged dot (jax.lax.ragged_dot: trainer/moe.py's dropless experts) priced as the work of its groups
(search/planning/roofline/cost.py ragged_dot_groups, conv_flops). The TPU compiler writes it as a
convolution over the G groups (window G, stride G - 1, lhs dilation G: output group g meets kernel group g)
of every row broadcast to each group and masked; XLA's cost analysis counts that at G x the routed work,
the dense expansion. The roofline counts each row once: 2 x rows x K x N per matmul."""
import jax
import jax.numpy as jnp
import pytest

from paxsearch.search.planning import roofline as R
from paxsearch.search.planning import topology
from paxsearch.search.planning.predict import hardware_for
from paxsearch.search.planning.roofline import cost, hlo

from ..search_util import needs_libtpu

ROWS, K, N = 4096, 512, 1024  # rows: the (token, choice) pairs sorted by expert


def _compiled(groups: int, grad: bool):
    device = topology.topology_devices("v5e-4")[0]
    sharding = jax.sharding.SingleDeviceSharding(device)
    args = (jax.ShapeDtypeStruct((ROWS, K), jnp.bfloat16, sharding=sharding),
            jax.ShapeDtypeStruct((groups, K, N), jnp.bfloat16, sharding=sharding),
            jax.ShapeDtypeStruct((groups,), jnp.int32, sharding=sharding))
    fn = jax.lax.ragged_dot
    if grad:  # the backward's two ragged dots: d lhs (rows x N by the groups' N x K) and d rhs (per group K x N)
        fn = jax.grad(lambda x, w, g: jnp.sum(jax.lax.ragged_dot(x, w, g).astype(jnp.float32)), argnums=(0, 1))
    return jax.jit(fn).lower(*args).compile()


def _ragged_convolutions(text: str) -> list[int]:
    module = R.parse_module(text)
    found = []
    for comp in module.computations.values():
        for ins in comp.instrs:
            if ins.opcode == "convolution":
                lhs, rhs = (hlo.operand_shape(comp, o) for o in ins.operands[:2])
                found.append(cost.ragged_dot_groups(ins, lhs, rhs))
    return found


@needs_libtpu
@pytest.mark.parametrize("groups", [8, 32])
def test_a_compiled_ragged_dot_is_priced_at_its_groups_work_not_the_dense_expansion(groups):
    compiled = _compiled(groups, grad=False)
    text = compiled.as_text()
    assert _ragged_convolutions(text) == [groups]  # the one convolution, over the G groups
    routed = 2.0 * ROWS * K * N
    # XLA's own count is the dense expansion: every row against every group's weights
    assert compiled.cost_analysis()["flops"] == pytest.approx(groups * routed, rel=0.02)
    hw = hardware_for([], "v5e")
    roof = R.analyze(text, hw, num_devices=1)
    # the matmul's routed work, plus the elementwise select by the mask and the sum over the G products
    # of [G, rows, N] (counted as XLA counts them: one FLOP an element each)
    assert routed <= roof.flops_per_step <= routed + 2 * groups * ROWS * N + 1e6
    # priced at the matmul rate (or the bytes, whichever is slower), as a dot of the same work would be
    assert roof.compute_s >= routed / hw.sustained_flops


@needs_libtpu
def test_the_backward_ragged_dots_are_priced_at_their_groups_work_too():
    groups = 8
    compiled = _compiled(groups, grad=True)
    text = compiled.as_text()
    assert sorted(_ragged_convolutions(text)) == [groups, groups]  # d lhs and d rhs
    routed = 2 * 2.0 * ROWS * K * N
    assert compiled.cost_analysis()["flops"] == pytest.approx(groups * routed, rel=0.02)
    priced = R.analyze(text, hardware_for([], "v5e"), num_devices=1).flops_per_step
    assert routed <= priced <= routed + 2 * groups * ROWS * (K + N) + 1e6


def test_a_convolution_of_another_window_keeps_xlas_count():
    """A strided 1-D convolution whose window is not the groups' diagonal (size 3, stride 1) is counted in full."""
    text = """HloModule m, is_scheduled=true

ENTRY %main (a: bf16[8,64,128], b: bf16[3,128,256]) -> bf16[8,64,256] {
  %a = bf16[8,64,128]{2,1,0} parameter(0)
  %b = bf16[3,128,256]{2,1,0} parameter(1)
  ROOT %c = bf16[8,64,256]{2,1,0} convolution(%a, %b), window={size=3 pad=1_1}, dim_labels=0bf_0io->0bf
}
"""
    module = R.parse_module(text)
    comp = module.computations[module.entry]
    conv = next(i for i in comp.instrs if i.opcode == "convolution")
    lhs, rhs = (hlo.operand_shape(comp, o) for o in conv.operands)
    assert cost.ragged_dot_groups(conv, lhs, rhs) == 1
    # 8 outputs x (3 taps, less the 2 that fall on the padding) x 64 x 128 x 256 multiply-adds
    assert cost.conv_flops(conv, lhs, rhs) == 2.0 * 64 * 128 * 256 * (8 * 3 - 2)


@needs_libtpu
def test_a_batched_matmul_over_the_experts_is_the_same_convolution_and_keeps_its_full_count():
    """The capacity experts' einsum ('ecd,edf->ecf', trainer/moe.py) compiles to the same convolution over the
    groups, each group with rows of its own: all of it is work (told apart by jax's op_name)."""
    groups, rows = 8, ROWS // 8
    sharding = jax.sharding.SingleDeviceSharding(topology.topology_devices("v5e-4")[0])
    args = (jax.ShapeDtypeStruct((groups, rows, K), jnp.bfloat16, sharding=sharding),
            jax.ShapeDtypeStruct((groups, K, N), jnp.bfloat16, sharding=sharding))
    text = jax.jit(lambda x, w: jnp.einsum("ecd,edf->ecf", x, w)).lower(*args).compile().as_text()
    convolutions = [line for line in text.splitlines() if " convolution(" in line]
    assert convolutions and all(f"window={{size={groups} stride={groups - 1} lhs_dilate={groups}}}" in line
                                for line in convolutions)
    assert _ragged_convolutions(text) == [1]
    roof = R.analyze(text, hardware_for([], "v5e"), num_devices=1)
    assert roof.flops_per_step == pytest.approx(2.0 * groups * rows * K * N, rel=0.01)


@needs_libtpu
def test_on_v5p_the_ragged_dot_is_a_kernel_priced_at_its_groups_work_at_the_matmul_rate():
    """On v5p the compiler writes jax.lax.ragged_dot as its ragged-dot kernel (a tpu_custom_call, named
    ragged-dot-...): the forward, the lhs and the rhs gradients each 2 x rows x K x N, at the matmul rate."""
    groups = 8
    sharding = jax.sharding.SingleDeviceSharding(topology.topology_devices("v5p-8")[0])
    args = (jax.ShapeDtypeStruct((ROWS, K), jnp.bfloat16, sharding=sharding),
            jax.ShapeDtypeStruct((groups, K, N), jnp.bfloat16, sharding=sharding),
            jax.ShapeDtypeStruct((groups,), jnp.int32, sharding=sharding))
    for fn, matmuls in ((jax.lax.ragged_dot, 1),
                        (jax.grad(lambda x, w, g: jnp.sum(jax.lax.ragged_dot(x, w, g).astype(jnp.float32)),
                                  argnums=(0, 1)), 2)):
        text = jax.jit(fn).lower(*args).compile().as_text()
        module = R.parse_module(text)
        kernels = [i for c in module.computations.values() for i in c.instrs if cost.is_ragged_dot_kernel(i)]
        assert len(kernels) == matmuls and " convolution(" not in text
        hw = hardware_for([], "v5p")
        roof = R.analyze(text, hw, num_devices=1)
        routed = matmuls * 2.0 * ROWS * K * N
        assert routed <= roof.flops_per_step <= routed * 1.01
        assert roof.compute_s >= routed / hw.sustained_flops * 0.999
        assert all(cost.uses_mxu(module, k) for k in kernels)


def test_the_chips_ragged_dot_kernels_without_a_jax_op_name_are_ragged_dots_of_the_backward():
    """libtpu 0.0.42.1 (the project's v5e chip) names the ragged-dot kernels of the lhs gradient only by the
    kernel's own name (op_name="ragged-dot-none", no jit(...)/ path): each is a ragged dot at the backward share,
    not an op priced by its bytes (that left 8 ms of a 148 ms MoE step unpriced); its group-metadata calls are not."""
    import gzip
    import os

    from paxsearch.search.planning.roofline import indexed

    from ..search_util import REPO

    path = os.path.join(REPO, "benchmarks", "data", "chip_steps_v5e_run8b", "moe8-s1k-b10-dropless.hlo.txt.gz")
    with gzip.open(path, "rt") as f:
        module = R.parse_module(f.read())
    calls = [i for c in module.computations.values() for i in c.instrs if i.name.startswith("ragged-dot")]
    kernels = [i for i in calls if cost.is_ragged_dot_kernel(i)]
    bare = [i for i in kernels if hlo.op_name(i) == "ragged-dot-none"]
    assert len(kernels) == 9 and len(bare) == 3 and len(calls) == 11  # and the two metadata calls
    assert all(indexed.is_backward(i) for i in bare)
    assert all(cost.uses_mxu(module, i) for i in kernels)
    named = [i for i in kernels if i not in bare]
    # of the six named: the forward's three, and three recomputed under transpose(...)/rematted_computation
    assert sum(indexed.is_backward(i) for i in named) == 3

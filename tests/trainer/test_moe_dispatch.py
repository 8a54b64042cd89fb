"""The MoE layer's token dispatch and combine (trainer/moe.py _through_buffer): row gathers in both
directions, forward and backward. Held against the plain formulation they replace (a gather of the
tokens and a segment sum back, or a scatter into the capacity buffer, differentiated by autodiff):
the same values and gradients; and the lowered gradient of the layer holds no scatter of
d_model-wide rows (a TPU runs a scatter a row at a time), which the plain formulation's does."""
import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from paxsearch.trainer import moe as moe_lib
from paxsearch.trainer import step as step_lib
from paxsearch.trainer.config import ModelConfig

from ..search_util import needs_libtpu

# d_model 48 is no other dimension of the layer (width 24, 8 experts, 10 tokens, 20 routes), so a scatter
# whose updates have a dimension of 48 is one of d_model-wide rows
D_MODEL, WIDTH, N_EXPERTS, TOP_K, TOKENS = 48, 24, 8, 2, 10
MODEL = ModelConfig(vocab_size=64, d_model=D_MODEL, n_layers=1, n_heads=2, head_dim=16, d_ff=64, seq_len=16,
                    mlp="gated", activation="silu", n_experts=N_EXPERTS, experts_per_token=TOP_K,
                    expert_d_ff=WIDTH)


def _plain_dropless(c, x_TD, top_w, top_i, w_in, w_up, w_out):
    """Dropless as written before the gathers (no expert axis): the routes of w_in's experts sorted
    by expert, x[token] in, segment_sum back; its gradient by autodiff."""
    k, n_local = c.experts_per_token, w_in.shape[0]
    local_e = top_i.reshape(-1)
    mine = local_e < n_local
    key = jnp.where(mine, local_e, n_local)
    order = jnp.argsort(key, stable=True)
    group_sizes = jnp.bincount(key, length=n_local + 1)[:n_local].astype(jnp.int32)
    token = order // k
    ys = moe_lib._mlp(c, lambda lhs, rhs: jax.lax.ragged_dot(lhs, rhs, group_sizes), x_TD[token], w_in, w_up, w_out)
    weight = (top_w.reshape(-1) * mine)[order]
    return jax.ops.segment_sum(ys.astype(jnp.float32) * weight[:, None], token, num_segments=x_TD.shape[0])


def _plain_capacity(c, x_TD, top_w, top_i, w_in, w_up, w_out):
    """Capacity as written before the gathers (no expert axis): the buffer filled by a scatter,
    read back by a gather and a segment sum; its gradient by autodiff."""
    t, d = x_TD.shape
    k, n_e = c.experts_per_token, c.n_experts
    cap = moe_lib.capacity(t, c)
    e_flat, w_flat = top_i.T.reshape(-1), top_w.T.reshape(-1)
    token = jnp.tile(jnp.arange(t), k)
    onehot = jax.nn.one_hot(e_flat, n_e, dtype=jnp.int32)
    position = jnp.sum((jnp.cumsum(onehot, axis=0) - 1) * onehot, axis=1)
    keep = position < cap
    slot = jnp.where(keep, position, cap)
    buf = jnp.zeros((n_e, cap, d), x_TD.dtype).at[e_flat, slot].set(x_TD[token], mode="drop")
    out = moe_lib._mlp(c, lambda lhs, rhs: jnp.einsum("ecd,edf->ecf", lhs, rhs), buf, w_in, w_up, w_out)
    y_route = out.at[e_flat, slot].get(mode="fill", fill_value=0).astype(jnp.float32)
    return jax.ops.segment_sum(y_route * (w_flat * keep)[:, None], token, num_segments=t)


def _routes(kind: str, rng):
    """(top_w T x k, top_i T x k): k distinct experts a token; "random", or every route on the first
    or the last two experts (the other groups empty)."""
    if kind == "random":
        top_i = np.argsort(rng.random((TOKENS, N_EXPERTS)), axis=1)[:, :TOP_K]
    else:
        top_i = np.tile(np.arange(TOP_K) + (N_EXPERTS - TOP_K if kind == "last_two" else 0), (TOKENS, 1))
    top_w = rng.random((TOKENS, TOP_K)) + 0.1
    return jnp.asarray(top_w / top_w.sum(1, keepdims=True), jnp.float32), jnp.asarray(top_i, jnp.int32)


def _weights(rng, n_local: int):
    w = lambda *shape: jnp.asarray(rng.normal(size=shape) / np.sqrt(shape[-2]), jnp.float32)
    return w(n_local, D_MODEL, WIDTH), w(n_local, D_MODEL, WIDTH), w(n_local, WIDTH, D_MODEL)


def _relative_gap(a, b) -> float:
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))) / max(float(np.max(np.abs(np.asarray(y)))), 1e-30))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


CASES = [  # (expert_compute, grouped matmul, routes, local experts, capacity factor)
    ("dropless", "ragged_dot", "random", N_EXPERTS, 1.0),
    ("dropless", "ragged_dot", "first_two", N_EXPERTS, 1.0),  # empty groups
    ("dropless", "ragged_dot", "random", N_EXPERTS // 2, 1.0),  # routes to other devices' experts
    ("dropless", "blocks", "random", N_EXPERTS, 1.0),
    ("dropless", "blocks", "first_two", N_EXPERTS, 1.0),
    ("dropless", "blocks", "random", N_EXPERTS // 2, 1.0),
    ("dropless", "blocks4", "random", N_EXPERTS, 1.0),  # blocks of 4 rows: groups over several blocks
    ("dropless", "blocks4", "first_two", N_EXPERTS // 2, 1.0),
    ("dropless", "blocks4", "last_two", N_EXPERTS // 2, 1.0),  # no route on this device's experts: all 0
    ("dropless", "ragged_dot", "last_two", N_EXPERTS // 2, 1.0),
    ("capacity", None, "random", N_EXPERTS, 0.5),  # routes dropped
    ("capacity", None, "first_two", N_EXPERTS, 1.0),  # most routes dropped, most slots empty
    ("capacity", None, "random", N_EXPERTS, N_EXPERTS / TOP_K),  # nothing dropped
]


@pytest.mark.parametrize("compute,grouped,routes,n_local,factor", CASES)
def test_gathers_give_the_plain_formulations_values_and_gradients(compute, grouped, routes, n_local, factor,
                                                                   monkeypatch):
    """Outputs and gradients (tokens, routing weights, the three expert weights) of the new dispatch
    and combine against the plain formulation, float32, relative 1e-6 (the blocks grouped matmul,
    whole groups of rows in blocks of BLOCK rows, against ragged_dot: the same)."""
    if grouped == "blocks4":
        monkeypatch.setattr(moe_lib, "BLOCK", 4)
        grouped = "blocks"
    rng = np.random.default_rng(0)
    c = dataclasses.replace(MODEL, expert_compute=compute, capacity_factor=factor)
    x = jnp.asarray(rng.normal(size=(TOKENS, D_MODEL)), jnp.float32)
    top_w, top_i = _routes(routes, rng)
    weights = _weights(rng, n_local)
    probe = jnp.asarray(rng.normal(size=(TOKENS, D_MODEL)), jnp.float32)
    if compute == "dropless":
        new = lambda x, w, *ws: moe_lib._dropless(c, x, w, top_i, *ws, {"grouped_matmul": grouped})
        plain = lambda x, w, *ws: _plain_dropless(c, x, w, top_i, *ws)
    else:
        new = lambda x, w, *ws: moe_lib._capacity(c, x, w, top_i, *ws, {})[0]
        plain = lambda x, w, *ws: _plain_capacity(c, x, w, top_i, *ws)
    args = (x, top_w, *weights)
    want, got = plain(*args), new(*args)
    grad = lambda f: jax.grad(lambda *a: jnp.sum(jnp.sin(f(*a)) * probe), argnums=tuple(range(5)))(*args)
    want_g, got_g = grad(plain), grad(new)
    if routes == "last_two" and n_local < N_EXPERTS:  # nothing to compute here
        assert all(float(jnp.max(jnp.abs(a))) == 0 for a in (got, want, *got_g, *want_g))
        return
    assert float(jnp.max(jnp.abs(want))) > 0
    assert _relative_gap(got, want) < 1e-6
    assert all(float(jnp.max(jnp.abs(g))) > 0 for g in want_g)
    assert _relative_gap(got_g, want_g) < 1e-6


def _inverse(index: np.ndarray, fan: int, rows: int, back_fan: int) -> np.ndarray:
    """back_index of _gather_rows: for each of the `rows` source rows, the output rows that read it
    (padded with len(out) up to back_fan)."""
    n_out = len(index) // fan
    back = [[] for _ in range(rows)]
    for pos, src in enumerate(index):
        if src < rows:
            back[src].append(pos // fan)
    assert max(len(b) for b in back) <= back_fan
    return np.asarray([b + [n_out] * (back_fan - len(b)) for b in back], np.int32).reshape(-1)


@pytest.mark.parametrize("fan,back_fan", [(1, 1), (1, 3), (3, 1)])
def test_gather_rows_gradient_is_the_autodiff_gradient(fan, back_fan):
    """_gather_rows's custom gradient (a gather the other way) against autodiff of the same forward
    (a scatter-add): first and second order, with empty rows (index past the source) both ways."""
    rng = np.random.default_rng(1)
    rows, width = 7, 5
    # each source row read by up to back_fan (output row, j) pairs; some never read, some outputs empty
    reads = np.concatenate([np.repeat(np.arange(rows), rng.integers(0, back_fan + 1, rows)), [rows] * 3])
    index = rng.permutation(np.concatenate([reads, [rows] * (-len(reads) % fan)])).astype(np.int32)
    back_index = _inverse(index, fan, rows, back_fan)
    x = jnp.asarray(rng.normal(size=(rows, width)), jnp.float32)
    probe = jnp.asarray(rng.normal(size=(len(index) // fan, width)), jnp.float32)
    custom = lambda x: jnp.sum(jnp.sin(moe_lib._gather_rows(x, index, back_index, fan, back_fan)) * probe)
    plain = lambda x: jnp.sum(jnp.sin(moe_lib._summed_rows(x, index, fan)) * probe)
    np.testing.assert_allclose(jax.grad(custom)(x), jax.grad(plain)(x), rtol=1e-6, atol=1e-6)
    tangent = jnp.asarray(rng.normal(size=x.shape), jnp.float32)
    second = lambda f: jax.grad(lambda x: jnp.vdot(jax.grad(f)(x), tangent))(x)  # reverse over reverse
    np.testing.assert_allclose(second(custom), second(plain), rtol=1e-5, atol=1e-6)
    assert float(jnp.max(jnp.abs(jax.grad(custom)(x)))) > 0


def _scatters(text: str) -> list[str]:
    """The operand types of every stablehlo.scatter in lowered text: '(operand, indices, updates)'."""
    return re.findall(r'"stablehlo\.scatter".*?\}\) : \((.*?)\) ->', text, re.S)


def _wide_row_scatters(text: str) -> list[str]:
    """The scatters whose updates are rows of d_model floats."""
    wide = []
    for types in _scatters(text):
        updates = types.split("tensor<")[-1]
        dims = updates.split("x")[:-1]
        if str(D_MODEL) in dims and not updates.split("x")[-1].startswith("i"):
            wide.append(types)
    return wide


def _layer_gradient_text(model: ModelConfig, grouped: str, mesh=None) -> str:
    """The lowered value-and-gradient (parameters and input) of one MoE layer: without a mesh (the
    layer as one device runs it), or inside a shard_map over `mesh` (moe._sharded)."""
    layer = moe_lib.MoE(model, grouped_matmul=grouped)
    x = jax.random.normal(jax.random.key(1), (8 if mesh else 2, 5, D_MODEL))
    params = step_lib.unbox(layer.init(jax.random.key(2), x)["params"])
    if mesh is None:
        f = lambda p, x: jnp.sum(jnp.sin(layer.apply({"params": p}, x)[0]))
    else:
        def f(p, x):
            y, _ = moe_lib._sharded(model, mesh, x, p["router"], None, p["wi"], p["wi_up"], p["wo"], grouped)
            return jnp.sum(jnp.sin(y))
    return jax.jit(jax.value_and_grad(f, (0, 1))).lower(params, x).as_text()


@pytest.mark.parametrize("compute,expert", [("dropless", 1), ("dropless", 4), ("capacity", 1), ("capacity", 4)])
def test_layer_gradient_holds_no_scatter_of_model_wide_rows(compute, expert):
    """The MoE layer's lowered gradient, as a TPU gets it (grouped matmul ragged_dot), alone and under
    expert parallelism 4: its scatters are int32 index maps and the router's [tokens, experts] ones,
    none of d_model-wide rows. The plain formulation's gradient has them (forward or backward), so the
    check can fail."""
    model = dataclasses.replace(MODEL, expert_compute=compute, capacity_factor=1.0)
    mesh = (jax.sharding.Mesh(np.asarray(jax.devices()[:2 * expert]).reshape(2, expert), ("fsdp", "expert"))
            if expert > 1 else None)
    text = _layer_gradient_text(model, "ragged_dot", mesh)
    assert _scatters(text)  # the index maps: the parse finds scatters
    assert _wide_row_scatters(text) == []
    plain = lambda c, x, w, i, a, b, o, axes: ((_plain_dropless(c, x, w, i, a, b, o), jnp.zeros(()))
                                                if compute == "dropless" else
                                                (_plain_capacity(c, x, w, i, a, b, o), jnp.zeros(())))
    if expert == 1:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(moe_lib, "_dropless", lambda *a: plain(*a)[0])
            mp.setattr(moe_lib, "_capacity", plain)
            assert len(_wide_row_scatters(_layer_gradient_text(model, "ragged_dot"))) >= 2


@pytest.mark.parametrize("routes,n_local", [("random", N_EXPERTS // 2), ("first_two", N_EXPERTS)])
def test_megablox_gives_ragged_dots_values_and_gradients_in_interpret_mode(routes, n_local, monkeypatch):
    """The megablox grouped matmul (Pallas's interpret mode on CPU, row tile 8: 20 routes padded to
    24 rows) against the plain formulation with ragged_dot: values and gradients, float32, with rows
    of other devices' experts (which the kernel leaves unwritten) and empty groups."""
    monkeypatch.setattr(moe_lib, "_MEGABLOX_INTERPRET", True)
    monkeypatch.setattr(moe_lib, "MEGABLOX_TILING", (8, 128, 128))
    rng = np.random.default_rng(2)
    c = dataclasses.replace(MODEL, grouped_matmul="megablox")
    x = jnp.asarray(rng.normal(size=(TOKENS, D_MODEL)), jnp.float32)
    top_w, top_i = _routes(routes, rng)
    args = (x, top_w, *_weights(rng, n_local))
    probe = jnp.asarray(rng.normal(size=(TOKENS, D_MODEL)), jnp.float32)
    new = lambda x, w, *ws: moe_lib._dropless(c, x, w, top_i, *ws, {"grouped_matmul": "megablox"})
    plain = lambda x, w, *ws: _plain_dropless(c, x, w, top_i, *ws)
    got, want = new(*args), plain(*args)
    assert float(jnp.max(jnp.abs(want))) > 0 and bool(jnp.all(jnp.isfinite(got)))
    assert _relative_gap(got, want) < 1e-6
    grad = lambda f: jax.grad(lambda *a: jnp.sum(jnp.sin(f(*a)) * probe), argnums=tuple(range(5)))(*args)
    got_g, want_g = grad(new), grad(plain)
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in got_g)
    assert _relative_gap(got_g, want_g) < 1e-6


def test_megablox_under_expert_parallelism_in_interpret_mode(monkeypatch):
    """Megablox inside the layer's shard_map (unchecked: the kernel declares no varying axes), fsdp 2 x
    expert 4, interpret mode: the value and gradients of the layer without a mesh (ragged_dot)."""
    monkeypatch.setattr(moe_lib, "_MEGABLOX_INTERPRET", True)
    monkeypatch.setattr(moe_lib, "MEGABLOX_TILING", (8, 128, 128))
    m = dataclasses.replace(MODEL, grouped_matmul="megablox")
    layer = moe_lib.MoE(m)
    x = jax.random.normal(jax.random.key(1), (8, 5, D_MODEL))
    p = step_lib.unbox(layer.init(jax.random.key(2), x)["params"])
    probe = jax.random.normal(jax.random.key(3), x.shape)
    mesh = jax.sharding.Mesh(np.asarray(jax.devices()).reshape(2, 4), ("fsdp", "expert"))

    def objective(impl, mesh):
        def f(p, x):
            w = (p["router"], None, p["wi"], p["wi_up"], p["wo"])
            y, sums = (moe_lib._local(m, x, *w, {"grouped_matmul": impl}) if mesh is None
                       else moe_lib._sharded(m, mesh, x, *w, impl))
            return jnp.sum(jnp.sin(y) * probe) + 0.1 * jnp.sum(sums["prob_sums"])
        return jax.jit(jax.value_and_grad(f, (0, 1)))(p, x)

    want, got = objective("ragged_dot", None), objective("megablox", mesh)
    assert _relative_gap(got, want) < 1e-5  # the reduce-scatter sums in another order than one device
    assert float(jnp.max(jnp.abs(got[1][0]["wi"]))) > 0


def test_grouped_matmul_by_platform_and_refusals_in_one_line():
    """model.grouped_matmul: "auto" is blocks on CPU and ragged_dot elsewhere; megablox runs on TPU and
    is refused elsewhere, naming the fix (plan.make_model, before anything compiles); unknown values,
    and a grouped matmul with the capacity experts, are refused by the static checks."""
    from paxsearch.trainer import plan as plan_lib
    from paxsearch.trainer.config import TrainConfig
    from paxsearch.trainer.errors import ConfigError

    megablox = dataclasses.replace(MODEL, grouped_matmul="megablox")
    assert [moe_lib.grouped_matmul(MODEL, p) for p in ("cpu", "gpu", "tpu")] == ["blocks", "ragged_dot", "ragged_dot"]
    assert moe_lib.grouped_matmul(dataclasses.replace(MODEL, grouped_matmul="ragged_dot"), "cpu") == "ragged_dot"
    assert moe_lib.grouped_matmul(megablox, "tpu") == "megablox"
    assert plan_lib.make_model(TrainConfig(model=megablox), "tpu").moe_grouped_matmul == "megablox"
    for platform in ("cpu", "gpu"):
        with pytest.raises(ConfigError, match=f"grouped_matmul='megablox' is a TPU kernel .* cannot run on {platform}; "
                                              "use grouped_matmul='auto'") as e:
            plan_lib.make_model(TrainConfig(model=megablox), platform)
        assert "\n" not in str(e.value)
    cases = [(dict(grouped_matmul="gmm"), "unknown model.grouped_matmul 'gmm'; choose one of auto, ragged_dot, "
                                          "megablox"),
             (dict(grouped_matmul="megablox", expert_compute="capacity"), "use grouped_matmul='auto' or "
                                                                          "expert_compute='dropless'"),
             (dict(grouped_matmul="megablox", d_model=256, expert_d_ff=704),
              "needs d_model and the experts' width in multiples of 128 (the kernel's tiles), got 256 and 704")]
    for fields, message in cases:
        with pytest.raises(ConfigError, match=re.escape(message)) as e:
            moe_lib.check(dataclasses.replace(MODEL, **fields))
        assert "\n" not in str(e.value)


@pytest.mark.slow
@needs_libtpu
def test_megablox_plans_for_a_tpu_topology():
    """moe-tiny (2 layers: one MoE) with grouped_matmul megablox, planned for v5e-4 (libtpu, no TPU; the
    HLO passes), fsdp 2 x expert 2: the step compiles with the Pallas kernels (3 matmuls x forward, lhs
    gradient, weight gradient) where "auto" has ragged dots, at about the same memory."""
    from paxsearch.search.planning import hlo_passes
    from paxsearch.search.planning import topology as topo
    from paxsearch.trainer import presets
    from paxsearch.trainer.config import MeshConfig, TrainConfig, mesh_shape

    plans = {}
    for choice in ("megablox", "auto"):
        model = dataclasses.replace(presets.get("moe-tiny"), grouped_matmul=choice, n_layers=2)
        cfg = TrainConfig(model=model, mesh=MeshConfig(ici=mesh_shape(fsdp=2, expert=2)), per_device_batch=2)
        plans[choice] = hlo_passes.build_plan_program(cfg, topo.topology_devices("v5e-4"), "v5e-4").plan
    kernels = lambda plan: len(re.findall(r'op_name="[^"]*jit\(t?gmm\)\)*/pallas_call', plan.hlo_text))
    assert kernels(plans["megablox"]) == 9 and kernels(plans["auto"]) == 0
    assert "ragged_dot_general" in plans["auto"].hlo_text and "ragged_dot_general" not in plans["megablox"].hlo_text
    assert plans["megablox"].peak_bytes == pytest.approx(plans["auto"].peak_bytes, rel=0.1)


@pytest.mark.parametrize("extra, expected", [
    ("megablox: true\n", "megablox"),
    ("", "auto"),  # base.yml's megablox true: a kernel, no part of the model
    ("megablox: false\n", "auto"),
    ("megablox: true\nsparse_matmul: false\ncapacity_factor: 1.5\n", "auto"),  # MaxText's dense matmul: capacity
])
def test_maxtext_megablox_key_both_ways(extra, expected):
    """A MaxText yml's megablox set true (dropless) reads as grouped_matmul megablox, and the MaxText export
    of such a model writes sparse_matmul and megablox true; a dropless "auto" (jax.lax.ragged_dot on TPU)
    sparse_matmul true and megablox false; the capacity experts sparse_matmul false (MaxText's dense matmul)."""
    from paxsearch.search.export import maxtext
    from paxsearch.trainer.config import MeshConfig, TrainConfig, mesh_shape

    from .test_maxtext_yml import MIXTRAL_8X7B, _read

    model = _read(MIXTRAL_8X7B + extra)
    assert model.grouped_matmul == expected
    keys = dict(maxtext.overrides(TrainConfig(model=model, mesh=MeshConfig(ici=mesh_shape(fsdp=8)),
                                              per_device_batch=1), "tpu", 8)[0])
    exported = {k: keys[k] for k in ("sparse_matmul", "megablox") if k in keys}
    if model.expert_compute == "capacity":
        assert exported == {"sparse_matmul": "false"}
    else:
        assert exported == {"sparse_matmul": "true", "megablox": "true" if expected == "megablox" else "false"}

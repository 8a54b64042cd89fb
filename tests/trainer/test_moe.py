"""Mixtures of experts (issue 43): the MoE layer (trainer/moe.py), expert parallelism over the
mesh axis `expert`, the MFU convention for MoE, and the static checks.

The loss-equality test compiles one step's value and gradient per mesh (a 1-layer model, 8
simulated CPU devices); the parameters and the batch are made once for the module."""
import dataclasses
import math

import jax
import numpy as np
import pytest

from paxsearch.trainer import flops as flops_lib
from paxsearch.trainer import moe as moe_lib
from paxsearch.trainer import plan as plan_lib
from paxsearch.trainer import presets, validate
from paxsearch.trainer import step as step_lib
from paxsearch.trainer.config import MeshConfig, ModelConfig, PipelineConfig, TrainConfig, mesh_shape
from paxsearch.trainer.errors import ConfigError

N_EXPERTS, TOP_K = 8, 2
MODEL = ModelConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=2, head_dim=16, d_ff=64, seq_len=16, mlp="gated",
                    activation="silu", position="rope", attention="dot_product", scan_layers=False,
                    n_experts=N_EXPERTS, experts_per_token=TOP_K, expert_d_ff=32)
GLOBAL_BATCH = 16
NO_DROP = N_EXPERTS / TOP_K  # capacity = every token of a device for every expert: nothing can drop


FSDP8 = mesh_shape(fsdp=8)


def config(model: ModelConfig = MODEL, ici=FSDP8, **kw) -> TrainConfig:
    return TrainConfig(model=model, mesh=MeshConfig(ici=ici), per_device_batch=None, global_batch=GLOBAL_BATCH,
                       steps=1, **kw)


@pytest.fixture(scope="module")
def inputs():
    """(parameters, batch): the parameters initialized once, without a mesh (the values do not
    depend on one); random tokens with uneven weights."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, MODEL.vocab_size, (GLOBAL_BATCH, MODEL.seq_len + 1)).astype(np.int32)
    weights = (np.arange(MODEL.seq_len)[None] < rng.integers(4, MODEL.seq_len + 1, (GLOBAL_BATCH, 1)))
    batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "weights": weights.astype(np.float32),
             "segment_ids": np.ones((GLOBAL_BATCH, MODEL.seq_len), np.int32),
             "positions": np.tile(np.arange(MODEL.seq_len, dtype=np.int32), (GLOBAL_BATCH, 1))}
    model = step_lib.make_model(config())
    sample = batch["inputs"][:1]
    params = jax.jit(lambda: step_lib.unbox(model.init(jax.random.key(0), sample, sample, sample)["params"]))()
    return params, batch


@pytest.fixture(scope="module")
def step_results(inputs):
    """{(expert_compute, expert axis size): (loss, MoE stats, gradients)}, computed on first use."""
    params, batch = inputs
    cache = {}

    def get(compute: str, expert: int, capacity_factor: float = NO_DROP, tensor: int = 1):
        key = (compute, expert, capacity_factor, tensor)
        if key not in cache:
            model_cfg = dataclasses.replace(MODEL, expert_compute=compute, capacity_factor=capacity_factor)
            cfg = config(model_cfg, mesh_shape(fsdp=8 // expert // tensor, expert=expert, tensor=tensor))
            _, platform, _, mesh, rules = plan_lib.setup(cfg)[:5]
            assert dict(mesh.shape)["expert"] == expert
            model = plan_lib.make_model(cfg, platform)
            with plan_lib.mesh_context(mesh, rules):
                fn = jax.jit(jax.value_and_grad(step_lib.make_moe_objective(model), has_aux=True))
                (_, (loss, stats)), grads = fn(params, batch)
            cache[key] = (float(loss), {k: float(v) for k, v in stats.items()}, jax.device_get(grads))
        return cache[key]

    return get


def _relative_gap(a, b) -> float:
    """max |a - b| / max |b| over each leaf, the worst leaf."""
    return max(float(np.max(np.abs(x - y)) / max(np.max(np.abs(y)), 1e-30))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


@pytest.mark.parametrize("compute,expert,tensor", [("dropless", 2, 1), ("dropless", 4, 1), ("dropless", 8, 1),
                                                   ("capacity", 1, 1), ("capacity", 2, 1), ("capacity", 8, 1),
                                                   ("dropless", 2, 2)])
def test_expert_parallelism_gives_the_same_loss_and_gradients(step_results, compute, expert, tensor):
    """Against dropless without expert parallelism: the same loss, load-balancing loss and gradients
    (float32, rel 1e-5), dropless (all-gather + reduce-scatter) and capacity (all-to-all) with a
    capacity factor that drops nothing; with a tensor axis too (the experts' hidden dim split, a psum)."""
    ref_loss, ref_stats, ref_grads = step_results("dropless", 1)
    loss, stats, grads = step_results(compute, expert, tensor=tensor)
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    assert stats["load_balance_loss"] == pytest.approx(ref_stats["load_balance_loss"], rel=1e-5)
    assert stats["dropped_fraction"] == 0.0
    assert _relative_gap(grads, ref_grads) < 1e-5
    # the gradients reach every expert's weights (the routes of 16 x 16 tokens use all 8)
    moe = grads["layer_0"]["moe"]
    assert all(float(np.abs(moe["wi"][e]).max()) > 0 for e in range(N_EXPERTS))
    assert float(np.abs(moe["router"]).max()) > 0


def test_capacity_drops_what_a_hand_count_drops(step_results, inputs):
    """capacity_factor 0.5 under expert parallelism 4: the dropped share is the routes past each
    expert's capacity, counted here from the same routes with numpy (per device, first choices
    first); the loss moves, the load-balancing loss (computed before dropping) does not."""
    params, batch = inputs
    loss, stats, _ = step_results("capacity", 4, 0.5)
    ref_loss, ref_stats, _ = step_results("dropless", 1)
    # the routes, from the router on the layer's input (the normed stream after attention)
    model = step_lib.make_model(config())
    _, sown = model.apply({"params": params}, batch["inputs"], batch["positions"], batch["segment_ids"],
                          mutable=["intermediates"], capture_intermediates=lambda m, _: m.name == "mlp_norm")
    h = np.asarray(sown["intermediates"]["layer_0"]["mlp_norm"]["__call__"][0]).reshape(-1, MODEL.d_model)
    logits = h @ np.asarray(params["layer_0"]["moe"]["router"])
    top = np.argsort(-logits, axis=1, kind="stable")[:, :TOP_K]
    devices, per_device = 8, GLOBAL_BATCH * MODEL.seq_len // 8  # batch rows over fsdp 2 x expert 4
    cap = math.ceil(TOP_K * per_device * 0.5 / N_EXPERTS)
    dropped = 0
    for d in range(devices):
        routes = top[d * per_device:(d + 1) * per_device].T.reshape(-1)  # first choices first
        counts = np.bincount(routes, minlength=N_EXPERTS)
        dropped += int(np.maximum(counts - cap, 0).sum())
    assert dropped > 0
    assert stats["dropped_fraction"] == pytest.approx(dropped / (GLOBAL_BATCH * MODEL.seq_len * TOP_K), abs=1e-7)
    assert loss != ref_loss
    assert stats["load_balance_loss"] == pytest.approx(ref_stats["load_balance_loss"], rel=1e-5)


def test_moe_layer_alone_routes_top_k_and_sums_the_weighted_experts():
    """Without a mesh, one MoE layer against a per-token numpy loop over its top-k experts."""
    m = dataclasses.replace(MODEL, mlp="dense", activation="relu")
    layer = moe_lib.MoE(m)
    x = jax.random.normal(jax.random.key(1), (2, 4, m.d_model))
    params = step_lib.unbox(layer.init(jax.random.key(2), x)["params"])
    (y, stats) = layer.apply({"params": params}, x)
    p = jax.tree.map(np.asarray, params)
    xs = np.asarray(x).reshape(-1, m.d_model)
    logits = xs @ p["router"]
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    want = np.zeros_like(xs)
    for t, row in enumerate(xs):
        top = np.argsort(-probs[t])[:TOP_K]
        w = probs[t, top] / probs[t, top].sum()
        for e, we in zip(top, w, strict=True):
            want[t] += we * (np.maximum(row @ p["wi"][e], 0) @ p["wo"][e])
    np.testing.assert_allclose(np.asarray(y).reshape(-1, m.d_model), want, rtol=1e-5, atol=1e-6)
    load = np.bincount(np.argsort(-probs, 1)[:, :TOP_K].ravel(), minlength=N_EXPERTS) / (len(xs) * TOP_K)
    assert float(stats["load_balance_loss"]) == pytest.approx(N_EXPERTS * np.sum(load * probs.mean(0)), rel=1e-5)


def test_sigmoid_router_bias_picks_experts_and_learns_from_the_load():
    """DeepSeek V3's router: the bias changes which experts are chosen, not their weights; its
    gradient is the load error (share routed - 1 / n_experts); the term adds 0 to the objective."""
    m = dataclasses.replace(MODEL, router="sigmoid", load_balance_weight=0.0)
    layer = moe_lib.MoE(m)
    x = jax.random.normal(jax.random.key(1), (2, 8, m.d_model))
    params = step_lib.unbox(layer.init(jax.random.key(2), x)["params"])
    assert params["router_bias"].shape == (N_EXPERTS,)

    def objective(p):
        y, stats = layer.apply({"params": p}, x)
        return stats["routing_bias_objective"], (y, stats)

    (value, (y, _)), grads = jax.value_and_grad(objective, has_aux=True)(params)
    assert float(value) == 0.0
    routes = np.asarray(jax.lax.top_k(jax.nn.sigmoid(x.reshape(-1, m.d_model) @ params["router"]), TOP_K)[1])
    load = np.bincount(routes.ravel(), minlength=N_EXPERTS) / routes.size
    np.testing.assert_allclose(np.asarray(grads["router_bias"]), load - 1 / N_EXPERTS, atol=1e-6)
    # a large bias on expert 0 routes every token to it
    biased = dict(params, router_bias=params["router_bias"].at[0].set(100.0))
    y_biased, stats = layer.apply({"params": biased}, x)
    assert not np.allclose(np.asarray(y_biased), np.asarray(y))


def test_mfu_convention_counts_the_router_and_the_activated_experts_only():
    """A hand count of model FLOPs for a MoE model: dense layers with d_ff, MoE layers with the
    router (2 d E) and k + shared experts; the total expert count does not enter."""
    m = dataclasses.replace(MODEL, n_layers=4, first_dense_layers=1, n_shared_experts=1, d_ff=96, expert_d_ff=40,
                            scan_layers=True)
    d, s = m.d_model, m.seq_len
    attention = 2 * 2 * d * 2 * 16 + 2 * 2 * d * 2 * 16 + 2 * s * 2 * 16  # q/out, k/v (2 kv heads = heads), QK^T AV
    dense_layer = attention + 3 * 2 * d * 96
    moe_layer = attention + 2 * d * N_EXPERTS + (TOP_K + 1) * 3 * 2 * d * 40
    want = 1 * dense_layer + 3 * moe_layer + 2 * d * m.vocab_size
    assert flops_lib.forward_flops_per_token(m) == want
    more_experts = dataclasses.replace(m, n_experts=64)
    assert flops_lib.forward_flops_per_token(more_experts) - want == 3 * 2 * d * (64 - N_EXPERTS)  # the router only
    assert flops_lib.model_flops_per_step(m, 4) == 3 * want * 4 * s
    # interleaved (moe_every 2: layers 1 and 3 of 4 are MoE)
    inter = dataclasses.replace(m, first_dense_layers=0, moe_every=2, scan_layers=False)
    assert [moe_lib.is_moe_layer(inter, i) for i in range(4)] == [False, True, False, True]
    assert flops_lib.forward_flops_per_token(inter) == 2 * dense_layer + 2 * moe_layer + 2 * d * m.vocab_size
    assert "activated experts" in flops_lib.MFU_CONVENTION


def test_dense_models_are_unchanged_by_the_moe_fields():
    """n_experts 0: the same FLOPs and parameters as before, no MoE fields in the stored config, and
    the mesh shape still written in 5 entries."""
    from paxsearch.trainer.config import MOE_FIELDS, to_dict

    dense = presets.get("llama3-8b")
    assert flops_lib.forward_flops_per_token(dense) == 32 * (2 * 2 * 4096 * 32 * 128 + 2 * 2 * 4096 * 8 * 128
                                                             + 3 * 2 * 4096 * 14336 + 2 * 8192 * 32 * 128) + \
        2 * 4096 * 128256
    stored = to_dict(TrainConfig(model=dense, mesh=MeshConfig(ici=mesh_shape(fsdp=8))))
    assert not set(MOE_FIELDS) & set(stored["model"]) and stored["mesh"]["ici"] == (1, 1, 8, 1, 1)
    assert set(MOE_FIELDS) <= set(to_dict(TrainConfig(model=presets.get("moe-tiny")))["model"])


@pytest.mark.parametrize("model,ici,kw,message", [
    (dict(experts_per_token=9), mesh_shape(fsdp=8), {}, "experts_per_token=9 must be between 1 and n_experts=8"),
    (dict(n_experts=6, d_model=48), mesh_shape(fsdp=2, expert=4), {}, "n_experts=6 does not divide over expert=4"),
    (dict(n_experts=0), mesh_shape(fsdp=4, expert=2), {}, "mesh axis expert=2 needs a mixture-of-experts model"),
    (dict(moe_every=2, scan_layers=True, n_layers=2), mesh_shape(fsdp=8), {}, "set model.scan_layers=False"),
    (dict(first_dense_layers=1), mesh_shape(fsdp=8), {}, "leaves no MoE layer"),
    (dict(router="topk"), mesh_shape(fsdp=8), {}, "unknown model.router 'topk'"),
    (dict(expert_compute="megablox"), mesh_shape(fsdp=8), {}, "unknown model.expert_compute 'megablox'"),
    (dict(expert_compute="capacity", capacity_factor=0.0), mesh_shape(fsdp=8), {}, "capacity_factor must be > 0"),
    (dict(expert_d_ff=30, n_heads=4, head_dim=8), mesh_shape(fsdp=2, tensor=4), {},
     "expert_d_ff=30 does not divide over tensor=4"),
    (dict(n_layers=2), mesh_shape(stage=2, fsdp=4), dict(pipeline=PipelineConfig(2)), "cannot be pipelined"),
    ({}, mesh_shape(fsdp=8), dict(grad_accum_steps=2), "grad_accum_steps=2 is not supported"),
    (dict(d_model=36, n_heads=2, head_dim=18), mesh_shape(fsdp=2, expert=4), {}, "x expert=4"),
])
def test_impossible_moe_configs_are_refused_in_one_line(model, ici, kw, message):
    cfg = config(dataclasses.replace(MODEL, **model), ici, **kw)
    with pytest.raises(ConfigError, match=message) as e:
        validate.check(cfg, 8, "cpu")
    assert "\n" not in str(e.value)


def test_expert_axis_accepted_and_a_batch_axis():
    """The expert axis in ICI or DCN; outside the MoE layers it splits the batch like data and fsdp."""
    from paxsearch.trainer import mesh as mesh_lib

    for ici, dcn in ((mesh_shape(fsdp=2, expert=4), mesh_shape()), (mesh_shape(fsdp=4), mesh_shape(expert=2))):
        cfg = dataclasses.replace(config(ici=ici), mesh=MeshConfig(ici=ici, dcn=dcn), global_batch=None,
                                  per_device_batch=2)
        validate.check(cfg, 8, "cpu")
        assert mesh_lib.global_batch_size(cfg, 8) == 16


def test_moe_presets_have_their_published_total_and_active_counts():
    """Total within 1% of the published figure (test_presets counts the built model); active
    (k of the routed experts, the router, attention, embeddings) within 2%: Qwen3's card rounds
    3.35B down to 3.3B."""
    for name in ("mixtral-8x7b", "mixtral-8x22b", "qwen3-30b-a3b", "moe-tiny"):
        p = presets.source(name)
        assert p.model.n_experts > 0 and p.published_active > 0
        total, active = flops_lib.param_count(p.model), flops_lib.param_count(p.model, active=True)
        assert abs(total / p.published_params - 1) <= 0.01, (name, total)
        assert abs(active / p.published_active - 1) <= 0.02, (name, active)
    assert flops_lib.param_count(presets.get("mixtral-8x7b")) == 46_702_792_704
    assert flops_lib.param_count(presets.get("mixtral-8x7b"), active=True) == 12_879_925_248


def test_deepseek_presets_have_their_published_total_and_active_counts():
    """DeepSeek V3 (671B) and V2-Lite (15.7B), multi-head latent attention: the total within 0.1%; the
    active count as DeepSeek states it (without the input embedding table, whose lookup is no matmul)
    is the published figure to the 0.1B it is given in (36.6B, 2.4B)."""
    for name, total in (("deepseek-v3", 671_026_419_200), ("deepseek-v2-lite", 15_706_484_224)):
        p = presets.source(name)
        m = p.model
        assert m.attention_type == "mla" and m.n_experts and m.n_shared_experts
        assert flops_lib.param_count(m) == total and abs(total / p.published_params - 1) < 0.001
        active = flops_lib.param_count(m, active=True) - m.vocab_size * m.d_model
        assert int(active // 100_000_000) == p.published_active // 100_000_000, (name, active)
        assert "YaRN" in p.note and "not modeled" in p.note
    v3 = presets.get("deepseek-v3")
    assert (v3.q_lora_rank, v3.kv_lora_rank, v3.head_dim, v3.v_head_dim, v3.router, v3.first_dense_layers) == (
        1536, 512, 192, 128, "sigmoid", 3)
    assert presets.get("deepseek-v2-lite").q_lora_rank == 0
    assert "MTP module" in presets.source("deepseek-v3").note and "n_group 8" in presets.source("deepseek-v3").note


@pytest.mark.slow  # a real training run (data pipeline, checkpoint-free): ~20 CPU-s
def test_moe_tiny_trains_and_reports_its_moe_metrics(tmp_path):
    """moe-tiny, expert parallelism 2, a few real steps: the loss falls, and the load-balancing
    loss and the dropped share are in the metrics."""
    from paxsearch.trainer.train import train

    model = dataclasses.replace(presets.get("moe-tiny"), dtype="float32", n_layers=2, expert_compute="capacity",
                                capacity_factor=1.0)
    cfg = TrainConfig(model=model, mesh=MeshConfig(ici=mesh_shape(fsdp=4, expert=2)), per_device_batch=2, steps=6,
                      run_dir=str(tmp_path))
    cfg = dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, enabled=False),
                              log=dataclasses.replace(cfg.log, every_steps=1, tensorboard=False))
    result = train(cfg)
    first, last = result.history[0], result.history[-1]
    assert last.loss < first.loss
    assert last.load_balance_loss is not None and 0.5 < last.load_balance_loss < 8.0
    assert last.dropped_fraction is not None and 0.0 <= last.dropped_fraction < 0.5
    assert "load_balance_loss" in last.to_dict()


def test_moe_plan_space_is_mixtral_over_expert_layouts_and_capacity():
    """spaces/moe_plan.py: Mixtral 8x7B on v6e-256 over expert x fsdp x tensor, dropless or capacity
    1.0 / 1.25 / 1.5, batch, remat and flag sets; every point passes the static checks."""
    import os

    from paxsearch.search.study import configio
    from paxsearch.search.study.space import load_space

    from ..search_util import REPO

    space = load_space(os.path.join(REPO, "spaces", "moe_plan.py"))
    assert [d.name for d in space.decisions] == ["mesh", "expert_compute", "capacity_factor", "per_device_batch",
                                                 "remat", "flags"]
    assert space.settings.target == "tpu:v6e-256" and space.size() == 504
    point = {"mesh": "4x16x4", "expert_compute": "capacity", "capacity_factor": 1.25, "per_device_batch": 12,
             "remat": "full", "flags": "default"}
    cfg = configio.build(space.config(point))
    assert cfg.model == dataclasses.replace(presets.get("mixtral-8x7b"), attention="flash",
                                            expert_compute="capacity", capacity_factor=1.25)
    assert cfg.mesh.ici == mesh_shape(expert=4, fsdp=16, tensor=4)
    validate.check(cfg, 256, "tpu")

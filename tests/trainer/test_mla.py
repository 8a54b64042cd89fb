"""Multi-head latent attention (trainer/mla.py, ModelConfig.attention_type = "mla"): the same loss and
gradients over attention implementations and meshes, training on 8 CPU devices, the parameter and
FLOP counts by hand, and the one-line refusals of bad fields.

One step's value and gradient is compiled per (implementation, mesh) of a 1-layer model (8
simulated CPU devices); the parameters and the batch are made once for the module."""
import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from paxsearch.trainer import attention as attention_lib
from paxsearch.trainer import flops as flops_lib
from paxsearch.trainer import plan as plan_lib
from paxsearch.trainer import sharding
from paxsearch.trainer import step as step_lib
from paxsearch.trainer.config import MLA_FIELDS, MeshConfig, ModelConfig, TrainConfig, mesh_shape, to_dict
from paxsearch.trainer.errors import ConfigError

from ..search_util import needs_libtpu

# 4 heads of 8 + 4 (query/key) and 6 (value); latents of rank 16 (query) and 8 (key/value)
MODEL = ModelConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=4, head_dim=12, d_ff=64, seq_len=16, mlp="gated",
                    activation="silu", position="rope", attention="dot_product", attention_block=8, scan_layers=False,
                    attention_type="mla", q_lora_rank=16, kv_lora_rank=8, qk_nope_head_dim=8, qk_rope_head_dim=4,
                    v_head_dim=6)
NO_Q_LATENT = dataclasses.replace(MODEL, q_lora_rank=0)  # as DeepSeek-V2-Lite
GLOBAL_BATCH = 16


FSDP8 = mesh_shape(fsdp=8)


def config(model: ModelConfig = MODEL, ici=FSDP8, **kw) -> TrainConfig:
    return TrainConfig(model=model, mesh=MeshConfig(ici=ici), per_device_batch=None, global_batch=GLOBAL_BATCH,
                       steps=1, **kw)


def _batch():
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, MODEL.vocab_size, (GLOBAL_BATCH, MODEL.seq_len + 1)).astype(np.int32)
    weights = np.arange(MODEL.seq_len)[None] < rng.integers(4, MODEL.seq_len + 1, (GLOBAL_BATCH, 1))
    # two packed segments in half of the rows: the segment mask matters
    segments = np.where(np.arange(MODEL.seq_len)[None] < 6, 1, 2) * (np.arange(GLOBAL_BATCH)[:, None] % 2) + \
        (1 - np.arange(GLOBAL_BATCH)[:, None] % 2)
    positions = np.where(segments == 2, np.arange(MODEL.seq_len) - 6, np.arange(MODEL.seq_len))
    return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "weights": weights.astype(np.float32),
            "segment_ids": segments.astype(np.int32), "positions": positions.astype(np.int32)}


@pytest.fixture(scope="module")
def step_results():
    """{(model, attention, tensor): (loss, gradients)}, computed on first use; the parameters of each
    model initialized once, without a mesh."""
    batch, params, cache = _batch(), {}, {}

    def get(model: ModelConfig, attention: str, tensor: int = 1):
        if model not in params:
            sample = batch["inputs"][:1]
            init = step_lib.make_model(config(model)).init
            params[model] = jax.jit(lambda: step_lib.unbox(init(jax.random.key(0), sample, sample, sample)["params"]))()
        key = (model, attention, tensor)
        if key not in cache:
            cfg = config(dataclasses.replace(model, attention=attention), mesh_shape(fsdp=8 // tensor, tensor=tensor))
            _, platform, _, mesh, rules = plan_lib.setup(cfg)[:5]
            net = plan_lib.make_model(cfg, platform)
            assert net.attention_impl == ("blockwise" if attention == "flash" else "dot_product")
            sums = step_lib.make_loss_sums(net)
            with plan_lib.mesh_context(mesh, rules):
                fn = jax.jit(jax.value_and_grad(lambda p, b: (lambda s, w: s / w)(*sums(p, b))))
                loss, grads = fn(params[model], batch)
            cache[key] = (float(loss), jax.device_get(grads))
        return cache[key]

    return get


def _relative_gap(a, b) -> float:
    """max |a - b| / max |b| over each leaf, the worst leaf."""
    return max(float(np.max(np.abs(x - y)) / max(np.max(np.abs(y)), 1e-30))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


@pytest.mark.parametrize("model", [MODEL, NO_Q_LATENT], ids=["q_latent", "no_q_latent"])
@pytest.mark.parametrize("attention,tensor", [("flash", 1), ("dot_product", 2), ("flash", 2)])
def test_same_loss_and_gradients_over_attention_and_tensor_parallelism(step_results, model, attention, tensor):
    """Against dot_product attention on fsdp 8: the CPU blockwise kernel (v zero-padded to the
    query/key head dim, the output sliced) and a mesh with tensor parallelism 2 (heads split) give
    the same loss and gradients (float32, rel 1e-5)."""
    ref_loss, ref_grads = step_results(model, "dot_product")
    loss, grads = step_results(model, attention, tensor)
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    assert _relative_gap(grads, ref_grads) < 1e-5
    mla = grads["layer_0"]["mla"]
    names = {"wq_a", "q_norm", "wq_b"} if model.q_lora_rank else {"query"}
    assert set(mla) == names | {"wkv_a", "kv_norm", "wkv_b", "out"}
    assert all(float(np.abs(leaf).max()) > 0 for leaf in jax.tree.leaves(mla))  # every weight learns


def test_latent_attention_is_the_published_math():
    """The layer against a plain re-derivation (the formula of the module doc): latents, RMSNorm,
    the decoupled RoPE key shared by the heads, softmax scale 1/sqrt(qk_nope + qk_rope), causal."""
    from paxsearch.trainer.mla import MLA
    from paxsearch.trainer.model import rope

    m = MODEL
    rng = np.random.default_rng(1)
    h = jnp.asarray(rng.normal(size=(2, m.seq_len, m.d_model)), jnp.float32)
    seg = jnp.ones((2, m.seq_len), jnp.int32)
    pos = jnp.tile(jnp.arange(m.seq_len), (2, 1))
    layer = MLA(m)
    p = layer.init(jax.random.key(3), h, seg, pos)["params"]
    out = layer.apply({"params": p}, h, seg, pos)
    w = jax.tree.map(lambda x: getattr(x, "value", x), p, is_leaf=lambda x: hasattr(x, "value"))

    def norm(x, scale):
        return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * scale

    nope, r = m.qk_nope_head_dim, m.qk_rope_head_dim
    q = jnp.einsum("bsl,lhd->bshd", norm(h @ w["wq_a"]["kernel"], w["q_norm"]["scale"]), w["wq_b"]["kernel"])
    q = jnp.concatenate([q[..., :nope], rope(q[..., nope:], pos, m.rope_theta)], -1)
    a = h @ w["wkv_a"]["kernel"]
    kv = jnp.einsum("bsl,lhd->bshd", norm(a[..., :m.kv_lora_rank], w["kv_norm"]["scale"]), w["wkv_b"]["kernel"])
    k_rope = rope(a[..., None, m.kv_lora_rank:], pos, m.rope_theta)
    k = jnp.concatenate([kv[..., :nope], jnp.repeat(k_rope, m.n_heads, 2)], -1)
    v = kv[..., nope:]
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(nope + r)
    causal = jnp.tril(jnp.ones((m.seq_len, m.seq_len), bool))
    probs = jax.nn.softmax(jnp.where(causal, scores, -jnp.inf), -1)
    want = jnp.einsum("bhqk,bkhd,hde->bqe", probs, v, w["out"]["kernel"])
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5)


def test_splash_takes_the_value_head_dim_as_it_is():
    """The Pallas splash kernel (run by the Pallas interpreter on CPU) with a value head dim below
    the query/key one, as MLA passes it (no padding), equals dot_product on v zero-padded and sliced;
    its gradients too."""
    rng = np.random.default_rng(2)
    b, s, h, dqk, dv = 1, 128, 2, 192, 128
    q, k = (jnp.asarray(rng.normal(size=(b, s, h, dqk)), jnp.float32) for _ in range(2))
    v = jnp.asarray(rng.normal(size=(b, s, h, dv)), jnp.float32)
    seg = jnp.array([[1] * 50 + [2] * 78], jnp.int32)
    pad = lambda v: jnp.pad(v, ((0, 0), (0, 0), (0, 0), (0, dqk - dv)))
    ref = lambda q, k, v: attention_lib.dot_product(q, k, pad(v), seg)[..., :dv]
    splash = lambda q, k, v: attention_lib.splash(q, k, v, seg, interpret=True)
    np.testing.assert_allclose(jax.jit(splash)(q, k, v), ref(q, k, v), atol=2e-5, rtol=1e-5)
    wts = jnp.asarray(rng.normal(size=(b, s, h, dv)), jnp.float32)
    grads = [jax.jit(jax.grad(lambda *a, f=f: jnp.sum(f(*a) * wts), argnums=(0, 1, 2)))(q, k, v) for f in (splash, ref)]
    for got, want in zip(*grads, strict=True):
        np.testing.assert_allclose(got, want, atol=5e-5, rtol=1e-4)


def test_a_small_mla_model_trains_on_8_devices():
    """The trainer's compiled step (fsdp 4 x tensor 2, blockwise attention, two scanned layers), a
    few AdamW steps on one batch: the loss falls."""
    model = dataclasses.replace(MODEL, attention="flash", n_layers=2, scan_layers=True)
    cfg = dataclasses.replace(config(model, mesh_shape(fsdp=4, tensor=2)), steps=8,
                              optimizer=dataclasses.replace(TrainConfig().optimizer, peak_lr=1e-2, warmup_steps=1))
    program = plan_lib.build_program(cfg, count_flops=False)
    state = program.init_state(jax.random.key(0))
    batch = {k: jax.device_put(v, program.batch_sharding) for k, v in _batch().items()}
    losses = []
    for _ in range(6):
        state, metrics = program.compiled_step(state, batch)
        losses.append(float(metrics["loss"]))
    assert losses[-1] < losses[0] - 0.3, losses


@pytest.mark.parametrize("model", [MODEL, NO_Q_LATENT], ids=["q_latent", "no_q_latent"])
def test_param_count_equals_the_initialized_model(model):
    cfg = config(model)
    state = jax.eval_shape(lambda: step_lib.init_state(cfg, step_lib.make_model(cfg),
                                                       step_lib.make_optimizer(cfg.optimizer, 10), jax.random.key(0)))
    built = sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(state["params"]))
    assert built == flops_lib.param_count(model)


def test_flops_by_hand():
    """Model FLOPs of MLA by hand, per token: projections 2 x weights (q latent and up, kv latent with
    the rope key and up to nope + v, output from v), QK^T at the query/key head dim and AV at the
    value head dim over S keys, halved for causality; the rest as a dense model's."""
    m = MODEL
    d, h, s, v = m.d_model, m.n_heads, m.seq_len, m.vocab_size
    q = 2 * (32 * 16 + 16 * 4 * 12)  # d -> r_q -> H x (8 + 4)
    kv = 2 * (32 * (8 + 4) + 8 * 4 * (8 + 6))  # d -> r_kv + rope; r_kv -> H x (nope + v)
    out = 2 * 4 * 6 * 32
    attention = (2 * s * h * 12 + 2 * s * h * 6) // 2
    mlp = 3 * 2 * d * m.d_ff
    want = q + kv + out + attention + mlp + 2 * d * v
    assert flops_lib.forward_flops_per_token(m) == want
    assert flops_lib.model_flops_per_step(m, 4) == 3 * want * 4 * s
    assert flops_lib.attention_flops_per_step(m, 4) == 3 * attention * 4 * s
    no_q = flops_lib.forward_flops_per_token(NO_Q_LATENT)
    assert no_q == want - q + 2 * 32 * 4 * 12  # one query projection d -> H x 12
    # params: the weights above once each, plus the two latent norms
    weights = (q + kv + out) // 2 + 16 + 8 + 3 * d * m.d_ff + 2 * d + 2 * v * d + d
    assert flops_lib.param_count(m) == weights


def test_standard_attention_is_unchanged_and_stores_no_mla_fields():
    mha = dataclasses.replace(MODEL, attention_type="mha", head_dim=8)
    assert not set(MLA_FIELDS) & set(to_dict(config(mha))["model"])
    assert set(MLA_FIELDS) <= set(to_dict(config())["model"])
    assert flops_lib.forward_flops_per_token(mha) == (4 * 2 * 32 * 4 * 8 + 2 * 16 * 4 * 8 + 3 * 2 * 32 * 64
                                                      + 2 * 32 * 64)


def test_latent_ranks_that_do_not_divide_over_fsdp_are_whole():
    """sharding.rules_for: a latent rank divides over fsdp x context x expert or is replicated."""
    odd = dataclasses.replace(MODEL, q_lora_rank=12)
    rules = dict(sharding.rules_for("default", odd, {"fsdp": 8}))
    assert rules["q_lora"] is None and rules["kv_lora"] == ("fsdp", "context", "expert")
    assert dict(sharding.rules_for("default", MODEL, {"fsdp": 8}))["q_lora"] == ("fsdp", "context", "expert")


@pytest.mark.parametrize("fields,message", [
    (dict(attention_type="latent"), "unknown model.attention_type 'latent'"),
    (dict(head_dim=16), "head_dim is the query/key head dim and must be qk_nope_head_dim \\+ qk_rope_head_dim"),
    (dict(kv_lora_rank=0), "needs model.kv_lora_rank an integer >= 1"),
    (dict(q_lora_rank=-1), "needs model.q_lora_rank an integer >= 0"),
    (dict(qk_rope_head_dim=3, head_dim=11), "qk_rope_head_dim must be even"),
    (dict(v_head_dim=16), "v_head_dim=16 above the query/key head dim 12"),
    (dict(n_kv_heads=2), "n_kv_heads must be None"),
    (dict(position="learned"), "position must be 'rope'"),
])
def test_bad_mla_fields_are_refused_in_one_line(fields, message):
    with pytest.raises(ConfigError, match=message) as e:
        dataclasses.replace(MODEL, **fields)
    assert "\n" not in str(e.value)


def test_exports_refuse_latent_attention_in_one_line():
    """Neither export writes MLA (MaxText builds it only in its deepseek decoder block, with that block's MoE and
    YaRN; Paxml's TransformerLm has none): one line naming the field and the fix."""
    from paxsearch.search.export import maxtext, paxml
    from paxsearch.search.export.common import ExportRefused

    for export in (lambda c: maxtext.overrides(c, "tpu", 8), lambda c: paxml.snippet(c, "tpu", 8)):
        with pytest.raises(ExportRefused, match="attention_type='mla'.*attention_type='mha'") as e:
            export(config())
        assert "\n" not in str(e.value)


@pytest.mark.slow
@needs_libtpu
def test_a_small_mla_model_plans_for_a_tpu_topology_with_splash():
    """A 2-layer MLA model compiled for v5e-4 (libtpu, no TPU; the HLO passes), fsdp 2 x tensor 2 with the
    splash kernel: the step fits, its parameters are param_count's, and the splash kernels take v at its own
    head dim (128, no padding to the query/key head dim 192)."""
    import re

    from paxsearch.search.planning import hlo_passes
    from paxsearch.search.planning import topology as topo

    model = ModelConfig(vocab_size=4096, d_model=256, n_layers=2, n_heads=4, head_dim=192, d_ff=512, seq_len=256,
                        dtype="bfloat16", mlp="gated", activation="silu", position="rope", attention="flash",
                        attention_type="mla", q_lora_rank=64, kv_lora_rank=32, qk_nope_head_dim=128,
                        qk_rope_head_dim=64, v_head_dim=128)
    cfg = TrainConfig(model=model, mesh=MeshConfig(ici=mesh_shape(fsdp=2, tensor=2)), per_device_batch=2)
    plan = hlo_passes.build_plan_program(cfg, topo.topology_devices("v5e-4"), "v5e-4").plan
    assert 0 < plan.peak_bytes < 16 * 2**30 and plan.param_count == flops_lib.param_count(model)  # v5e: 16 GiB
    # the dK / dV kernel's results: dK at the query/key head dim, dV at the value head dim (padded v: 192 too)
    dkv = [line.split("custom-call(")[0] for line in plan.hlo_text.splitlines()
           if "splash_mha_dkv" in line and "custom-call(" in line]
    assert dkv and all(re.search(r"\[\d+,256,192\]", r) and re.search(r"\[\d+,256,128\]", r) for r in dkv), dkv[:1]

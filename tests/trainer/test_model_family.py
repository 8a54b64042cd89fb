"""The model family (issue 9 part 1): RoPE, GQA/MQA, gated MLPs, tied embeddings, attention
implementations (dot_product, CPU blockwise flash, TPU splash) and named sharding rules.

Runtime on 2 cores shared with other jobs (load average ~8): 57 tests in 11 minutes; the
3 x 3 x 2 loss test (18 step compiles) takes ~5 of them, the TPU plan test ~2: those two are
marked slow (CI runs them; `pytest -m "not slow"` does not).
"""
import dataclasses
import functools
import itertools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from paxsearch.trainer import attention as A
from paxsearch.trainer import flops as flops_lib
from paxsearch.trainer import mesh as mesh_lib
from paxsearch.trainer import model as model_lib
from paxsearch.trainer import plan as plan_lib
from paxsearch.trainer.config import MeshConfig, ModelConfig, TrainConfig
from paxsearch.trainer.errors import ConfigError

from ..search_util import needs_libtpu

TINY = ModelConfig(vocab_size=128, d_model=32, n_layers=2, n_heads=4, head_dim=8, d_ff=64, seq_len=64,
                   attention_block=16)
LLAMA_TINY = dataclasses.replace(TINY, position="rope", n_kv_heads=2, mlp="gated", activation="silu")


def _qkv(b=2, s=128, h=4, k=2, d=16, seed=0):
    ks = jax.random.split(jax.random.key(seed), 4)
    q = jax.random.normal(ks[0], (b, s, h, d))
    kk = jax.random.normal(ks[1], (b, s, k, d))
    v = jax.random.normal(ks[2], (b, s, k, d))
    w = jax.random.normal(ks[3], (b, s, h, d))  # a random cotangent
    return q, kk, v, w


def _packed_segments(b, s):
    """Row 0: three packed documents and padding (segment 0); row 1: one document."""
    row0 = [1] * (s // 3) + [2] * (s // 3 + 5) + [3] * 7
    row0 += [0] * (s - len(row0))
    return jnp.array([row0, [1] * s][:b], jnp.int32)


@functools.partial(jax.jit, static_argnames=("impl", "block"))
def _attend(q, k, v, seg, impl, block=32):
    return A.attend(q, k, v, seg, impl, block)


@functools.partial(jax.jit, static_argnames=("impl", "block"))
def _grads(impl, q, k, v, seg, w, block=32):
    return jax.grad(lambda q, k, v: jnp.sum(A.attend(q, k, v, seg, impl, block) * w), argnums=(0, 1, 2))(q, k, v)


# ----------------------------------------------------------------------------- attention numerics

@pytest.mark.parametrize("n_kv", [4, 2, 1])
def test_blockwise_matches_dot_product_forward_and_gradients(n_kv):
    q, k, v, w = _qkv(k=n_kv)
    seg = _packed_segments(2, 128)
    ref = _attend(q, k, v, seg, "dot_product")
    out = _attend(q, k, v, seg, "blockwise", 32)
    np.testing.assert_allclose(out, ref, atol=2e-5, rtol=1e-5)
    for g_ref, g in zip(_grads("dot_product", q, k, v, seg, w), _grads("blockwise", q, k, v, seg, w), strict=True):
        np.testing.assert_allclose(g, g_ref, atol=5e-5, rtol=1e-4)


def test_attention_respects_segments_and_causality():
    q, k, v, _ = _qkv(b=1, s=64, h=2, k=2, d=8)
    seg = jnp.array([[1] * 20 + [2] * 44], jnp.int32)
    for impl in ("dot_product", "blockwise"):
        base = _attend(q, k, v, seg, impl, 16)
        # changing the future, or another document, leaves a query's output unchanged
        k2 = k.at[:, 30:].set(0.0).at[:, :20].set(5.0)
        v2 = v.at[:, 30:].set(0.0).at[:, :20].set(5.0)
        out = _attend(q, k2, v2, seg, impl, 16)
        np.testing.assert_allclose(out[:, 20:30], base[:, 20:30], atol=1e-6)
        assert not np.allclose(out[:, 30:], base[:, 30:])


def test_dot_product_groups_kv_heads_like_repeating_them():
    q, k, v, _ = _qkv(h=4, k=2)
    seg = _packed_segments(2, 128)
    grouped = _attend(q, k, v, seg, "dot_product")
    repeated = _attend(q, jnp.repeat(k, 2, axis=2), jnp.repeat(v, 2, axis=2), seg, "dot_product")
    np.testing.assert_allclose(grouped, repeated, atol=1e-6)


def test_splash_kernel_in_interpret_mode_matches_dot_product():
    """The Pallas TPU kernel itself, run by the Pallas interpreter on CPU: multi-query, segments."""
    q, k, v, w = _qkv(b=1, s=128, h=2, k=1, d=128)
    seg = jnp.array([[1] * 50 + [2] * 78], jnp.int32)
    splash = jax.jit(functools.partial(A.splash, interpret=True))
    np.testing.assert_allclose(splash(q, k, v, seg), _attend(q, k, v, seg, "dot_product"), atol=2e-5, rtol=1e-5)
    g_ref = _grads("dot_product", q, k, v, seg, w)
    g = jax.jit(jax.grad(lambda q, k, v: jnp.sum(splash(q, k, v, seg) * w), argnums=(0, 1, 2)))(q, k, v)
    for a, b in zip(g, g_ref, strict=True):
        np.testing.assert_allclose(a, b, atol=5e-5, rtol=1e-4)


# ----------------------------------------------------------------------------- choosing an implementation

def test_implementation_per_platform_and_fallbacks():
    m = dataclasses.replace(TINY, seq_len=256, attention_block=128, dtype="bfloat16")
    auto, flash = (dataclasses.replace(m, attention=a) for a in ("auto", "flash"))
    assert [A.implementation(auto, p) for p in ("cpu", "tpu", "gpu")] == ["dot_product", "splash", "cudnn"]
    assert [A.implementation(flash, p) for p in ("cpu", "tpu", "gpu")] == ["blockwise", "splash", "cudnn"]
    odd = dataclasses.replace(m, seq_len=200)  # not a multiple of 128 (splash) nor of the block (CPU)
    assert A.implementation(dataclasses.replace(odd, attention="auto"), "tpu") == "dot_product"
    for platform in ("tpu", "cpu"):
        with pytest.raises(ConfigError) as e:
            A.implementation(dataclasses.replace(odd, attention="flash"), platform)
        assert "\n" not in str(e.value) and "200" in str(e.value)
    f32 = dataclasses.replace(auto, dtype="float32")  # cuDNN flash attention is bf16/fp16 only
    assert A.implementation(f32, "gpu") == "dot_product"


def test_flash_with_a_seq_len_off_the_block_is_one_config_error():
    cfg = TrainConfig(model=dataclasses.replace(TINY, attention="flash", attention_block=48),
                      mesh=MeshConfig(ici=(1, 1, 1)), per_device_batch=1)
    with pytest.raises(ConfigError, match="attention_block=48"):
        plan_lib.build_program(cfg, jax.devices()[:1])


@pytest.mark.parametrize("change, words", [
    (dict(n_kv_heads=3), "n_kv_heads=3"),
    (dict(n_kv_heads=0), "n_kv_heads=0"),
    (dict(position="rope", head_dim=7), "even head_dim"),
    (dict(position="alibi"), "position"),
    (dict(mlp="moe"), "mlp"),
    (dict(block="hybrid"), "block"),
    (dict(attention="ring"), "attention"),
])
def test_bad_family_fields_are_one_line_config_errors(change, words):
    cfg = TrainConfig(model=dataclasses.replace(TINY, **change), per_device_batch=1)
    with pytest.raises(ConfigError) as e:
        mesh_lib.check_config(cfg, 8)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_unknown_rules_and_sequence_parallel_divisibility_are_config_errors():
    with pytest.raises(ConfigError, match="unknown sharding rules 'rows'"):
        mesh_lib.check_config(TrainConfig(model=TINY, mesh=MeshConfig(rules="rows"), per_device_batch=1), 8)
    m = dataclasses.replace(TINY, d_model=36, n_heads=8, d_ff=64)  # 36 does not divide over tensor 8
    with pytest.raises(ConfigError, match="d_model=36"):
        mesh_lib.check_config(TrainConfig(model=m, mesh=MeshConfig(ici=(1, 1, 8), rules="sequence_parallel"),
                                          per_device_batch=1), 8)


# ----------------------------------------------------------------------------- the model

def _init(m, batch=2):
    lm = model_lib.TransformerLM(m, attention_impl="dot_product")
    tok = jnp.zeros((batch, m.seq_len), jnp.int32)
    return lm, jax.eval_shape(lambda: lm.init(jax.random.key(0), tok, tok, tok))["params"]


def _inputs(m, batch=2, seed=1):
    tokens = jax.random.randint(jax.random.key(seed), (batch, m.seq_len), 0, m.vocab_size)
    positions = jnp.broadcast_to(jnp.arange(m.seq_len), (batch, m.seq_len))
    return tokens, positions, jnp.ones_like(tokens)


@functools.partial(jax.jit, static_argnums=(0,))
def _apply(m, params, tokens, positions, segs):
    lm = model_lib.TransformerLM(m, attention_impl="dot_product")
    return lm.apply({"params": params}, tokens, positions, segs)


def _real_params(m):
    lm = model_lib.TransformerLM(m, attention_impl="dot_product")
    tok = jnp.zeros((1, m.seq_len), jnp.int32)
    boxed = jax.jit(lambda: lm.init(jax.random.key(0), tok, tok, tok))()["params"]
    return nn.meta.unbox(boxed)


def test_rope_gqa_gated_tied_shapes():
    m = dataclasses.replace(LLAMA_TINY, tie_embeddings=True)
    _, params = _init(m)
    layers = params["layers"]
    unbox = lambda x: x.value if hasattr(x, "value") else x
    assert unbox(layers["query"]["kernel"]).shape == (2, 32, 4, 8)  # (layers, d, H, Dh)
    assert unbox(layers["key"]["kernel"]).shape == (2, 32, 2, 8)  # (layers, d, Hkv, Dh)
    assert unbox(layers["value"]["kernel"]).shape == (2, 32, 2, 8)
    assert {"mlp_gate", "mlp_up", "mlp_out"} <= set(layers) and "mlp_in" not in layers
    assert "pos_embed" not in params and "unembed" not in params
    logits = _apply(m, _real_params(m), *_inputs(m))
    assert logits.shape == (2, m.seq_len, m.vocab_size) and bool(jnp.isfinite(logits).all())


def test_rope_rotates_by_relative_position():
    q, k, _, _ = _qkv(b=1, s=16, h=1, k=1, d=8)
    pos = jnp.arange(16)[None]
    dots = lambda shift: jnp.einsum("bqhd,bkhd->bqk", model_lib.rope(q, pos + shift, 1e4),
                                    model_lib.rope(k, pos + shift, 1e4))
    np.testing.assert_allclose(dots(0), dots(37), atol=1e-4)  # only relative positions matter
    np.testing.assert_allclose(model_lib.rope(q, jnp.zeros_like(pos), 1e4), q)  # position 0: identity
    assert not np.allclose(model_lib.rope(q, pos, 1e4), q)


def test_rope_uses_the_packed_positions():
    """A document packed after another (positions restart at 0) gives the same logits as alone."""
    m = dataclasses.replace(LLAMA_TINY, seq_len=32)
    params = _real_params(m)
    doc = jax.random.randint(jax.random.key(3), (12,), 0, m.vocab_size)
    other = jax.random.randint(jax.random.key(4), (20,), 0, m.vocab_size)
    alone = jnp.concatenate([doc, other])[None]
    packed = jnp.concatenate([other, doc])[None]
    pos_alone = jnp.concatenate([jnp.arange(12), jnp.arange(20)])[None]
    pos_packed = jnp.concatenate([jnp.arange(20), jnp.arange(12)])[None]
    seg_alone = jnp.array([[1] * 12 + [2] * 20])
    seg_packed = jnp.array([[1] * 20 + [2] * 12])
    a = _apply(m, params, alone, pos_alone, seg_alone)[0, :12]
    b = _apply(m, params, packed, pos_packed, seg_packed)[0, 20:]
    np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)
    # RoPE sees relative positions only: any shift of a document's positions leaves its logits
    # unchanged, a stretch does not
    c = _apply(m, params, packed, 2 * pos_packed, seg_packed)[0, 20:]
    assert not np.allclose(a, c, atol=1e-3)


def test_gqa_with_all_heads_equals_mha_and_grouping_equals_repeated_kv():
    mha = dataclasses.replace(LLAMA_TINY, n_kv_heads=None)
    params = _real_params(mha)
    inputs = _inputs(mha)
    out_mha = _apply(mha, params, *inputs)
    out_full = _apply(dataclasses.replace(mha, n_kv_heads=mha.n_heads), params, *inputs)
    np.testing.assert_array_equal(out_full, out_mha)
    # GQA with 2 K/V heads == MHA whose K/V heads are those 2, each repeated for its 2 query heads
    gqa = dataclasses.replace(mha, n_kv_heads=2)
    gqa_params = _real_params(gqa)
    as_mha = jax.tree.map(lambda x: x, gqa_params)
    for name in ("key", "value"):
        as_mha["layers"][name]["kernel"] = jnp.repeat(gqa_params["layers"][name]["kernel"], 2, axis=2)
    np.testing.assert_allclose(_apply(mha, as_mha, *inputs), _apply(gqa, gqa_params, *inputs), atol=1e-5)


@pytest.mark.slow  # two train-step compiles and steps
def test_mqa_trains_on_a_tensor_mesh_with_replicated_kv():
    """n_kv_heads=1 with tensor=2: the K/V heads are replicated over tensor (sharding.rules_for)."""
    m = dataclasses.replace(LLAMA_TINY, n_kv_heads=1)
    cfg = TrainConfig(model=m, mesh=MeshConfig(ici=(1, 4, 2)), per_device_batch=None, global_batch=8, remat="none")
    program = plan_lib.build_program(cfg, count_flops=False)
    assert dict(program.rules)["kv_heads"] is None and dict(program.rules)["heads"] == "tensor"
    key_sharding = program.state_shardings["params"]["layers"]["key"]["kernel"]
    assert "tensor" not in str(key_sharding.spec)
    loss = _first_step(program)[0]
    ref = _first_step(plan_lib.build_program(dataclasses.replace(cfg, mesh=MeshConfig(ici=(1, 8, 1))),
                                             count_flops=False))[0]
    assert math.isfinite(loss) and loss == pytest.approx(ref, rel=1e-5)


def test_tied_embeddings_unembed_with_the_embedding_table():
    m = dataclasses.replace(TINY, tie_embeddings=True, n_layers=1)
    params = _real_params(m)
    lm = model_lib.TransformerLM(m, attention_impl="dot_product")
    tokens, positions, segs = _inputs(m)
    logits, state = jax.jit(lambda p: lm.apply(
        {"params": p}, tokens, positions, segs,
        capture_intermediates=lambda mdl, name: isinstance(mdl, model_lib.RMSNorm)))(params)
    final = state["intermediates"]["final_norm"]["__call__"][0]
    np.testing.assert_allclose(logits, final @ params["embed"]["embedding"].T, atol=1e-5)


@pytest.mark.parametrize("mlp", ["dense", "gated"])
def test_a_parallel_block_adds_attention_and_mlp_of_one_norm_to_its_input(mlp):
    """block="parallel" (MaxText's default decoder layer, GPT-J, PaLM): x + attn(norm(x)) + mlp(norm(x))."""
    m = dataclasses.replace(TINY, block="parallel", mlp=mlp, n_layers=1, scan_layers=False)
    params = _real_params(m)
    layer_params = params["layer_0"]
    assert "norm" in layer_params and not {"attn_norm", "mlp_norm"} & set(layer_params)
    lm = model_lib.TransformerLM(m, attention_impl="dot_product")
    tokens, positions, segs = _inputs(m)
    _, state = jax.jit(lambda p: lm.apply({"params": p}, tokens, positions, segs, capture_intermediates=True))(params)
    layer = state["intermediates"]["layer_0"]
    h = layer["norm"]["__call__"][0]
    first_mlp = "mlp_gate" if mlp == "gated" else "mlp_in"  # the MLP reads the attention's norm output
    np.testing.assert_allclose(layer[first_mlp]["__call__"][0], h @ layer_params[first_mlp]["kernel"], atol=1e-5)
    x_in = params["embed"]["embedding"][tokens] + params["pos_embed"]["embedding"][positions]  # learned positions
    expected = x_in + layer["out"]["__call__"][0] + layer["mlp_out"]["__call__"][0]
    np.testing.assert_allclose(layer["__call__"][0][0], expected, atol=1e-5)
    # the same weights in a sequential block give another function (its MLP reads x + attn)
    seq = dataclasses.replace(m, block="sequential")
    seq_params = {**params, "layer_0": {**{k: v for k, v in layer_params.items() if k != "norm"},
                                        "attn_norm": layer_params["norm"], "mlp_norm": layer_params["norm"]}}
    assert not np.allclose(_apply(seq, seq_params, tokens, positions, segs), _apply(m, params, tokens, positions, segs),
                           atol=1e-3)


# ----------------------------------------------------------------------------- FLOPs and parameters

def _hand_forward_flops(vocab, d, layers, heads, kv_heads, dh, ff, s, gated):
    """Per token, written out: q and out projections d*H*Dh each, k and v d*Hkv*Dh each,
    MLP 2 or 3 matrices of d*ff, QK^T and AV S*H*Dh each halved for causality; 2 FLOPs per
    multiply-add; the unembedding d*V (the same count whether tied or not)."""
    mults = layers * (d * heads * dh + d * heads * dh + 2 * d * kv_heads * dh + (3 if gated else 2) * d * ff
                      + (s * heads * dh + s * heads * dh) / 2) + d * vocab
    return 2 * mults


@pytest.mark.parametrize("change", [
    {}, dict(mlp="gated"), dict(n_kv_heads=2), dict(n_kv_heads=1), dict(tie_embeddings=True),
    dict(position="rope"), dict(position="rope", n_kv_heads=2, mlp="gated", tie_embeddings=True),
])
def test_flops_equal_the_hand_computation(change):
    m = dataclasses.replace(ModelConfig(vocab_size=1000, d_model=96, n_layers=3, n_heads=6, head_dim=16, d_ff=320,
                                        seq_len=256), **change)
    kv = change.get("n_kv_heads", 6)
    fwd = _hand_forward_flops(1000, 96, 3, 6, kv, 16, 320, 256, change.get("mlp") == "gated")
    assert flops_lib.forward_flops_per_token(m) == fwd
    assert flops_lib.model_flops_per_step(m, global_batch=8) == 3 * fwd * 8 * 256


def test_flops_numbers_for_a_llama_like_config():
    # d=4096, 32 layers, 32 heads x 128, 8 KV heads, SwiGLU d_ff 14336, vocab 128256, S 8192:
    # q+out 2*4096*4096, k+v 2*4096*1024, MLP 3*4096*14336, attention 8192*4096 (halved QK+AV)
    m = ModelConfig(vocab_size=128256, d_model=4096, n_layers=32, n_heads=32, head_dim=128, n_kv_heads=8,
                    d_ff=14336, seq_len=8192, mlp="gated", position="rope")
    per_layer_mults = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 8192 * 4096
    assert flops_lib.forward_flops_per_token(m) == 2 * (32 * per_layer_mults + 4096 * 128256)


@pytest.mark.parametrize("mlp, position, n_kv, tied, block", itertools.product(
    ("dense", "gated"), ("learned", "rope"), (None, 2, 1), (False, True), ("sequential", "parallel")))
def test_param_count_equals_the_initialized_model(mlp, position, n_kv, tied, block):
    m = dataclasses.replace(TINY, mlp=mlp, position=position, n_kv_heads=n_kv, tie_embeddings=tied, block=block)
    _, params = _init(m)
    real = sum(math.prod(x.shape) for x in jax.tree.leaves(params))
    assert flops_lib.param_count(m) == real


# ----------------------------------------------------------------------------- one loss everywhere

def _batch(program, seed=0):
    m = program.cfg.model
    gb, s = program.plan.global_batch, m.seq_len
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, m.vocab_size, (gb, s + 1)).astype(np.int32)
    cut = s // 3 + 1  # two packed documents per row
    seg = np.where(np.arange(s) < cut, 1, 2).astype(np.int32)[None].repeat(gb, 0)
    pos = np.where(np.arange(s) < cut, np.arange(s), np.arange(s) - cut).astype(np.int32)[None].repeat(gb, 0)
    host = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "segment_ids": seg, "positions": pos,
            "weights": np.ones((gb, s), np.float32)}
    return {k: jax.device_put(v, program.batch_sharding) for k, v in host.items()}


def _first_step(program, state=None):
    state = state if state is not None else program.init_state(jax.random.key(0))
    _, metrics = program.compiled_step(state, _batch(program))
    return float(metrics["loss"]), float(metrics["grad_norm"])


@pytest.mark.slow  # 9 compiles of the train step
def test_loss_is_the_same_across_meshes_remat_and_attention():
    """3 meshes x 3 remat policies x 2 attention implementations, every pair of them covered
    (mesh i, remat j, attention (i + j) mod 2: each mesh meets each remat policy and each
    attention, each remat policy each attention): one first-step loss and gradient norm (same
    init, same batch) to 1e-5."""
    results = {}
    meshes, remats = ((8, 1, 1), (1, 8, 1), (2, 2, 2)), ("none", "full", "minimal")
    attentions = ("dot_product", "flash")
    for i, ici in enumerate(meshes):
        state = None
        for j, remat in enumerate(remats):
            attention = attentions[(i + j) % 2]
            cfg = TrainConfig(model=dataclasses.replace(LLAMA_TINY, attention=attention), mesh=MeshConfig(ici=ici),
                              per_device_batch=None, global_batch=8, remat=remat)
            program = plan_lib.build_program(cfg, count_flops=False)
            assert program.model.attention_impl == {"dot_product": "dot_product", "flash": "blockwise"}[attention]
            if state is None:  # the state's layout does not depend on remat or attention
                state = program.init_state(jax.random.key(0))
            results[ici, remat, attention] = _first_step(program, jax.tree.map(jnp.copy, state))
    assert {(i, r) for i, r, _ in results} == set(itertools.product(meshes, remats))
    assert {(i, a) for i, _, a in results} == set(itertools.product(meshes, attentions))
    assert {(r, a) for _, r, a in results} == set(itertools.product(remats, attentions))
    (loss0, gnorm0), = {results[(8, 1, 1), "none", "dot_product"]}
    for key, (loss, gnorm) in results.items():
        assert loss == pytest.approx(loss0, rel=1e-5), key
        assert gnorm == pytest.approx(gnorm0, rel=1e-4), key
    assert 3.5 < loss0 < 6.0  # ~log(128) at init


@pytest.mark.slow  # quick-loop budget (issue 18): a full compile or a whole CLI run; CI runs it
def test_sequence_parallel_rules_shard_the_residual_stream_and_keep_the_loss():
    m = dataclasses.replace(LLAMA_TINY, d_model=64, n_heads=4, head_dim=16, d_ff=128, n_layers=4)
    programs = {}
    for rules in ("default", "sequence_parallel"):
        cfg = TrainConfig(model=m, mesh=MeshConfig(ici=(1, 2, 4), rules=rules), per_device_batch=2, remat="full")
        programs[rules] = plan_lib.build_program(cfg, count_flops=False, keep_hlo=True)
    default, sp = programs["default"], programs["sequence_parallel"]
    assert dict(sp.rules)["act_embed"] == "tensor" and dict(default.rules)["act_embed"] is None
    assert sp.plan.hlo_text != default.plan.hlo_text
    # full remat keeps each layer's input (B, S, d) for the backward pass: split 4 ways over tensor
    assert sp.plan.memory.temp_bytes < default.plan.memory.temp_bytes
    assert _first_step(sp)[0] == pytest.approx(_first_step(default)[0], rel=1e-5)


@pytest.mark.slow  # quick-loop budget (issue 18): a full compile or a whole CLI run; CI runs it
def test_blockwise_attention_never_holds_the_scores_at_seq_1024():
    """Compiled temp memory of one training step, 1 device, seq 1024: dot_product holds
    B x H x S x S float32 scores (16 MiB per layer here), the blockwise kernel block x block."""
    m = ModelConfig(vocab_size=128, d_model=32, n_layers=2, n_heads=4, head_dim=8, d_ff=64, seq_len=1024,
                    attention_block=128)
    temp = {}
    for attention in ("dot_product", "flash"):
        cfg = TrainConfig(model=dataclasses.replace(m, attention=attention), mesh=MeshConfig(ici=(1, 1, 1)),
                          per_device_batch=1, remat="none")
        temp[attention] = plan_lib.build_program(cfg, jax.devices()[:1], count_flops=False).plan.memory.temp_bytes
    scores = 1 * 4 * 1024 * 1024 * 4  # one layer's
    assert temp["dot_product"] > 2 * scores  # every layer's S x S scores are kept for the backward pass...
    assert temp["flash"] < scores  # ...and no layer's here (measured: 129 MB against 9 MB)
    assert temp["flash"] < temp["dot_product"] / 8


# ----------------------------------------------------------------------------- TPU plan mode

@pytest.mark.slow  # two TPU plans at seq 1024
@needs_libtpu
def test_splash_attention_plans_for_a_tpu_topology_and_needs_less_memory():
    """The kernel's full compile (code generation included) is test_context's splash plan."""
    from paxsearch.search.planning import hlo_passes
    from paxsearch.search.planning import topology as topo

    devices = topo.topology_devices("v5e-4")
    m = ModelConfig(vocab_size=1024, d_model=512, n_layers=2, n_heads=16, head_dim=128, n_kv_heads=4, d_ff=1024,
                    seq_len=1024, dtype="bfloat16", param_dtype="float32", mlp="gated", activation="silu",
                    position="rope")
    plans = {}
    for attention in ("flash", "dot_product"):
        cfg = TrainConfig(model=dataclasses.replace(m, attention=attention), mesh=MeshConfig(ici=(1, 4, 1)),
                          per_device_batch=1, remat="none")
        # from the HLO passes, as a plan-only study plans (its module and memory are the full compile's)
        plans[attention] = hlo_passes.build_plan_program(cfg, devices, "v5e-4")
    flash, dot = plans["flash"], plans["dot_product"]
    assert flash.model.attention_impl == "splash" and flash.plan.device_kind == "TPU v5 lite"
    assert "tpu_custom_call" in flash.plan.hlo_text and "tpu_custom_call" not in dot.plan.hlo_text
    # without remat dot_product keeps each layer's 16 x 1024 x 1024 scores for the backward pass
    # (271 MB per chip measured against 67 MB of scores), splash its output and log-sum-exp (15 MB)
    scores = 2 * 16 * 1024 * 1024 * 2
    assert dot.plan.memory.temp_bytes > scores > 2 * flash.plan.memory.temp_bytes
    # the roofline counts the splash kernels' matmuls, which XLA cannot see into: without
    # them flash would look ~30% cheaper than dot_product here (and its predicted MFU too high);
    # with them it executes 0.75 x 9/6 of dot_product's attention FLOPs (causal blocks only: 3 of
    # the 2 x 2 blocks of 512; QK^T recomputed twice in the backward pass)
    from paxsearch.search.planning import roofline as R
    hw = R.Hardware("v5e", peak_flops=197e12, hbm_bandwidth=8.2e11, ici_link_bandwidth=4.5e10, dcn_bandwidth=1e10,
                    physical_dims=2)
    roof = {k: R.analyze(p.plan.hlo_text, hw, mesh=p.mesh) for k, p in plans.items()}
    module = R.parse_module(flash.plan.hlo_text)
    times = R.call_graph(module).multiplier  # the layers' scan body runs n_layers times
    splash_only = sum(R.splash_flops(c, i) * times.get(c.name, 0) for c in module.computations.values()
                      for i in c.instrs if i.opcode == "custom-call")
    s, d, h = 1024, 128, 16
    assert splash_only == pytest.approx(2 * (2 + 4 + 3) * 2 * s * s * d * h * (2 + 1) / (2 * 2), rel=1e-6)
    assert roof["flash"].flops_per_step == pytest.approx(roof["dot_product"].flops_per_step, rel=0.15)
    assert roof["flash"].flops_per_step >= flash.plan.model_flops_per_step / 4
    # "auto" is splash on TPU
    auto = dataclasses.replace(cfg, model=dataclasses.replace(m, attention="auto"))
    assert plan_lib.make_model(auto, devices[0].platform).attention_impl == "splash"

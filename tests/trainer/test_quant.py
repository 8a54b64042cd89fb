"""int8 training (ModelConfig.quantization, trainer/quant.py) on the simulated CPU devices:
the quantized matmul's error, gradients against the float ones, the loss of a short int8
training run against the float run's, the s8 x s8 -> s32 dots in the compiled step, and the
one-line refusals of bad values.

Measured when written (2 cores under load): the matmul's relative error 0.9% on Gaussian data;
whole-gradient cosine 0.99971 and relative error 2.4% for int8 (1.8% for int8_fwd; computing in
bf16 instead of float32 gives 1.0%); the loss after 20 steps of the tiny model 2.6025 (int8)
against 2.6027 (float32). ~40 CPU-s in all, most of it the four compiles.
"""
import collections
import dataclasses
import re

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from paxsearch.trainer import model as model_lib
from paxsearch.trainer import quant, validate
from paxsearch.trainer.config import ModelConfig
from paxsearch.trainer.errors import ConfigError
from paxsearch.trainer.plan import build_program
from paxsearch.trainer.train import train
from paxsearch.trainer.xent import token_xent

from ..search_util import cli
from ..trainer_util import tiny

# a Llama-style model: gated MLP (the MLP's three DenseGeneral matmuls), GQA and RoPE
LLAMA = ModelConfig(vocab_size=384, d_model=64, n_layers=2, n_heads=4, head_dim=16, d_ff=128, seq_len=32,
                    mlp="gated", activation="silu", position="rope", n_kv_heads=2)
PROJECTIONS = 7  # query, key, value, out, mlp_gate, mlp_up, mlp_out (the scanned layer body appears once)


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _cos(a, b) -> float:
    a, b = np.ravel(np.asarray(a, np.float32)), np.ravel(np.asarray(b, np.float32))
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


# ----------------------------------------------------------------------------- the matmul

@pytest.mark.parametrize("n", [1, 2])  # n = 2: the attention's out projection, [B, S, H, D] . [H, D, E]
def test_int8_matmul_within_its_rounding_bound(n):
    k = jax.random.split(jax.random.key(0), 3)
    in_dims, out_dims = ((96,), (3, 16)) if n == 1 else ((4, 24), (48,))
    x = jax.random.normal(k[0], (4, 32, *in_dims))
    x = x * jnp.exp(jax.random.normal(k[2], (4, 32) + (1,) * n))  # tokens of different scales
    w = jax.random.normal(k[1], (*in_dims, *out_dims)) * 0.1
    ref = np.asarray(jnp.tensordot(x, w, n), np.float64)
    out = np.asarray(quant.tensordot(x, w, n, "int8"), np.float64)
    # each operand is off by at most half its step (scale / 127 / 2), per token and per channel:
    # |dy| <= sx/2 sum|w| + sw/2 sum|x| + K sx sw / 4
    xa, wa = np.abs(np.asarray(x, np.float64)), np.abs(np.asarray(w, np.float64))
    in_axes = tuple(range(x.ndim - n, x.ndim))
    sx = xa.max(axis=in_axes) / 127  # [B, S]
    sw = wa.max(axis=tuple(range(n))) / 127  # [*out]
    contracted = int(np.prod(in_dims))
    per_token = lambda a: a.reshape(a.shape + (1,) * len(out_dims))  # [B, S] -> [B, S, 1...]
    sx_b, x_sum = per_token(sx), per_token(xa.sum(axis=in_axes))
    bound = sx_b / 2 * wa.sum(axis=tuple(range(n))) + sw / 2 * x_sum + contracted * sx_b * sw / 4
    assert np.all(np.abs(out - ref) <= bound * 1.0001 + 1e-5)
    assert 1e-3 < _rel(out, ref) < 0.015  # quantized (not the float product), and close: 0.9% measured
    bf16 = quant.tensordot(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16), n, "int8")
    assert bf16.dtype == jnp.bfloat16 and _rel(bf16, ref) < 0.02


def test_zero_rows_stay_zero_and_finite():
    x = jnp.zeros((2, 8, 16)).at[0].set(1.0)
    w = jnp.ones((16, 4))
    out = quant.tensordot(x, w, 1, "int8")
    np.testing.assert_array_equal(out[1], 0.0)
    np.testing.assert_allclose(out[0], 16.0, rtol=1e-6)
    grads = jax.jit(jax.grad(lambda x, w: jnp.sum(quant.tensordot(x, w, 1, "int8") ** 2), argnums=(0, 1)))(x, w)
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in grads)


def test_matmul_gradients_int8_close_and_int8_fwd_exact():
    k = jax.random.split(jax.random.key(1), 3)
    x, w = jax.random.normal(k[0], (4, 64, 128)), jax.random.normal(k[1], (128, 8, 16)) * 0.1
    g = jax.random.normal(k[2], (4, 64, 8, 16))
    grads = lambda mode: jax.jit(jax.grad(lambda x, w: jnp.sum(quant.tensordot(x, w, 1, mode) * g),
                                          argnums=(0, 1)))(x, w)
    ref = grads("none")
    for mine, want in zip(grads("int8"), ref, strict=True):
        assert 1e-3 < _rel(mine, want) < 0.015  # both backward matmuls rounded: 0.9% and 1.0% measured
    for mine, want in zip(grads("int8_fwd"), ref, strict=True):  # backward in the float dtype
        np.testing.assert_allclose(mine, want, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- the model's gradients

@pytest.fixture(scope="module")
def llama_setup():
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(1, 259, (8, LLAMA.seq_len + 1)), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(LLAMA.seq_len), (8, LLAMA.seq_len))
    segments = jnp.ones((8, LLAMA.seq_len), jnp.int32)
    init = jax.jit(lambda key: model_lib.TransformerLM(LLAMA, attention_impl="dot_product").init(
        key, tokens[:, :-1], positions, segments)["params"])
    params = nn_unbox(init(jax.random.key(0)))

    def loss_fn(quantization: str, dtype: str = "float32"):
        mod = model_lib.TransformerLM(dataclasses.replace(LLAMA, quantization=quantization, dtype=dtype),
                                      attention_impl="dot_product")
        return lambda p: jnp.mean(token_xent(mod.apply({"params": p}, tokens[:, :-1], positions, segments),
                                             tokens[:, 1:]))

    return params, loss_fn


def nn_unbox(tree):
    return jax.tree.map(lambda x: x.unbox() if hasattr(x, "unbox") else x, tree, is_leaf=lambda x: hasattr(x, "unbox"))


def test_int8_gradients_agree_with_the_float_ones(llama_setup):
    params, loss_fn = llama_setup
    grad = lambda q: jax.jit(jax.grad(loss_fn(q)))(params)
    ref = grad("none")
    flat_ref = np.concatenate([np.ravel(g) for g in jax.tree.leaves(ref)])
    # int8: every projection's three matmuls rounded; int8_fwd: the forward only
    for q, whole_rel, leaf_rel in (("int8", 0.05, 0.08), ("int8_fwd", 0.04, 0.06)):
        g = grad(q)
        assert jax.tree.structure(g) == jax.tree.structure(ref)  # the same parameters, quantized or not
        flat = np.concatenate([np.ravel(x) for x in jax.tree.leaves(g)])
        # measured: int8 cosine 0.99971, relative error 2.4% (worst leaf 0.9995, 3.2%); int8_fwd 1.8%
        assert _cos(flat, flat_ref) > 0.999 and 0.002 < _rel(flat, flat_ref) < whole_rel, q
        for path, mine in jax.tree.flatten_with_path(g)[0]:
            want = ref
            for key in path:
                want = want[key.key]
            assert _cos(mine, want) > 0.998 and _rel(mine, want) < leaf_rel, (q, jax.tree_util.keystr(path))


def _dots(jaxpr, out):
    """(operand dtypes, result dtype) of every dot_general in `jaxpr` and its sub-jaxprs."""
    for e in jaxpr.eqns:
        if e.primitive.name == "dot_general":
            out.append((tuple(str(v.aval.dtype) for v in e.invars), str(e.outvars[0].aval.dtype)))
        for p in e.params.values():
            for sub in p if isinstance(p, (tuple, list)) else (p,):
                if isinstance(sub, jax.extend.core.ClosedJaxpr):
                    _dots(sub.jaxpr, out)
                elif isinstance(sub, jax.extend.core.Jaxpr):
                    _dots(sub, out)
    return out


def test_the_projections_and_only_they_are_int8_in_the_jaxpr(llama_setup):
    params, loss_fn = llama_setup
    count = {q: collections.Counter(_dots(jax.make_jaxpr(jax.grad(loss_fn(q, "bfloat16")))(params).jaxpr, []))
             for q in ("none", "int8", "int8_fwd")}
    s8 = (("int8", "int8"), "int32")
    total = sum(count["none"].values())  # 7 projections x 3 + unembedding x 3 + attention's QK^T, AV x 3
    assert total == 3 * PROJECTIONS + 3 + 6 and count["none"][s8] == 0
    assert count["int8"][s8] == 3 * PROJECTIONS  # forward, input gradient, weight gradient
    assert sum(count["int8"].values()) == total  # the unembedding and attention's products stay bf16
    assert count["int8_fwd"][s8] == PROJECTIONS and sum(count["int8_fwd"].values()) == total


# ----------------------------------------------------------------------------- training

STEPS = 12


def _train(quantization: str):
    cfg = tiny(steps=STEPS, log_every=STEPS // 2)
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, quantization=quantization),
                              optimizer=dataclasses.replace(cfg.optimizer, peak_lr=3e-3, warmup_steps=5))
    program = build_program(cfg, count_flops=False)
    seen = []
    train(cfg, report=lambda m: seen.append((m.step, m.loss)), program=program)
    return dict(seen), program


@pytest.fixture(scope="module")
def trained():
    return {q: _train(q) for q in ("none", "int8")}


def test_int8_training_reaches_the_float_loss_within_2_percent(trained):
    (ref, _), (mine, _) = trained["none"], trained["int8"]
    assert sorted(ref) == sorted(mine) == [1, STEPS // 2, STEPS]
    assert ref[STEPS] < 0.6 * ref[1]  # it learned something
    assert abs(mine[STEPS] - ref[STEPS]) / ref[STEPS] < 0.02, (mine, ref)  # 0.01% measured
    assert mine[1] != ref[1]  # the quantized forward is not the float one


def test_the_compiled_int8_step_runs_s8_dots(trained):
    """XLA keeps the dots int8 x int8 -> int32 (it does not turn them back into float dots)."""
    hlo = trained["int8"][1].compiled_step.as_text()
    types = dict(re.findall(r"(%[\w.\-]+) = (\w+)\[", hlo))
    dots = [(out, types.get(a), types.get(b))
            for out, a, b in re.findall(r"= (\w+)\[[^\]]*\][^ ]* dot\((%[\w.\-]+), (%[\w.\-]+)\)", hlo)]
    s8 = [d for d in dots if d == ("s32", "s8", "s8")]
    assert len(s8) >= 3 * 6, dots  # dense MLP: 6 projections x 3 matmuls in the scanned layer
    none_hlo = trained["none"][1].compiled_step.as_text()
    assert " s8[" not in none_hlo and "s8[" in hlo


# ----------------------------------------------------------------------------- refusals

@pytest.mark.parametrize("value, match", [("int4", "unknown model.quantization 'int4'; choose one of none, int8, "
                                                   "int8_fwd"),
                                          ("fp8", "fp8 runs natively on NVIDIA H100")])
def test_bad_values_are_one_line(value, match):
    cfg = tiny(model=dataclasses.replace(tiny().model, quantization=value))
    with pytest.raises(ConfigError, match=match) as err:
        validate.check(cfg, 8, "cpu")
    assert "\n" not in str(err.value)


def test_cli_refuses_int4_in_one_line(tmp_path):
    proc = cli("train", "--set", "model=llama-tiny", "--set", "model.quantization=int4", "--run-dir",
               tmp_path / "run", check=False, timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "unknown model.quantization 'int4'; choose one of none, int8, int8_fwd" in lines[0]
    assert not (tmp_path / "run").exists()

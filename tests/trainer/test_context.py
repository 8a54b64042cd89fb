"""Context parallelism over the mesh axis `context` (trainer/context.py): the load-balanced
layout, static checks, attention of every kind on a context-split sequence, and the same loss
and gradients as context 1 on 8 CPU devices."""
import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from paxsearch.trainer import attention as A
from paxsearch.trainer import context as context_lib
from paxsearch.trainer import mesh as mesh_lib
from paxsearch.trainer import pipeline as pipeline_lib
from paxsearch.trainer import plan as plan_lib
from paxsearch.trainer import sharding, validate
from paxsearch.trainer import step as step_lib
from paxsearch.trainer.config import (
    MeshConfig,
    ModelConfig,
    PipelineConfig,
    TrainConfig,
    from_dict,
    mesh_shape,
    to_dict,
)
from paxsearch.trainer.errors import ConfigError

from ..search_util import HAS_LIBTPU

MODEL = ModelConfig(vocab_size=128, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=64, seq_len=32,
                    attention="dot_product", position="rope", mlp="gated", activation="silu", attention_block=4)
BATCH = 8


NO_DCN, NO_PIPELINE = mesh_shape(), PipelineConfig()


def config(ici, dcn=NO_DCN, pipeline=NO_PIPELINE, **model) -> TrainConfig:
    return TrainConfig(model=dataclasses.replace(MODEL, **model), mesh=MeshConfig(ici=ici, dcn=dcn),
                       per_device_batch=None, global_batch=BATCH, pipeline=pipeline)


# ----------------------------------------------------------------------------- the layout

def test_load_balanced_layout():
    # context 2: shard 0 holds chunks 0 and 3, shard 1 chunks 1 and 2 (of 4 chunks of 4 tokens)
    assert context_lib.order(16, 2).tolist() == [0, 1, 2, 3, 12, 13, 14, 15, 4, 5, 6, 7, 8, 9, 10, 11]
    assert context_lib.order(16, 1).tolist() == list(range(16))
    x = np.arange(3 * 48 * 2).reshape(3, 48, 2)
    for c in (1, 2, 3, 4):
        assert (context_lib.restore(context_lib.reorder(x, c), c) == x).all()
        assert (np.asarray(context_lib.reorder(jnp.asarray(x), c)) == context_lib.reorder(x, c)).all()
        # every shard does the same causal work: the keys its queries see
        work = (context_lib.order(48, c) + 1).reshape(c, -1).sum(axis=1)
        assert (work == work[0]).all(), (c, work)


# ----------------------------------------------------------------------------- static checks

@pytest.mark.parametrize("cfg,platform,message", [
    (config(mesh_shape(context=4, fsdp=2), seq_len=36), "cpu",
     "seq_len=36 does not split into 2 x context=8 load-balanced chunks; use a seq_len that is a multiple of 8 "
     "(e.g. 40)"),
    (config(mesh_shape(context=4, fsdp=2), attention="flash", attention_block=8), "cpu",
     "each of the 2 x 4 chunks of seq_len=32 holds 4 tokens, not a multiple of attention_block=8"),
    (config(mesh_shape(context=2, fsdp=4), attention="flash", seq_len=256), "tpu",
     "splash attention with context=2: each of the 2 x 2 chunks of seq_len=256 holds 64 tokens"),
    (config(mesh_shape(context=2, fsdp=4), attention="flash", dtype="bfloat16"), "gpu",
     "context=2 is not implemented for cuDNN attention"),
    (config(mesh_shape(context=4, fsdp=2), vocab_tiles=16), "cpu",
     "vocab_tiles=16 cuts seq_len=32 into chunks of 2 tokens, which do not split over context=4"),
    # over DCN too
    (config(mesh_shape(fsdp=4), dcn=mesh_shape(context=2), seq_len=30), "cpu", "seq_len=30 does not split"),
])
def test_bad_contexts_one_line(cfg, platform, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")) as e:
        validate.check(cfg, 8, platform)
    assert "\n" not in str(e.value)


def test_good_contexts_pass_and_round_trip():
    for cfg in (config(mesh_shape(context=2, fsdp=2, tensor=2)), config(mesh_shape(fsdp=4), dcn=mesh_shape(context=2)),
                config(mesh_shape(context=8), attention="flash", seq_len=64)):
        validate.check(cfg, 8, "cpu")
        assert from_dict(to_dict(cfg)) == cfg
    assert mesh_lib.axis_sizes(config(mesh_shape(context=2, fsdp=-1)).mesh, 8)["context"] == 2


# ----------------------------------------------------------------------------- attention kernels

def _qkv(b=2, s=32, h=4, k=2, d=8, seed=0):
    r = np.random.default_rng(seed)
    q, kk, v = (jnp.asarray(r.standard_normal((b, s, n, d)), jnp.float32) for n in (h, k, k))
    seg = np.ones((b, s), np.int32)
    seg[0, s // 3:] = 2  # two documents in row 0, padding at the end of row 1
    seg[-1, -s // 5:] = 0
    return q, kk, v, jnp.asarray(seg), jnp.asarray(r.standard_normal((b, s, h, d)), jnp.float32)


def _context_mesh(context, devices=8):
    return jax.sharding.Mesh(np.asarray(jax.devices()[:devices]).reshape(devices // context, context),
                             ("fsdp", "context"))


RULES = (("batch", "fsdp"), ("length", "context"), ("act_heads", None), ("act_kv_heads", None), ("act_kv", None))


def _value_and_grads(fn, q, k, v, seg, w):
    loss = lambda q, k, v: jnp.sum(fn(q, k, v, seg) * w)
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(q, k, v)


@pytest.mark.parametrize("impl,context", [("dot_product", 2), ("blockwise", 2), ("blockwise", 4)])
def test_context_parallel_attention_matches_context_1(impl, context):
    """Outputs (put back in natural order) and q/k/v gradients of every kind, split over
    `context` shards, against dot_product on the whole sequence."""
    q, k, v, seg, w = _qkv()
    ref_out = A.dot_product(q, k, v, seg)
    ref = _value_and_grads(A.dot_product, q, k, v, seg, w)
    re = functools.partial(context_lib.reorder, context=context)
    un = functools.partial(context_lib.restore, context=context)

    def split(q, k, v, seg):
        return un(A.attend(re(q), re(k), re(v), re(seg), impl, 4, context))

    with jax.set_mesh(_context_mesh(context)), nn.logical_axis_rules(RULES):
        out = jax.jit(split)(q, k, v, seg)
        got = _value_and_grads(split, q, k, v, seg, w)
    np.testing.assert_allclose(out, ref_out, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-5)
    for a, b in zip(got[1], ref[1], strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4)


@pytest.mark.slow
def test_splash_context_parallel_in_interpret_mode_matches_dot_product():
    """The Pallas TPU kernel with its mask split over 2 query shards (load-balanced layout), run
    by the Pallas interpreter on CPU, against dot_product on the whole sequence."""
    q, k, v, seg, w = _qkv(b=1, s=512, h=2, k=1, d=128)
    context = 2
    re = functools.partial(context_lib.reorder, context=context)
    un = functools.partial(context_lib.restore, context=context)

    def split(q, k, v, seg):
        return un(A.context_parallel(re(q), re(k), re(v), re(seg), "splash", 128, context, interpret=True))

    with jax.set_mesh(_context_mesh(context, devices=2)), nn.logical_axis_rules(RULES):
        got = _value_and_grads(split, q, k, v, seg, w)
    ref = _value_and_grads(A.dot_product, q, k, v, seg, w)
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-5)
    for a, b in zip(got[1], ref[1], strict=True):
        np.testing.assert_allclose(a, b, atol=5e-5, rtol=1e-4)


# ----------------------------------------------------------------------------- same loss, same gradients

def _batch():
    rng = np.random.default_rng(0)
    s = MODEL.seq_len
    tokens = jnp.asarray(rng.integers(0, MODEL.vocab_size, (BATCH, s + 1)), jnp.int32)
    segments = np.ones((BATCH, s), np.int32)
    segments[::3, 11:] = 2  # packed rows: two documents, the second across a chunk boundary
    segments[1, 27:] = 0  # padding
    positions = np.tile(np.arange(s), (BATCH, 1))
    positions[::3, 11:] -= 11
    weights = jnp.asarray((rng.random((BATCH, s)) > 0.1) & (segments > 0), jnp.float32)
    return dict(inputs=tokens[:, :-1], targets=tokens[:, 1:], segment_ids=jnp.asarray(segments),
                positions=jnp.asarray(positions), weights=weights)


def _loss_and_grads(cfg, params=None, batch=None):
    """Loss and gradients of the train step's loss (step.make_loss_sums: the batch into the
    load-balanced layout when the mesh has a context axis), float32."""
    validate.check(cfg, 8, "cpu")
    mesh = mesh_lib.build_mesh(cfg.mesh, jax.devices())
    sizes = dict(mesh.shape)
    model = plan_lib.make_model(cfg, "cpu", sizes["stage"], sizes["context"])
    rules = plan_lib.resolved_rules(cfg, mesh)
    one = {k: v[:1] for k, v in batch.items()}
    init = lambda: model.init(jax.random.key(1), one["inputs"], one["positions"], one["segment_ids"])["params"]
    with plan_lib.mesh_context(mesh, rules):
        param_sh = sharding.logical_to_sharding(nn.get_partition_spec(jax.eval_shape(init)), mesh, rules)
        if params is None:
            params = jax.jit(lambda: step_lib.unbox(init()), out_shardings=param_sh)()
        loss_sums = step_lib.make_loss_sums(model)

        def loss_fn(p, b):
            total, weight = loss_sums(p, b)
            return total / weight

        fn = jax.jit(jax.value_and_grad(loss_fn), in_shardings=(param_sh, sharding.batch_sharding(mesh)))
        loss, grads = fn(params, batch)
    return float(loss), jax.device_get(grads), jax.device_get(params)


_references: dict = {}


def reference(attention):
    """Loss, gradients and parameters at context 1 (data x fsdp x tensor = 2 x 2 x 2)."""
    if attention not in _references:
        batch = _batch()
        _references[attention] = _loss_and_grads(config(mesh_shape(data=2, fsdp=2, tensor=2), attention=attention),
                                                  batch=batch) + (batch,)
    return _references[attention]


def _close(a, b, rel=1e-5):
    scale = float(np.max(np.abs(a)))
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) <= rel * max(scale, 1e-30)


def _assert_same(expected, got):
    flat = jax.tree_util.tree_flatten_with_path(expected)[0]
    leaves = jax.tree.leaves(got)
    assert len(flat) == len(leaves)
    for (path, a), b in zip(flat, leaves, strict=True):
        assert _close(a, b), jax.tree_util.keystr(path)


@pytest.mark.parametrize("attention,ici,dcn", [
    # ~20 s each (two compiles of the whole model's gradient): the quick loop has the kernels above
    pytest.param("dot_product", mesh_shape(context=2, fsdp=2, tensor=2), mesh_shape(), marks=pytest.mark.slow),
    pytest.param("dot_product", mesh_shape(context=4, fsdp=2), mesh_shape(), marks=pytest.mark.slow),
    pytest.param("flash", mesh_shape(context=2, fsdp=2, tensor=2), mesh_shape(), marks=pytest.mark.slow),
    pytest.param("flash", mesh_shape(context=4, data=2), mesh_shape(), marks=pytest.mark.slow),
    # context over DCN (an outer factor of one process's devices)
    pytest.param("flash", mesh_shape(fsdp=2, tensor=2), mesh_shape(context=2), marks=pytest.mark.slow),
], ids=["dot-c2-fsdp-tensor", "dot-c4-fsdp", "blockwise-c2-fsdp-tensor", "blockwise-c4-data", "blockwise-c2-dcn"])
def test_same_loss_and_gradients_as_context_1(attention, ici, dcn):
    loss, grads, params, batch = reference(attention)
    c_loss, c_grads, _ = _loss_and_grads(config(ici, dcn, attention=attention), params, batch)
    assert c_loss == pytest.approx(loss, rel=1e-5)
    _assert_same(grads, c_grads)


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["dot_product", "flash"])
def test_same_loss_and_gradients_with_a_pipeline_stage_axis(attention):
    """stage 2 x context 2 x fsdp 2: the pipelined stages run context-split attention."""
    loss, grads, params, batch = reference(attention)
    pipeline = PipelineConfig(2, 1, "gpipe")
    staged = {k: v for k, v in params.items() if k != "layers"}
    staged["pipeline"] = {"layers": pipeline_lib.stack_to_stages(params["layers"], 2, 1)}
    cfg = config(mesh_shape(stage=2, context=2, fsdp=2), pipeline=pipeline, attention=attention)
    c_loss, c_grads, _ = _loss_and_grads(cfg, staged, batch)
    assert c_loss == pytest.approx(loss, rel=1e-5)
    c_grads = dict(c_grads)
    layer_grads = pipeline_lib.stages_to_stack(c_grads.pop("pipeline")["layers"], 2, 1)
    expected = dict(grads)
    _assert_same(expected.pop("layers"), layer_grads)
    _assert_same(expected, c_grads)


@pytest.mark.slow
def test_context_parallel_config_trains_and_evaluates(tmp_path):
    """The whole step (AdamW update, donated state) and eval run with the sequence split over
    context; the loss falls; the plan and the stored config carry the context axis."""
    from paxsearch.tests.trainer_util import tiny
    from paxsearch.trainer.config import EvalConfig
    from paxsearch.trainer.train import train

    base = tiny()
    cfg = tiny(ici=mesh_shape(context=2, fsdp=2, tensor=2), steps=4, eval=EvalConfig(enabled=True, max_batches=1),
               model=dataclasses.replace(base.model, attention="flash", attention_block=16), run_dir=str(tmp_path))
    result = train(cfg, resume=False)
    losses = [m.loss for m in result.history]
    assert len(losses) == 4 and all(np.isfinite(losses)) and losses[-1] < losses[0]
    assert result.plan.mesh_shape == dict(data=1, stage=1, fsdp=2, context=2, tensor=2)
    assert result.eval_loss is not None and np.isfinite(result.eval_loss)
    assert from_dict(to_dict(cfg)).mesh.ici == (1, 1, 2, 2, 2)


@pytest.mark.slow
@pytest.mark.tpu
@pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu is not installed (pip install 'paxsearch[tpu]')")
def test_context_parallel_splash_plans_on_a_tpu_topology():
    """Plan mode (libtpu, no TPU): context 2 x fsdp 2 x tensor 2 on v5e-8 compiles the splash
    kernel with its mask split over the query shards (~80 s on a 2-core machine)."""
    from paxsearch.search.planning import topology as topo

    model = ModelConfig(vocab_size=4096, d_model=256, n_layers=2, n_heads=8, head_dim=128, d_ff=1024, seq_len=1024,
                        dtype="bfloat16", param_dtype="float32", attention="flash")
    cfg = TrainConfig(model=model, mesh=MeshConfig(ici=mesh_shape(context=2, fsdp=2, tensor=2)), per_device_batch=2,
                      remat="full")
    program = plan_lib.build_program(cfg, topo.topology_devices("v5e-8"), count_flops=False)
    assert program.plan.mesh_shape == dict(data=1, stage=1, fsdp=2, context=2, tensor=2)
    assert program.plan.platform == "tpu" and 0 < program.plan.peak_bytes < 16 * 2 ** 30
    assert program.model.context_shards == 2 and program.model.attention_impl == "splash"
    hlo = program.compiled_step.as_text()
    assert hlo is None or "tpu_custom_call" in hlo  # the Pallas kernel, not a dot_product fallback


def test_weights_shard_over_context_like_fsdp():
    """Devices on the context axis share the weights' shards (their embed dim over fsdp x
    context, as MaxText's rules do), instead of each holding a full copy."""
    cfg = config(mesh_shape(context=2, fsdp=2, tensor=2), d_model=32)
    mesh = mesh_lib.build_mesh(cfg.mesh, jax.devices())
    model = plan_lib.make_model(cfg, "cpu", 1, 2)
    rules = plan_lib.resolved_rules(cfg, mesh)
    tokens = jnp.zeros((1, MODEL.seq_len), jnp.int32)
    with plan_lib.mesh_context(mesh, rules):
        boxed = jax.eval_shape(lambda: model.init(jax.random.key(0), tokens, tokens, tokens + 1))["params"]
        shardings = sharding.logical_to_sharding(nn.get_partition_spec(boxed), mesh, rules)
    # [layers, embed, heads, kv]; the expert axis (1 here) shares them too (trainer/sharding.py)
    assert shardings["layers"]["query"]["kernel"].spec[1] == ("fsdp", "context", "expert")
    assert shardings["embed"]["embedding"].spec == jax.sharding.PartitionSpec("tensor", ("fsdp", "context", "expert"))
    assert shardings["layers"]["query"]["kernel"].shard_shape((2, 32, 4, 8)) == (2, 8, 2, 8)
    with pytest.raises(ConfigError, match="d_model=36 does not divide over fsdp=2 x context=4"):
        validate.check(config(mesh_shape(context=4, fsdp=2), d_model=36), 8, "cpu")

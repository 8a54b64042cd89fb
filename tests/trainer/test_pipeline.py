"""Pipeline parallelism over the mesh axis `stage` (trainer/pipeline.py): static checks, the
bubble, the layouts, and the same loss and gradients as the unpipelined model on 8 CPU devices."""
import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from paxsearch.search.planning import plans
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

MODEL = ModelConfig(vocab_size=128, d_model=32, n_layers=8, n_heads=2, head_dim=16, d_ff=64, seq_len=16,
                    attention="dot_product", position="rope", mlp="gated", activation="silu")
BATCH = 16


NO_PIPELINE = PipelineConfig()


def config(ici, pipeline=NO_PIPELINE, dcn=(1, 1, 1, 1, 1), **model) -> TrainConfig:
    return TrainConfig(model=dataclasses.replace(MODEL, **model), mesh=MeshConfig(ici=ici, dcn=dcn),
                       per_device_batch=None, global_batch=BATCH, pipeline=pipeline)


# ----------------------------------------------------------------------------- static checks

@pytest.mark.parametrize("cfg,message", [
    (config(mesh_shape(stage=2, fsdp=4), PipelineConfig(4, 1, "zigzag")), "unknown pipeline.schedule 'zigzag'"),
    (config(mesh_shape(stage=2, fsdp=4), PipelineConfig(0)), "microbatches and pipeline.repeats must be >= 1"),
    (config(mesh_shape(fsdp=8), PipelineConfig(4)), "need a stage axis > 1"),
    (config(mesh_shape(stage=2, fsdp=4), PipelineConfig(4, 2, "gpipe")), "use schedule='circular' for repeats > 1"),
    (config(mesh_shape(stage=2, fsdp=4), PipelineConfig(4), scan_layers=False), "needs model.scan_layers=True"),
    (config(mesh_shape(stage=4, fsdp=2), PipelineConfig(4, 4, "circular")),
     "n_layers=8 does not split over stage=4 x repeats=4"),
    (config(mesh_shape(stage=4, fsdp=2), PipelineConfig(6)), "microbatches=6 is not a multiple of stage=4; use 8"),
    (config(mesh_shape(stage=2, fsdp=4), PipelineConfig(8)), "rows per device 4 must be a multiple of microbatches=8"),
    # the stage axis over DCN is checked the same way
    (config(mesh_shape(fsdp=4), PipelineConfig(3), dcn=mesh_shape(stage=2)), "microbatches=3 is not a multiple of"),
])
def test_bad_pipelines_one_line(cfg, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")) as e:
        validate.check(cfg, 8, "cpu")
    assert "\n" not in str(e.value)


def test_good_pipelines_pass_and_the_config_round_trips():
    cfg = config(mesh_shape(stage=2, fsdp=2, tensor=2), PipelineConfig(4, 2, "circular"))
    validate.check(cfg, 8, "cpu")
    assert from_dict(to_dict(cfg)) == cfg
    old = to_dict(cfg)
    del old["pipeline"]  # a dict written before the field existed
    assert from_dict(old).pipeline == PipelineConfig()


def test_bubble_fraction():
    assert pipeline_lib.bubble_fraction(1, 1) == 0.0
    assert pipeline_lib.bubble_fraction(4, 8) == pytest.approx(3 / 11)  # GPipe: (S-1)/(M+S-1)
    assert pipeline_lib.bubble_fraction(4, 8, 2) == pytest.approx(3 / 19)  # circular: (S-1)/(MR+S-1)


def test_layouts_round_trip_and_circular_order():
    assert pipeline_lib.layer_order(8, 2, 2) == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert pipeline_lib.layer_order(8, 4, 1) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    stack = jnp.arange(8 * 3).reshape(8, 3)
    staged = pipeline_lib.stack_to_stages(stack, 2, 2)
    assert staged.shape == (2, 4, 3)
    assert [[int(r[0]) // 3 for r in row] for row in staged] == pipeline_lib.layer_order(8, 2, 2)
    assert (pipeline_lib.stages_to_stack(staged, 2, 2) == stack).all()
    x = jnp.arange(16 * 2).reshape(16, 2)
    micro = pipeline_lib.to_microbatches(x, 4)
    assert micro.shape == (4, 4, 2) and (micro[1][:, 0] // 2 == jnp.array([1, 5, 9, 13])).all()
    assert (pipeline_lib.from_microbatches(micro) == x).all()


# ----------------------------------------------------------------------------- same loss, same gradients

@pytest.fixture(scope="module")
def reference():
    """Loss and gradients of the unpipelined model (data x fsdp x tensor = 2 x 2 x 2), float32,
    and its parameters, which every pipelined case reuses in its own layout."""
    cfg = config(mesh_shape(data=2, fsdp=2, tensor=2))
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, MODEL.vocab_size, (BATCH, MODEL.seq_len + 1)), jnp.int32)
    segments = np.ones((BATCH, MODEL.seq_len), np.int32)
    segments[::3, MODEL.seq_len // 2:] = 2  # packed rows: two documents
    positions = np.tile(np.arange(MODEL.seq_len), (BATCH, 1))
    positions[::3, MODEL.seq_len // 2:] -= MODEL.seq_len // 2
    weights = jnp.asarray(rng.random((BATCH, MODEL.seq_len)) > 0.1, jnp.float32)
    batch = dict(inputs=tokens[:, :-1], targets=tokens[:, 1:], segment_ids=jnp.asarray(segments),
                 positions=jnp.asarray(positions), weights=weights)
    model = plan_lib.make_model(cfg, "cpu")
    params = model.init(jax.random.key(1), batch["inputs"], batch["positions"], batch["segment_ids"])["params"]
    params = step_lib.unbox(params)
    loss, grads = _loss_and_grads(cfg, params, batch)
    return params, batch, loss, grads


def _loss_and_grads(cfg, params, batch):
    devices = jax.devices()
    mesh = mesh_lib.build_mesh(cfg.mesh, devices)
    stages = dict(mesh.shape)["stage"]
    # pipelined: the head (final norm, unembedding) split over the stage devices too, as build_program
    # makes it where the batch divides over data x stage x fsdp (BATCH 16 over 8 devices does)
    model = plan_lib.make_model(cfg, "cpu", stages, head_over_stage=stages > 1)
    assert model.head_batch == ("stage_batch" if stages > 1 else "batch")
    rules = plan_lib.resolved_rules(cfg, mesh)
    with plan_lib.mesh_context(mesh, rules):
        boxed = jax.eval_shape(lambda: model.init(jax.random.key(0), batch["inputs"], batch["positions"],
                                                  batch["segment_ids"]))["params"]
        param_sh = sharding.logical_to_sharding(nn.get_partition_spec(boxed), mesh, rules)
        if stages > 1:  # the stacked layers' stage axis is sharded over `stage`
            assert param_sh["pipeline"]["layers"]["query"]["kernel"].spec[0] == "stage"

        def loss_fn(p, b):
            logits = model.apply({"params": p}, b["inputs"], b["positions"], b["segment_ids"])
            total, weight = step_lib.weighted_xent(logits, b["targets"], b["weights"])
            return total / weight

        fn = jax.jit(jax.value_and_grad(loss_fn), in_shardings=(param_sh, sharding.batch_sharding(mesh)))
        loss, grads = fn(params, batch)
    return float(loss), jax.device_get(grads)


def _close(a, b, rel=1e-5):
    scale = float(np.max(np.abs(a)))
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) <= rel * max(scale, 1e-30)


@pytest.mark.parametrize("ici,dcn,pipeline", [
    (mesh_shape(stage=2, fsdp=2, tensor=2), mesh_shape(), PipelineConfig(2, 1, "gpipe")),
    pytest.param(mesh_shape(stage=4, data=2), mesh_shape(), PipelineConfig(4, 2, "circular"), marks=pytest.mark.slow),
    # stage over DCN (outer factor of one process's devices), fsdp and tensor inside
    pytest.param(mesh_shape(fsdp=2, tensor=2), mesh_shape(stage=2), PipelineConfig(4, 2, "circular"),
                 marks=pytest.mark.slow),
], ids=["gpipe-s2-fsdp-tensor", "circular-s4r2-data", "circular-dcn-s2r2"])
def test_same_loss_and_gradients_as_unpipelined(reference, ici, dcn, pipeline):
    params, batch, loss, grads = reference
    cfg = config(ici, pipeline, dcn)
    validate.check(cfg, 8, "cpu")
    stages = mesh_lib.axis_sizes(cfg.mesh, 8)["stage"]
    staged = {k: v for k, v in params.items() if k != "layers"}
    staged["pipeline"] = {"layers": pipeline_lib.stack_to_stages(params["layers"], stages, pipeline.repeats)}
    p_loss, p_grads = _loss_and_grads(cfg, staged, batch)
    assert p_loss == pytest.approx(loss, rel=1e-5)
    layer_grads = pipeline_lib.stages_to_stack(p_grads.pop("pipeline")["layers"], stages, pipeline.repeats)
    expected = dict(grads)
    expected_layers = expected.pop("layers")
    for path, (a, b) in _pairs(expected_layers, layer_grads) + _pairs(expected, p_grads):
        assert _close(a, b), path


def _pairs(x, y):
    flat_x = jax.tree_util.tree_flatten_with_path(x)[0]
    flat_y = jax.tree.leaves(y)
    assert len(flat_x) == len(flat_y)
    return [(jax.tree_util.keystr(p), (a, b)) for (p, a), b in zip(flat_x, flat_y, strict=True)]


# ----------------------------------------------------------------------------- plan: bubble, FLOPs, memory

@pytest.mark.slow
def test_plan_reports_the_bubble_and_model_flops_without_it():
    """Model FLOPs (MFU's numerator) never count the bubble; executed FLOPs (HFU's) do: fewer
    microbatches, a larger bubble, more FLOPs executed for the same model FLOPs."""
    mesh = mesh_shape(stage=2, fsdp=4)
    few = plan_lib.plan(config(mesh, PipelineConfig(2)), count_flops=True)
    many = plan_lib.plan(config(mesh, PipelineConfig(4, 2, "circular")), count_flops=True)
    flat = plan_lib.plan(config(mesh_shape(fsdp=8)), count_flops=False)
    assert few.pipeline_bubble == pytest.approx(1 / 3) and many.pipeline_bubble == pytest.approx(1 / 9)
    # stored with the trial's plan
    assert flat.pipeline_bubble == 0.0 and plans.trained(many, None).pipeline_bubble == pytest.approx(1 / 9)
    assert few.model_flops_per_step == many.model_flops_per_step == flat.model_flops_per_step
    assert few.xla_flops_per_step > many.xla_flops_per_step > 0
    assert many.mesh_shape == dict(data=1, stage=2, fsdp=4, context=1, tensor=1)
    # the stage axis splits the layers' parameters (and their AdamW moments) over 2 stages
    assert many.memory.argument_bytes < 0.75 * plan_lib.plan(config(mesh_shape(data=2, fsdp=4)),
                                                             count_flops=False).memory.argument_bytes


# weights large beside the activations: what the backward pass keeps per iteration shows
HEAVY = ModelConfig(vocab_size=512, d_model=256, n_layers=8, n_heads=4, head_dim=64, d_ff=2048, seq_len=32,
                    dtype="bfloat16", param_dtype="float32")


@pytest.mark.slow
def test_a_pipelined_step_keeps_no_copy_of_the_weights_per_iteration():
    """The chunk of layers a stage runs is rematerialized whole (model.PipelinedLayers): the
    backward pass slices the stage's weights again instead of keeping a cast copy of them for
    every iteration and layer. Measured (temp MiB, 8 CPU devices): gpipe 8 microbatches 71.8 ->
    26.7, gpipe 4 microbatches 52.1 -> 27.0, circular 4 x 2 repeats 44.3 -> 21.8, against 28.1
    for the same model unpipelined (data 2 x fsdp 4); on a 16B over v5p-32 (stage 4 x fsdp 4)
    the TPU compiler's peak went 46.45 -> 24.71 GiB, MaxText's step 24.25
    (benchmarks/bench_maxtext_peer.py)."""
    def temp(mesh, pipeline=NO_PIPELINE):
        cfg = TrainConfig(model=HEAVY, mesh=MeshConfig(ici=mesh), per_device_batch=8, remat="full", pipeline=pipeline)
        return plan_lib.plan(cfg, count_flops=False).memory.temp_bytes

    flat = temp(mesh_shape(data=2, fsdp=4))
    gpipe8, gpipe4 = temp(mesh_shape(stage=2, fsdp=4), PipelineConfig(8)), temp(mesh_shape(stage=2, fsdp=4),
                                                                                 PipelineConfig(4))
    circular = temp(mesh_shape(stage=2, fsdp=4), PipelineConfig(4, 2, "circular"))
    assert max(gpipe8, gpipe4, circular) < 1.25 * flat
    assert abs(gpipe8 - gpipe4) < 0.1 * gpipe4  # 9 iterations hold what 5 do: nothing per iteration but activations


@pytest.mark.slow
def test_pipelined_config_trains_and_evaluates(tmp_path):
    """The whole step (AdamW update, donated state) and eval run pipelined; the loss falls."""
    from paxsearch.tests.trainer_util import tiny
    from paxsearch.trainer.config import EvalConfig
    from paxsearch.trainer.train import train

    base = tiny()
    cfg = tiny(ici=mesh_shape(stage=2, fsdp=2, tensor=2), steps=4, pipeline=PipelineConfig(2, 2, "circular"),
               model=dataclasses.replace(base.model, n_layers=4), eval=EvalConfig(enabled=True, max_batches=1),
               run_dir=str(tmp_path))
    result = train(cfg, resume=False)
    losses = [m.loss for m in result.history]
    assert len(losses) == 4 and all(np.isfinite(losses)) and losses[-1] < losses[0]
    assert result.plan.pipeline_bubble == pytest.approx(1 / 5)  # (2-1)/(2x2+2-1)
    assert result.final is not None and result.final.mfu > 0
    assert result.eval_loss is not None and np.isfinite(result.eval_loss)

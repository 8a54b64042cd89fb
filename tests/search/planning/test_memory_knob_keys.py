"""The memory knobs in the planner's bookkeeping: plan keys (unchanged for configs without
them), the analytic pre-screen (ZeRO-1 and optimizer-state offload lower its bound) and the
steering math key (a knob changes the layout, not the math)."""
import dataclasses
import hashlib
import json

from paxsearch.search.planning import targets as T
from paxsearch.search.planning.analytic import prescreen
from paxsearch.search.planning.keys import plan_key, plan_keys
from paxsearch.search.tuning.steer import math_key
from paxsearch.trainer import remat
from paxsearch.trainer.config import MLA_FIELDS, MOE_FIELDS, MeshConfig, ModelConfig, TrainConfig

MODEL_8B = ModelConfig(vocab_size=131072, d_model=4096, n_layers=32, n_heads=32, head_dim=128, d_ff=16384,
                       seq_len=2048, dtype="bfloat16", param_dtype="float32")
TARGET = T.parse_target("tpu:v5e-16")


def _cfg(ici=(1, 16, 1), **kw):
    return dataclasses.replace(TrainConfig(model=MODEL_8B, mesh=MeshConfig(ici=ici), per_device_batch=1,
                                           remat="full"), **kw)


def _opt(cfg, **kw):
    return dataclasses.replace(cfg, optimizer=dataclasses.replace(cfg.optimizer, **kw))


def test_a_config_without_the_knobs_keeps_the_plan_key_of_before():
    cfg = _cfg()
    model = dataclasses.asdict(cfg.model)
    del model["vocab_tiles"], model["quantization"]  # the fields did not exist: what the previous release hashed
    for name in MOE_FIELDS + MLA_FIELDS:  # nor did the mixture-of-experts and latent-attention ones
        del model[name]
    before = {"target": TARGET.name, "model": model, "ici": [1, 16, 1], "dcn": [1, 1, 1], "remat": "full"}
    digest = lambda d: hashlib.sha1(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]
    assert plan_keys(cfg, TARGET) == (digest({**before, "global_batch": 16}), digest(before), 16)


def test_every_knob_changes_the_plan_key_but_not_the_math_key():
    cfg = _cfg(global_batch=32, per_device_batch=None)
    variants = [dataclasses.replace(cfg, grad_accum_steps=2), _opt(cfg, zero1=True), _opt(cfg, offload_state=True),
                dataclasses.replace(cfg, offload_params=True),
                dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, vocab_tiles=4)),
                dataclasses.replace(cfg, remat=remat.custom(decoder_input="offload"))]
    keys = {plan_key(c, TARGET) for c in [cfg, *variants]}
    assert len(keys) == len(variants) + 1
    assert {math_key(c, 16) for c in [cfg, *variants]} == {math_key(cfg, 16)}


def test_zero1_and_offloaded_moments_lower_the_analytic_bound():
    need = lambda c: prescreen(c, TARGET, limit_bytes=1).required_bytes
    plain = _cfg(ici=(4, 4, 1))
    params_bytes = 4 * 7_516_000_000 // 4  # roughly: float32 parameters over fsdp 4
    zero1, offload = need(_opt(plain, zero1=True)), need(_opt(plain, offload_state=True))
    assert need(plain) > zero1 > offload
    assert need(plain) - zero1 > 1.4 * params_bytes * 3 / 4  # two moments, 3/4 of each gone (data 4)
    assert "ZeRO-1: over 16 shards" in str(prescreen(_opt(plain, zero1=True), TARGET, limit_bytes=1))
    assert prescreen(_opt(_cfg(ici=(16, 1, 1)), offload_state=True), TARGET) is not None  # params + grads


def test_a_config_stored_before_the_knobs_loads_with_them_off():
    from paxsearch.trainer.config import from_dict, to_dict

    old = to_dict(_cfg())
    for name in ("grad_accum_steps", "offload_params"):
        del old[name]
    for name in ("zero1", "offload_state"):
        del old["optimizer"][name]
    del old["model"]["vocab_tiles"]
    cfg = from_dict(old)
    assert cfg == _cfg()
    assert (cfg.grad_accum_steps, cfg.model.vocab_tiles, cfg.optimizer.zero1, cfg.optimizer.offload_state,
            cfg.offload_params) == (1, 1, False, False, False)


def test_the_mesh_is_math_for_capacity_experts_only():
    """A capacity-based MoE layer drops each device's overflow, so two meshes of one global batch train
    different math there; dropless experts compute every route whatever the mesh."""
    def moe(compute, ici, batch):
        model = dataclasses.replace(MODEL_8B, n_experts=8, experts_per_token=2, expert_compute=compute)
        return dataclasses.replace(_cfg(ici=ici), model=model, per_device_batch=batch)

    for compute, same in (("dropless", True), ("capacity", False)):
        a, b = moe(compute, (1, 16, 1), 1), moe(compute, (2, 8, 1), 1)
        assert (math_key(a, 16) == math_key(b, 16)) is same, compute
    dense_a, dense_b = _cfg(ici=(1, 16, 1)), _cfg(ici=(2, 8, 1))
    assert math_key(dense_a, 16) == math_key(dense_b, 16)

"""The MaxText form of a config (search/export/maxtext.py): pure mapping, no MaxText needed."""
from __future__ import annotations

import dataclasses
import subprocess

import pytest

from paxsearch.search.export import maxtext
from paxsearch.search.export.common import ExportRefused
from paxsearch.trainer import presets, remat
from paxsearch.trainer.config import MeshConfig, PipelineConfig, TrainConfig, mesh_shape


def small(**kw) -> TrainConfig:
    model = presets.replace("llama3-8b", n_layers=4, d_model=256, n_heads=4, n_kv_heads=2, head_dim=64, d_ff=512,
                            seq_len=256, vocab_size=1024)
    return TrainConfig(**{"model": model, "mesh": MeshConfig(ici=mesh_shape(fsdp=-1, tensor=2)),
                          "per_device_batch": 2, **kw})


def keys_of(cfg, platform="tpu", devices=8, slices=1) -> tuple[dict[str, str], list[str]]:
    keys, notes = maxtext.overrides(cfg, platform, devices, slices)
    assert len({k for k, _ in keys}) == len(keys), "a key written twice"
    return dict(keys), notes.lines


def test_model_dims_and_block():
    k, _ = keys_of(small())
    assert (k["decoder_block"], k["base_emb_dim"], k["base_num_query_heads"], k["base_num_kv_heads"],
            k["head_dim"], k["base_mlp_dim"], k["base_num_decoder_layers"], k["vocab_size"],
            k["max_target_length"]) == ("llama2", "256", "4", "2", "64", "512", "4", "1024", "256")
    assert k["mlp_activations"] == "[silu,linear]"  # gated SwiGLU: the product of two projections
    assert k["rope_max_timescale"] == "500000" and k["logits_via_embedding"] == "false"
    assert (k["dtype"], k["weight_dtype"], k["scan_layers"]) == ("bfloat16", "float32", "true")
    parallel = small(model=presets.get("maxtext-v5e-16b"))
    k, _ = keys_of(parallel)
    assert k["decoder_block"] == "default" and k["mlp_activations"] == "[relu]" and k["logits_via_embedding"] == "true"


def test_every_axis_and_batch_per_chip():
    # 16 chips: data 2 x fsdp 4 x tensor 2; per_device_batch counts the batch axes (data x fsdp = 8)
    cfg = small(mesh=MeshConfig(ici=mesh_shape(data=2, fsdp=-1, tensor=2)), per_device_batch=3)
    k, _ = keys_of(cfg, devices=16)
    assert [k[f"ici_{a}_parallelism"] for a in ("data", "pipeline", "fsdp", "context", "tensor")] == \
        ["2", "1", "4", "1", "2"]
    assert all(k[f"dcn_{a}_parallelism"] == "1" for a in ("data", "pipeline", "fsdp", "context", "tensor"))
    assert k["per_device_batch_size"] == "1.5"  # global 24 rows over 16 chips (tensor chips count in MaxText)
    two = small(mesh=MeshConfig(ici=mesh_shape(fsdp=-1), dcn=mesh_shape(data=2)), per_device_batch=2)
    k, _ = keys_of(two, devices=16, slices=2)
    assert (k["ici_fsdp_parallelism"], k["dcn_data_parallelism"], k["num_slices"]) == ("8", "2", "2")
    assert k["per_device_batch_size"] == "2"
    ctx = small(mesh=MeshConfig(ici=mesh_shape(fsdp=2, context=2, tensor=2)))
    assert keys_of(ctx)[0]["ici_context_parallelism"] == "2"


def test_gradient_accumulation_is_per_microbatch():
    k, _ = keys_of(small(global_batch=32, per_device_batch=None, grad_accum_steps=4))
    assert k["gradient_accumulation_steps"] == "4" and k["per_device_batch_size"] == "1"  # 32 / (4 x 8)


def test_pipeline():
    cfg = small(mesh=MeshConfig(ici=mesh_shape(stage=2, fsdp=-1)), pipeline=PipelineConfig(microbatches=4))
    k, _ = keys_of(cfg)
    assert (k["ici_pipeline_parallelism"], k["num_pipeline_microbatches"], k["num_layers_per_pipeline_stage"]) == \
        ("2", "4", "2")
    circ = dataclasses.replace(cfg, pipeline=PipelineConfig(microbatches=4, repeats=2, schedule="circular"))
    assert keys_of(circ)[0]["num_layers_per_pipeline_stage"] == "1"  # 4 layers = 2 stages x 2 repeats x 1


@pytest.mark.parametrize("policy, saved", [
    ("minimal", {"query_proj", "key_proj", "value_proj", "context", "out_proj", "mlpwo"}),
    ("qkv_proj", {"query_proj", "key_proj", "value_proj", "out_proj"}),
    (remat.custom(decoder_input="offload", mlp1="device"), {"mlpwi", "mlpwi_0", "mlpwi_1"}),
])
def test_remat_custom_names(policy, saved):
    k, _ = keys_of(small(remat=policy))
    assert k["remat_policy"] == "custom"
    tensors = ("decoder_layer_input", "query_proj", "key_proj", "value_proj", "context", "out_proj", "mlpwi",
               "mlpwi_0", "mlpwi_1", "mlpwo")
    assert {t for t in tensors if k[t] == "device"} == saved
    assert all(k[t] in ("device", "remat", "offload") for t in tensors)
    if policy.startswith("custom"):
        assert k["decoder_layer_input"] == "offload"


def test_remat_full_and_approximations_are_visible():
    assert keys_of(small(remat="full"))[0]["remat_policy"] == "full"
    for name in ("none", "dots", "dots_no_batch"):
        k, notes = keys_of(small(remat=name))
        assert k["remat_policy"] == "custom"
        assert any(n.startswith(f"approximated remat={name}") for n in notes), notes


def test_attention_auto_by_platform_and_refusals():
    assert keys_of(small())[0]["attention"] == "flash"
    assert keys_of(small(), platform="cpu")[0]["attention"] == "dot_product"
    learned = small(model=dataclasses.replace(small().model, position="learned"))
    with pytest.raises(ExportRefused, match=r"model.position='learned'.*use position='rope'"):
        maxtext.overrides(learned, "tpu", 8)
    exact = small(model=dataclasses.replace(small().model, activation="gelu_exact"))
    with pytest.raises(ExportRefused, match="gelu_exact"):
        maxtext.overrides(exact, "tpu", 8)
    with pytest.raises(ExportRefused, match="does not fill 6 devices"):
        maxtext.overrides(small(mesh=MeshConfig(ici=mesh_shape(fsdp=4, tensor=2))), "tpu", 6)


def test_memory_knobs_optimizer_and_dropped_layout():
    opt = dataclasses.replace(small().optimizer, offload_state=True, zero1=True, peak_lr=1e-3, warmup_steps=20)
    cfg = small(optimizer=opt, offload_params=True, steps=200,
                model=dataclasses.replace(small().model, vocab_tiles=4))
    k, notes = keys_of(cfg)
    assert (k["optimizer_memory_host_offload"], k["parameter_memory_host_offload"], k["shard_optimizer_over_data"],
            k["num_vocab_tiling"]) == ("true", "true", "true", "4")
    assert (k["learning_rate"], k["warmup_steps_fraction"], k["learning_rate_schedule_steps"], k["steps"]) == \
        ("0.001", "0.1", "200", "200")
    assert any(n.startswith("dropped mesh.rules='default'") for n in notes)  # tensor 2, embed replicated by ours
    assert any(n.startswith("dropped data.task=") for n in notes)
    sp = small(mesh=MeshConfig(ici=mesh_shape(fsdp=-1, tensor=2), rules="sequence_parallel"))
    assert not any("mesh.rules" in n for n in keys_of(sp)[1])


def test_quantization_keys():
    assert "quantization" not in keys_of(small())[0]  # none: base.yml's own "" (bf16 matmuls)
    int8 = small(model=dataclasses.replace(small().model, quantization="int8"))
    k, notes = keys_of(int8)
    assert (k["quantization"], k["quantization_local_shard_count"]) == ("int8", "1")
    assert not any("quantization" in n for n in notes)
    fwd = small(model=dataclasses.replace(small().model, quantization="int8_fwd"))
    k, notes = keys_of(fwd)
    assert (k["quantization"], k["quantization_local_shard_count"]) == ("int8", "0")
    assert any(n.startswith("approximated model.quantization='int8_fwd'") for n in notes), notes


def test_command_script(tmp_path):
    cfg = small(flags="latency_hiding", remat="full")
    text = maxtext.command(cfg, "tpu", 8, run_name="r1", compile_topology="v5e-8")
    keys, notes = maxtext.overrides(cfg, "tpu", 8)
    for k, v in keys:
        assert f"{k}={v}" in text
    assert notes.lines and all(f"# {n}" in text for n in notes.lines)
    assert "export LIBTPU_INIT_ARGS='--xla_tpu_enable_latency_hiding_scheduler=true" in text
    assert "xla_gpu" not in text  # GPU-only flags stay out of a TPU script
    assert "compile_topology=v5e-8 compile_topology_num_slices=1" in text
    path = tmp_path / "run.sh"
    path.write_text(text)
    # the script runs: a fake interpreter prints the argv MaxText would get
    fake = tmp_path / "py"
    fake.write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done\n')
    fake.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "PYTHON": str(fake), "MAXTEXT_CONFIGS": "/cfg"}
    out = subprocess.run(["sh", str(path), "compile"], env=env, capture_output=True, text=True, check=True).stdout
    args = out.splitlines()
    assert args[:4] == ["-m", maxtext.COMPILE_MODULE, "/cfg/base.yml", "run_name=r1"]
    assert args[4:-2] == [f"{k}={v}" for k, v in keys]
    assert args[-2:] == ["compile_topology=v5e-8", "compile_topology_num_slices=1"]
    out = subprocess.run(["sh", str(path)], env=env, capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[1] == maxtext.TRAIN_MODULE and out.splitlines()[-1] == f"{keys[-1][0]}={keys[-1][1]}"


def test_yaml_overrides_parse_as_the_same_values():
    yaml = pytest.importorskip("yaml")
    cfg = small(remat="minimal")
    doc = yaml.safe_load(maxtext.yaml_overrides(cfg, "tpu", 8, run_name="r"))
    keys, _ = maxtext.overrides(cfg, "tpu", 8)
    assert doc["base_config"] == "base.yml" and doc["run_name"] == "r"
    assert doc["mlp_activations"] == ["silu", "linear"]
    for k, v in keys:
        if k != "mlp_activations":
            assert str(doc[k]).lower() == v.lower() or float(doc[k]) == float(v), (k, doc[k], v)


# --- mixtures of experts and multi-head latent attention: the inverse of trainer/maxtext_yml.py ---

MIXTRAL = presets.get("mixtral-8x7b")  # softmax top-2, dropless, experts d_ff wide
MOE_CASES = {
    "mixtral-dropless": (MIXTRAL, dict(decoder_block="mixtral", num_experts="8", num_experts_per_tok="2",
                                       base_moe_mlp_dim="14336", sparse_matmul="true", capacity_factor="-1.0",
                                       megablox="false", load_balance_loss_weight="0.01")),
    "mixtral-capacity": (dataclasses.replace(MIXTRAL, expert_compute="capacity", capacity_factor=1.25),
                         dict(decoder_block="mixtral", sparse_matmul="false", capacity_factor="1.25")),
    "mixtral-megablox": (dataclasses.replace(MIXTRAL, grouped_matmul="megablox"),
                         dict(decoder_block="mixtral", sparse_matmul="true", megablox="true")),
    # sigmoid router, a shared expert, 3 leading dense layers, MLA with a query latent
    "deepseek-v3": (presets.get("deepseek-v3"),
                    dict(decoder_block="deepseek", num_experts="256", num_experts_per_tok="8", base_mlp_dim="18432",
                         base_moe_mlp_dim="2048", shared_experts="1", first_num_dense_layers="3",
                         routed_score_func="sigmoid", routed_bias="true", load_balance_loss_weight="0.0",
                         attention_type="mla", q_lora_rank="1536", kv_lora_rank="512", qk_nope_head_dim="128",
                         qk_rope_head_dim="64", v_head_dim="128", head_dim="192", base_num_kv_heads="128",
                         max_position_embeddings="4096", original_max_position_embeddings="4096")),
    # softmax router in the deepseek block, 2 shared experts, MLA without a query latent
    "deepseek-v2-lite": (presets.get("deepseek-v2-lite"),
                         dict(decoder_block="deepseek", shared_experts="2", first_num_dense_layers="1",
                              routed_score_func="softmax", routed_bias="false", q_lora_rank="0")),
    # experts narrower than d_ff and nothing else of DeepSeek's: Qwen3's block
    "qwen3-moe": (presets.get("qwen3-30b-a3b"), dict(decoder_block="qwen3_moe", base_moe_mlp_dim="768")),
}
# what model_keys writes that is no part of a MaxText model yml (trainer/maxtext_yml.py reads neither)
NOT_IN_MODEL_YML = ("attention", "normalize_embedding_logits")


def moe_config(model, ici=None, **kw) -> TrainConfig:
    return TrainConfig(model=model, mesh=MeshConfig(ici=ici or mesh_shape(fsdp=-1)), per_device_batch=1, **kw)


def read_back(cfg: TrainConfig):
    """The exported yml's model keys (as YAML gives them to MaxText) read by trainer/maxtext_yml.py:
    (ModelConfig, the gaps it names)."""
    yaml = pytest.importorskip("yaml")
    from paxsearch.search.export.common import Notes
    from paxsearch.trainer import maxtext_yml

    doc = yaml.safe_load(maxtext.yaml_overrides(cfg, "tpu", 8, run_name="r"))
    names = [k for k, _ in maxtext.model_keys(cfg, "tpu", Notes()) if k not in NOT_IN_MODEL_YML]
    model_doc = {k: doc[k] for k in names}
    return maxtext_yml.from_dict(model_doc), maxtext_yml.gaps(model_doc)


@pytest.mark.parametrize("name", MOE_CASES)
def test_moe_and_mla_keys_read_back_as_the_same_model(name):
    from paxsearch.trainer.config import expert_width

    model, want_keys = MOE_CASES[name]
    k, notes = keys_of(moe_config(model))
    assert {key: k.get(key) for key in want_keys} == want_keys
    back, gaps = read_back(moe_config(model))
    # the same ModelConfig, the expert width spelled out (expert_d_ff 0 means d_ff); MaxText's qwen3_moe block
    # sets base_mlp_dim to the experts' width, and our d_ff is used by no layer of an all-MoE model
    same = dataclasses.replace(model, expert_d_ff=expert_width(model))
    if k["decoder_block"] == "qwen3_moe":
        assert not (model.first_dense_layers or model.n_shared_experts)
        same = dataclasses.replace(same, d_ff=expert_width(model))
    assert back == same
    # every gap the reader names is an approximation the export wrote down
    if any("softmax router" in g for g in gaps):
        assert any(n.startswith("approximated model.router='softmax'") for n in notes), notes
    if any("load-balancing loss is per sequence" in g for g in gaps):
        assert any(n.startswith("approximated model.load_balance_weight=") for n in notes), notes
    assert len(gaps) <= sum(n.startswith("approximated model.") for n in notes)


def test_per_route_load_balance_weight_reads_back_exactly():
    # MaxText counts a token's k routes: its weight is ours / k, and k x it must give ours back
    for weight, k in ((0.001, 6), (0.01, 2), (0.02, 8), (0.003, 7), (0.0, 8)):
        model = dataclasses.replace(presets.get("deepseek-v2-lite"), load_balance_weight=weight, experts_per_token=k)
        assert read_back(moe_config(model))[0].load_balance_weight == weight


def test_moe_approximations_are_visible():
    _, notes = keys_of(moe_config(presets.get("deepseek-v3")))
    assert any(n.startswith("approximated model.router='sigmoid'") and "deepseek3" in n for n in notes), notes
    _, notes = keys_of(moe_config(MOE_CASES["mixtral-capacity"][0]))
    assert any(n.startswith("approximated model.capacity_factor=1.25") and "per sequence" in n for n in notes)
    text = maxtext.yaml_overrides(moe_config(MIXTRAL), "tpu", 8, run_name="r")
    assert "# approximated model.load_balance_weight=0.02" in text  # a comment in the yml itself


def test_dense_export_has_no_moe_or_mla_keys():
    k, _ = keys_of(small())
    moe = ("num_experts", "num_experts_per_tok", "base_moe_mlp_dim", "megablox", "sparse_matmul", "capacity_factor",
           "attention_type", "ici_expert_parallelism", "q_lora_rank")
    assert [key for key in moe if key in k] == []


def test_expert_axis_and_batch():
    # 8 chips: fsdp 2 x expert 4, both batch axes (trainer/mesh.py BATCH_AXES): 3 rows a device -> 24 rows
    cfg = moe_config(MIXTRAL, ici=mesh_shape(fsdp=2, expert=4))
    cfg = dataclasses.replace(cfg, per_device_batch=3)
    k, _ = keys_of(cfg)
    assert (k["ici_expert_parallelism"], k["ici_fsdp_parallelism"], k["dcn_expert_parallelism"]) == ("4", "2", "1")
    assert k["per_device_batch_size"] == "3"  # 24 rows over 8 chips


@pytest.mark.parametrize("fields, message", [
    (dict(moe_every=2, scan_layers=False), r"model.moe_every=2 \(dense and MoE layers interleaved\).*use moe_every=1"),
    (dict(mlp="dense"), r"model.mlp='dense' with a mixture of experts.*always gated.*use mlp='gated'"),
    (dict(block="parallel"), r"model.block='parallel' with a mixture of experts.*use block='sequential'"),
    (dict(n_experts=0, attention_type="mla", head_dim=192, n_kv_heads=None),
     r"model.attention_type='mla' in a dense model.*set model.n_experts > 0 or attention_type='mha'"),
])
def test_moe_fields_without_a_maxtext_key_are_refused_in_one_line(fields, message):
    with pytest.raises(ExportRefused, match=message) as e:
        maxtext.overrides(moe_config(dataclasses.replace(MIXTRAL, **fields)), "tpu", 8)
    assert "\n" not in str(e.value)


def test_moe_command_line_carries_the_keys(tmp_path):
    cfg = moe_config(presets.get("deepseek-v3"))
    text = maxtext.command(cfg, "tpu", 8, run_name="ds")
    for key in ("decoder_block=deepseek", "num_experts=256", "routed_score_func=sigmoid", "attention_type=mla",
                "megablox=false"):
        assert f"  {key} \\" in text
    assert "# approximated model.router='sigmoid'" in text

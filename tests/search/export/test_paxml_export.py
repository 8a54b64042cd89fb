"""The Paxml form of a config (search/export/paxml.py): pure mapping, no Paxml needed."""
from __future__ import annotations

import ast
import dataclasses

import pytest

from paxsearch.search.export import paxml
from paxsearch.search.export.common import ExportRefused
from paxsearch.trainer import presets, remat
from paxsearch.trainer.config import MeshConfig, PipelineConfig, TrainConfig, mesh_shape


def small(**kw) -> TrainConfig:
    model = presets.replace("llama2-7b", n_layers=4, d_model=256, n_heads=4, head_dim=64, d_ff=512, seq_len=256,
                            vocab_size=1024)
    return TrainConfig(**{"model": model, "mesh": MeshConfig(ici=mesh_shape(data=2, fsdp=-1, tensor=2)),
                          "per_device_batch": 2, **kw})


def class_fields(text: str) -> tuple[str, dict[str, str]]:
    """(base class, {field: source of its value}) of the snippet's class, parsed as Python."""
    tree = ast.parse(text)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef))
    return ast.unparse(cls.bases[0]), {n.targets[0].id: ast.unparse(n.value) for n in cls.body
                                       if isinstance(n, ast.Assign)}


def test_fields_and_meshes():
    base, f = class_fields(paxml.snippet(small(remat="minimal"), "tpu", 16))
    assert base == "c4.C4SpmdAdam"
    assert (f["NUM_LAYERS"], f["MODEL_DIMS"], f["HIDDEN_DIMS"], f["NUM_HEADS"], f["DIMS_PER_HEAD"],
            f["VOCAB_SIZE"], f["MAX_SEQ_LEN"]) == ("4", "256", "512", "4", "64", "1024", "256")
    assert f["ICI_MESH_SHAPE"] == "[2, 4, 2]" and f["DCN_MESH_SHAPE"] == "[1, 1, 1]"  # [replica, data, mdl]
    assert f["PERCORE_BATCH_SIZE"] == "1"  # global 16 rows (2 x data 2 x fsdp 4) over 16 devices
    assert f["CHECKPOINT_POLICY"] == "layers.AutodiffCheckpointType.SAVE_DOT_EXCEPT_LOGITS_FFN1"
    assert (f["ACTIVATION_CLS"], f["USE_GATED_ACTIVATION"], f["USE_ROTARY_POSITION_EMB"], f["SEPARATE_EMBEDDING"],
            f["FPROP_DTYPE"]) == ("activations.SiLU", "True", "True", "True", "jnp.bfloat16")
    _, f = class_fields(paxml.snippet(small(per_device_batch=1, mesh=MeshConfig(ici=mesh_shape(fsdp=4, tensor=4))),
                                      "tpu", 16))
    assert f["PERCORE_BATCH_SIZE"] == "0.25"  # Paxml takes fractional per-core batches


def test_pipeline_class():
    cfg = small(mesh=MeshConfig(ici=mesh_shape(stage=2, fsdp=-1)),
                pipeline=PipelineConfig(microbatches=4, repeats=2, schedule="circular"))
    base, f = class_fields(paxml.snippet(cfg, "tpu", 8))
    assert base == "c4.C4SpmdPipelineAdam"
    assert (f["NUM_STAGES"], f["CIRCULAR_REPEAT"], f["NUM_MICROBATCHES"], f["ICI_MESH_SHAPE"]) == \
        ("2", "2", "4", "[2, 1, 4, 1]")


@pytest.mark.parametrize("policy, member", [
    ("full", "SAVE_NOTHING"), ("none", "SAVE_EVERYTHING"), ("qkv_proj", "SAVE_QKV_OUT_PROJ"),
    (remat.custom(decoder_input="device"), "SAVE_ITERATION_INPUT"),
    (remat.custom(context="device", out_proj="device"), "SAVE_CONTEXT_AND_OUT_PROJ"),
])
def test_checkpoint_policies(policy, member):
    _, f = class_fields(paxml.snippet(small(remat=policy), "tpu", 16))
    assert f["CHECKPOINT_POLICY"] == f"layers.AutodiffCheckpointType.{member}"


def test_refusals_and_visible_drops():
    with pytest.raises(ExportRefused, match=r"n_kv_heads=2 .*--to maxtext"):
        paxml.snippet(small(model=dataclasses.replace(small().model, n_kv_heads=2)), "tpu", 16)
    with pytest.raises(ExportRefused, match="block='parallel'"):
        paxml.snippet(small(model=dataclasses.replace(small().model, block="parallel")), "tpu", 16)
    with pytest.raises(ExportRefused, match="context"):
        paxml.snippet(small(mesh=MeshConfig(ici=mesh_shape(fsdp=4, context=2))), "tpu", 8)
    with pytest.raises(ExportRefused, match="saves mlp2, query_proj"):
        paxml.snippet(small(remat=remat.custom(query_proj="device", mlp2="device")), "tpu", 16)
    text = paxml.snippet(small(remat="offload", offload_params=True, grad_accum_steps=2, global_batch=32,
                               per_device_batch=None), "tpu", 16)
    assert "# approximated remat='offload'" in text and "# dropped offload_params" in text
    assert "# dropped grad_accum_steps=2" in text
    assert class_fields(text)[1]["CHECKPOINT_POLICY"].endswith("SAVE_DOT_EXCEPT_LOGITS_FFN1")


def test_an_int8_config_says_its_quantization_is_dropped():
    text = paxml.snippet(small(model=dataclasses.replace(small().model, quantization="int8")), "tpu", 16)
    assert "# dropped model.quantization='int8'" in text
    assert "quantization" not in paxml.snippet(small(), "tpu", 16)


@pytest.mark.parametrize("model, message", [
    # a mixture of experts, softmax top-2 dropless (Mixtral's routing), shrunk
    (presets.replace("mixtral-8x7b", n_layers=2, d_model=256, n_heads=4, n_kv_heads=None, head_dim=64, d_ff=512,
                     seq_len=256, vocab_size=1024),
     r"^model.n_experts=8 \(a mixture of experts\) has no exact Paxml form .*; export with --to maxtext$"),
    # DeepSeek-V2-Lite: MoE and MLA; the MoE is named first
    (presets.get("deepseek-v2-lite"), r"^model.n_experts=64 .*--to maxtext$"),
    # MLA in a dense model
    (dataclasses.replace(presets.get("deepseek-v2-lite"), n_experts=0),
     r"^model.attention_type='mla' .*; export with --to maxtext, or search attention_type='mha'$"),
])
def test_moe_and_mla_are_refused_not_exported_dense(model, message):
    """Neither is written as a dense Llama-style class: one line naming the field and --to maxtext."""
    with pytest.raises(ExportRefused, match=message) as e:
        paxml.snippet(small(model=model, mesh=MeshConfig(ici=mesh_shape(fsdp=-1))), "tpu", 16)
    assert "\n" not in str(e.value)

"""A MaxText model yml as a preset (trainer/maxtext_yml.py, `--set model=maxtext:PATH.yml`)."""
from __future__ import annotations

import dataclasses

import pytest

from paxsearch.trainer import maxtext_yml, presets
from paxsearch.trainer.errors import ConfigError

# MaxText's configs/models/llama3-8b.yml, in its format (comments, quoted strings, 500_000)
LLAMA3_8B = """# model config for llama3-8b

base_emb_dim: 4096
base_num_query_heads: 32
base_num_kv_heads: 8
base_num_decoder_layers: 32
base_mlp_dim: 14336
head_dim: 128
mlp_activations: ["silu","linear"]
vocab_size: 128256
enable_dropout: False
logits_via_embedding: False
normalization_layer_epsilon: 1.0e-5
rope_max_timescale: 500_000
decoder_block: "llama2" # Uses the same decoder block as llama2
"""


@pytest.fixture
def yml(tmp_path):
    def write(text: str, name: str = "m.yml") -> str:
        path = tmp_path / name
        path.write_text(text)
        return str(path)
    return write


def test_llama3_8b_yml_is_the_preset(yml):
    cfg = presets.get("maxtext:" + yml(LLAMA3_8B))
    # the yml leaves max_target_length to base.yml (2048); everything else is the published model
    assert cfg == dataclasses.replace(presets.get("llama3-8b"), seq_len=2048)
    with_len = presets.get("maxtext:" + yml(LLAMA3_8B + "max_target_length: 8192\n", "l.yml"))
    assert with_len == presets.get("llama3-8b")


def test_parallel_dense_block(yml):
    cfg = maxtext_yml.load(yml("base_emb_dim: 64\nbase_num_query_heads: 2\nbase_num_decoder_layers: 2\n"
                               "base_mlp_dim: 128\nhead_dim: 32\nmlp_activations: [relu]\ndecoder_block: default\n"
                               "logits_via_embedding: true\nvocab_size: 512\nmax_target_length: 64\n"))
    assert (cfg.block, cfg.mlp, cfg.activation, cfg.tie_embeddings, cfg.n_kv_heads, cfg.rope_theta) == \
        ("parallel", "dense", "relu", True, None, 10_000.0)


@pytest.mark.parametrize("extra, message", [
    ('decoder_block: "gpt3"\n', "decoder_block 'gpt3' has no paxsearch equivalent"),
    ("fused_qkv: true\n", "fused_qkv have no paxsearch equivalent"),
    ("num_experts: 8\n", "mixture of experts"),
    ("enable_dropout: true\n", "dropout"),
    ("base_num_kv_heads: 5\n", "does not divide"),
    ("!!python/object/apply:os.system ['true']\n", "not plain YAML data"),
])
def test_refused_in_one_line(yml, extra, message):
    text = LLAMA3_8B.replace('decoder_block: "llama2"', "") if "decoder_block" in extra else LLAMA3_8B
    text = text.replace("base_num_kv_heads: 8\n", "") if "kv_heads" in extra else text
    with pytest.raises(ConfigError, match=message) as e:
        presets.get("maxtext:" + yml(text + extra if "python" not in extra else extra))
    assert "\n" not in str(e.value)


def test_missing_file_and_set_override(yml, tmp_path):
    with pytest.raises(ConfigError, match="cannot read MaxText yml"):
        presets.get(f"maxtext:{tmp_path}/none.yml")
    from paxsearch.search.study import configio
    from paxsearch.trainer.config import TrainConfig

    cfg = configio.apply_overrides(configio.to_fiddle(TrainConfig()), [f"model=maxtext:{yml(LLAMA3_8B)}",
                                                                       "model.n_layers=2"])
    built = configio.build(cfg)
    assert (built.model.d_model, built.model.n_kv_heads, built.model.n_layers) == (4096, 8, 2)


def test_import_then_export_gives_the_yml_keys(yml):
    """The yml's model keys come back from the MaxText export of the imported model."""
    import yaml

    from paxsearch.search.export import maxtext
    from paxsearch.trainer.config import MeshConfig, TrainConfig

    cfg = TrainConfig(model=presets.get("maxtext:" + yml(LLAMA3_8B)), mesh=MeshConfig(ici=(1, -1, 1)))
    keys = dict(maxtext.overrides(cfg, "tpu", 8)[0])
    for key, value in yaml.safe_load(LLAMA3_8B).items():
        if key in ("normalization_layer_epsilon",):
            continue
        if key == "mlp_activations":
            assert keys[key] == "[" + ",".join(value) + "]"
        elif isinstance(value, bool):
            assert keys[key] == str(value).lower()
        else:
            assert keys[key] == str(value), key


# MaxText's MoE and MLA model ymls, their keys and values as published (license headers left out):
# AI-Hypercomputer/maxtext src/MaxText/configs/models/mixtral-8x7b.yml@48445cf00e73064e87886539714a8ba1794ee019
MIXTRAL_8X7B = """# model config for mixtral-8x7b
base_emb_dim: 4096
base_num_query_heads: 32
base_num_kv_heads: 8
base_mlp_dim: 14336
base_moe_mlp_dim: 14336
base_num_decoder_layers: 32
head_dim: 128
mlp_activations: ["silu","linear"]
vocab_size: 32000
enable_dropout: False
logits_via_embedding: False
normalization_layer_epsilon: 1.0e-5
num_experts: 8
num_experts_per_tok: 2
rope_max_timescale: 1_000_000
decoder_block: "mixtral"
"""
# src/MaxText/configs/models/deepseek3-671b.yml@ac708cd5871662a275860b627645dbb3ae7166e2
DEEPSEEK3_671B = """# model config for DeepSeek V3 - 671B
base_emb_dim: 7168
base_num_query_heads: 128
base_num_kv_heads: 128
base_mlp_dim: 18432
base_moe_mlp_dim: 2048
base_num_decoder_layers: 61
first_num_dense_layers: 3
mlp_activations: ["silu","linear"]
vocab_size: 129280
enable_dropout: False
logits_via_embedding: False
normalization_layer_epsilon: 1.0e-6
num_experts: 256
num_experts_per_tok: 8
shared_experts: 1
routed_scaling_factor: 2.5
routed_score_func: "sigmoid"
routed_bias: True
decoder_block: "deepseek"
# MLA
attention_type: "mla"
q_lora_rank: 1536
kv_lora_rank: 512
qk_nope_head_dim: 128
qk_rope_head_dim: 64
v_head_dim: 128
mscale: 1.0
# RoPE
rope_type: "yarn"
rope_max_timescale: 10_000 # DeepSeek uses  "rope_theta": 10000
max_position_embeddings: 163840
original_max_position_embeddings: 4096
rope_factor: 40
beta_fast: 32
rope_interleave: True
rope_truncate: True
rope_attention_scaling: False
"""
# src/MaxText/configs/models/qwen3-30b-a3b.yml@6710342780303d1a45872f5a8eb1bc3855321707
QWEN3_30B_A3B = """# Model config for Qwen3-30B-A3B
decoder_block: "qwen3_moe"
base_emb_dim: 2048
base_mlp_dim: 768
base_num_query_heads: 32
base_num_kv_heads: 4
base_num_decoder_layers: 48
head_dim: 128
mlp_activations: ["silu", "linear"]
vocab_size: 151936
normalization_layer_epsilon: 1.0e-6
use_qk_norm: True

# MoE Specific Parameters
num_experts: 128
num_experts_per_tok: 8
base_moe_mlp_dim: 768
norm_topk_prob: true

# RoPE Settings
rope_max_timescale: 10_000_000

# General Model Settings
enable_dropout: False
"""
# src/MaxText/configs/models/deepseek2-16b.yml@48445cf00e73064e87886539714a8ba1794ee019
DEEPSEEK2_16B = """base_emb_dim: 2048
base_num_query_heads: 16
base_num_kv_heads: 16
base_mlp_dim: 10944
base_moe_mlp_dim: 1408
base_num_decoder_layers: 27
first_num_dense_layers: 1
mlp_activations: ["silu","linear"]
vocab_size: 102400
enable_dropout: False
logits_via_embedding: False
normalization_layer_epsilon: 1.0e-6
num_experts: 64
num_experts_per_tok: 6
shared_experts: 2
routed_scaling_factor: 1.0
routed_score_func: "softmax"
routed_bias: False
decoder_block: "deepseek"
attention_type: "mla"
q_lora_rank: 0
kv_lora_rank: 512
qk_nope_head_dim: 128
qk_rope_head_dim: 64
v_head_dim: 128
rope_type: "yarn"
rope_max_timescale: 10_000 # DeepSeek uses  "rope_theta": 10000
max_position_embeddings: 163840
original_max_position_embeddings: 4096
rope_factor: 40
beta_fast: 32
mscale: 0.707
rope_interleave: True
rope_truncate: True
rope_attention_scaling: False
"""


def _read(text):
    import yaml

    return maxtext_yml.from_dict(yaml.safe_load(text))


# (yml, preset, the fields where the yml's model differs from the preset, and why). Every yml leaves
# max_target_length to base.yml (2048; the presets train at 4096) and load_balance_loss_weight to
# base.yml's 0 (the presets take the HF router_aux_loss_coef).
MOE_YMLS = {
    # expert_d_ff: MaxText names the experts' width (base_moe_mlp_dim 14336), the preset leaves it at d_ff
    "mixtral-8x7b": (MIXTRAL_8X7B, dict(seq_len=2048, load_balance_weight=0.0, expert_d_ff=14336)),
    # the same model (load_balance_weight 0 in the preset too: DeepSeek V3 balances without the loss)
    "deepseek-v3": (DEEPSEEK3_671B, dict(seq_len=2048)),
    # MaxText's yml says rope_max_timescale 10_000_000 where the HF config.json has rope_theta 1000000;
    # d_ff: MaxText sets base_mlp_dim to base_moe_mlp_dim (768) for qwen3_moe, the preset keeps HF's unused
    # intermediate_size 6144 (no dense layer: neither is a parameter)
    "qwen3-30b-a3b": (QWEN3_30B_A3B, dict(seq_len=2048, load_balance_weight=0.0, rope_theta=10_000_000.0, d_ff=768)),
    "deepseek-v2-lite": (DEEPSEEK2_16B, dict(seq_len=2048, load_balance_weight=0.0)),
}


@pytest.mark.parametrize("name", sorted(MOE_YMLS))
def test_moe_and_mla_ymls_are_the_presets(name):
    from paxsearch.trainer import flops

    text, differences = MOE_YMLS[name]
    cfg, preset = _read(text), presets.get(name)
    assert flops.param_count(cfg) == flops.param_count(preset)
    assert flops.param_count(cfg, active=True) == flops.param_count(preset, active=True)
    assert {k: getattr(cfg, k) for k in differences} == differences
    assert cfg == dataclasses.replace(preset, **{k: getattr(cfg, k) for k in differences})


def test_deepseek3_yml_maps_mla_and_routing_and_names_its_gaps(yml):
    cfg = _read(DEEPSEEK3_671B)
    assert (cfg.attention_type, cfg.head_dim, cfg.q_lora_rank, cfg.v_head_dim, cfg.n_kv_heads) == ("mla", 192, 1536,
                                                                                                    128, None)
    assert (cfg.router, cfg.n_shared_experts, cfg.first_dense_layers, cfg.expert_compute) == ("sigmoid", 1, 3,
                                                                                              "dropless")
    with pytest.warns(UserWarning) as record:
        presets.get("maxtext:" + yml(DEEPSEEK3_671B + "n_routing_groups: 8\ntopk_routing_group: 4\n"))
    (message,) = [str(w.message) for w in record]
    assert "\n" not in message
    for gap in ("rope_type yarn", "mscale 1.0", "rope_interleave", "group-limited routing (n_routing_groups 8",
                "routed_scaling_factor 2.5", "routed_bias_update_rate 0.0 (MaxText's routing bias gets no"):
        assert gap in message
    assert "use_qk_norm" not in message and "softmax router" not in message
    qwen_gaps = maxtext_yml.gaps(__import__("yaml").safe_load(QWEN3_30B_A3B))
    assert [g.split(" ")[0] for g in qwen_gaps] == ["use_qk_norm"]
    assert any("unnormalized" in g for g in maxtext_yml.gaps(__import__("yaml").safe_load(DEEPSEEK2_16B)))


@pytest.mark.parametrize("extra, expected", [
    ("", dict(expert_compute="dropless", load_balance_weight=0.0)),
    ("capacity_factor: 1.5\n", dict(expert_compute="dropless")),  # sparse_matmul (base.yml) never drops
    ("sparse_matmul: false\ncapacity_factor: 1.5\n", dict(expert_compute="capacity", capacity_factor=1.5)),
    ("sparse_matmul: false\nmegablox: false\n", dict(expert_compute="dropless")),  # capacity_factor -1: no drops
    ("load_balance_loss_weight: 0.01\n", dict(load_balance_weight=0.02)),  # x num_experts_per_tok 2
])
def test_moe_compute_keys(extra, expected):
    cfg = _read(MIXTRAL_8X7B + extra)
    assert {k: getattr(cfg, k) for k in expected} == expected


@pytest.mark.parametrize("text, extra, message", [
    (MIXTRAL_8X7B, "interleave_moe_layer_step: 2\n", "interleave_moe_layer_step have no paxsearch equivalent"),
    (MIXTRAL_8X7B, "attention_type: local_sliding\n", "attention_type 'local_sliding' has no paxsearch equivalent"),
    (MIXTRAL_8X7B, "attention_type: mla\n", "mla .* deepseek only"),
    (MIXTRAL_8X7B, "rope_type: linear\n", "rope_type 'linear' has no paxsearch equivalent"),
    (MIXTRAL_8X7B, "shared_experts: 1\n", "decoder_block mixtral builds neither"),
    (MIXTRAL_8X7B, "routed_score_func: sigmoid\n", "no paxsearch router"),
    (MIXTRAL_8X7B.replace("base_moe_mlp_dim: 14336", "base_moe_mlp_dim: 4096"), "", "requires base_moe_mlp_dim"),
    (MIXTRAL_8X7B.replace("num_experts: 8", "num_experts: 1"), "", "needs num_experts > 1"),
    (MIXTRAL_8X7B, "num_experts_per_tok: 9\n", "exceeds num_experts 8"),
    (DEEPSEEK3_671B.replace("routed_bias: True", "routed_bias: False"), "", "sigmoid' with routed_bias False"),
    (DEEPSEEK3_671B.replace("routed_score_func: \"sigmoid\"", "routed_score_func: \"\""), "", "no paxsearch router"),
    (DEEPSEEK3_671B.replace("base_num_kv_heads: 128", "base_num_kv_heads: 8"), "", "base_num_kv_heads must be"),
    (DEEPSEEK3_671B.replace("qk_rope_head_dim: 64", "qk_rope_head_dim: 63"), "", "qk_rope_head_dim must be even"),
    (QWEN3_30B_A3B.replace("base_moe_mlp_dim: 768\n", ""), "", "base_moe_mlp_dim -1"),
    (LLAMA3_8B, "shared_experts: 2\n", "without a mixture of experts"),
    # MaxText's routed experts are gated, its shared experts and dense layers follow mlp_activations
    (DEEPSEEK3_671B.replace('["silu","linear"]', "[silu]"), "", r"mlp_activations \['silu'\] with shared_experts 1 / "
     r"first_num_dense_layers 3: .*always gated .*; use mlp_activations \[silu, linear\]"),
    (DEEPSEEK3_671B, "routed_bias_update_rate: -0.001\n", "routed_bias_update_rate -0.001 must be >= 0"),
])
def test_moe_and_mla_refusals_in_one_line(text, extra, message):
    import yaml

    with pytest.raises(ConfigError, match=message) as e:
        maxtext_yml.from_dict(yaml.safe_load(text + extra))
    assert "\n" not in str(e.value)


def test_single_activation_moe_is_read_as_maxtexts_gated_experts():
    """MaxText's RoutedMoE builds wi_0 and wi_1 for every expert whatever mlp_activations says (the
    first activation gates): a MoE yml with [silu] and no dense MLP is the [silu, linear] model."""
    gated = _read(MIXTRAL_8X7B)
    single = _read(MIXTRAL_8X7B.replace('["silu","linear"]', "[silu]"))
    assert (single.mlp, single.activation) == ("gated", "silu") and single == gated
    qwen = _read(QWEN3_30B_A3B.replace('["silu", "linear"]', "[gelu]"))
    assert (qwen.mlp, qwen.activation) == ("gated", "gelu")
    # a dense model keeps the single activation's dense MLP
    assert _read(LLAMA3_8B.replace('["silu","linear"]', "[relu]")).mlp == "dense"


@pytest.mark.parametrize("rate, words", [("0.001", "MaxText adds 0.001 x sign(mean load - load)"),
                                         ("0.0", "gets no load-balancing update")])
def test_routed_bias_update_rate_is_read_and_named_as_a_gap(yml, rate, words):
    """DeepSeek's aux-loss-free bias update: MaxText's fixed-step rule has no knob here (the optimizer
    moves our bias), so the key is accepted and named in the gaps, not refused or ignored."""
    import yaml

    text = DEEPSEEK3_671B + f"routed_bias_update_rate: {rate}\n"
    (gap,) = [g for g in maxtext_yml.gaps(yaml.safe_load(text)) if g.startswith("routed_bias_update_rate")]
    assert words in gap and "optimizer moves the bias" in gap
    with pytest.warns(UserWarning, match=f"routed_bias_update_rate {rate}"):
        assert maxtext_yml.load(yml(text)) == _read(DEEPSEEK3_671B)
    # no routing bias: MaxText applies no update whatever the rate, and no gap is named
    no_bias = DEEPSEEK2_16B + f"routed_bias_update_rate: {rate}\n"
    assert not [g for g in maxtext_yml.gaps(yaml.safe_load(no_bias)) if "routed_bias" in g]

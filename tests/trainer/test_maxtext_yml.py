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

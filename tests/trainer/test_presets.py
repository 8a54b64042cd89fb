"""Model presets: parameter counts of the real Flax model against the published figures, and
`model=<preset>` on the command line and in space files."""
from __future__ import annotations

import dataclasses
import math
import os
import textwrap

import jax
import pytest

from paxsearch.search.study import configio
from paxsearch.search.study.space import SpaceError, load_space
from paxsearch.trainer import presets
from paxsearch.trainer.config import DataConfig, ModelConfig, TrainConfig
from paxsearch.trainer.errors import ConfigError
from paxsearch.trainer.step import init_state, make_model, make_optimizer

from ..search_util import REPO, cli, load, needs_libtpu

MESH_SWEEP = os.path.join(REPO, "spaces", "mesh_sweep.py")


def model_param_count(model: ModelConfig) -> int:
    """Parameters of the trainer's own model, from jax.eval_shape of its init (shapes only)."""
    cfg = TrainConfig(model=model)
    state = jax.eval_shape(lambda: init_state(cfg, make_model(cfg), make_optimizer(cfg.optimizer, 10),
                                              jax.random.key(0)))
    return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(state["params"]))


def hand_count(m: ModelConfig) -> int:
    """The same count by hand from the dimensions: pre-norm blocks (2 RMSNorm scales, 1 when parallel), Q/O with
    n_heads and K/V with n_kv_heads (or multi-head latent attention's latents, their norms and up-projections),
    2 or 3 MLP matrices, embeddings (and the unembedding unless
    tied), learned positions, the final norm."""
    kv = m.n_kv_heads or m.n_heads
    attention = m.d_model * m.head_dim * (2 * m.n_heads + 2 * kv)
    if m.attention_type == "mla":  # latent attention: query latent (or one projection), kv latent + rope key, output
        qk, h = m.qk_nope_head_dim + m.qk_rope_head_dim, m.n_heads
        q = m.q_lora_rank * (m.d_model + 1 + h * qk) if m.q_lora_rank else m.d_model * h * qk
        kv_latent = m.d_model * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank
        attention = q + kv_latent + m.kv_lora_rank * h * (m.qk_nope_head_dim + m.v_head_dim) + h * m.v_head_dim * \
            m.d_model
    matrices = 3 if m.mlp == "gated" else 2
    mlp = matrices * m.d_model * m.d_ff
    norms = (1 if m.block == "parallel" else 2) * m.d_model  # norm scales
    embeddings = m.vocab_size * m.d_model * (1 if m.tie_embeddings else 2)
    positions = m.seq_len * m.d_model if m.position == "learned" else 0
    if m.n_experts:  # a mixture of experts: MoE layers after the leading dense ones (moe_every 1 in the presets)
        assert m.moe_every == 1
        experts = (m.n_experts + m.n_shared_experts) * matrices * m.d_model * (m.expert_d_ff or m.d_ff)
        router = m.d_model * m.n_experts + (m.n_experts if m.router == "sigmoid" else 0)
        moe_layers = m.n_layers - m.first_dense_layers
        return (m.first_dense_layers * (attention + mlp + norms) + moe_layers * (attention + experts + router + norms)
                + embeddings + positions + m.d_model)
    return m.n_layers * (attention + mlp + norms) + embeddings + positions + m.d_model


@pytest.mark.parametrize("name", presets.names())
def test_preset_parameter_count_matches_its_published_figure(name):
    p = presets.source(name)
    count = model_param_count(presets.get(name))
    assert count == hand_count(p.model), (name, count, hand_count(p.model))
    deviation = count / p.published_params - 1
    if p.exact:  # an exact published count: within 1%
        assert abs(deviation) <= 0.01, f"{name}: {count:,} vs published {p.published_params:,} ({deviation:+.2%})"
    else:  # a nominal label only ("16B"): the stated deviation is the true one, and the note says why
        assert abs(deviation - p.deviation) < 0.001, f"{name}: {deviation:+.2%}, the preset states {p.deviation:+.1%}"
        assert f"{p.deviation:+.1%}" in p.note and "no exact count" in p.note, p.note


def test_llama_presets_are_exact_to_the_parameter():
    """Where the published count is exact and the architecture is the same, the count is too."""
    for name in ("llama2-7b", "llama3-8b", "llama2-70b", "llama-tiny"):
        assert model_param_count(presets.get(name)) == presets.source(name).published_params, name


def test_llama_tiny_is_a_small_llama_and_says_it_is_not_published():
    """Llama's architecture (RMSNorm, SwiGLU, RoPE, GQA, untied embeddings) at a size a CPU trains;
    its byte-level synthetic data fits its vocabulary."""
    from paxsearch.trainer.data import data_vocab_size  # seqio: imported by the test that needs it

    p = presets.source("llama-tiny")
    m = p.model
    assert (m.mlp, m.activation, m.position, m.block, m.tie_embeddings) == ("gated", "silu", "rope", "sequential",
                                                                             False)
    assert 1 < m.kv_heads < m.n_heads and m.n_heads % m.kv_heads == 0  # grouped-query attention
    assert m.d_ff % 256 == 0 and m.d_ff >= 8 * m.d_model // 3  # Llama's SwiGLU width rule
    assert m.vocab_size >= data_vocab_size(DataConfig())
    assert p.published_params < 5_000_000 and p.exact
    assert "Not a published model" in p.note and "not a published model" in p.published_source
    names = presets.names()
    assert names.index("llama-tiny") == names.index("llama3-8b") + 1


def test_presets_have_sources_and_the_listed_names():
    assert {"llama2-7b", "llama3-8b", "llama-tiny", "llama2-70b", "gpt3-xl", "paxml-c4-1b", "paxml-c4-16b",
            "maxtext-v5e-16b", "maxtext-v5e-32b", "maxtext-v5e-64b", "maxtext-v5e-128b",
            "maxtext-v4-22b"} <= set(presets.names())
    table = presets.table()
    for name in presets.names():
        p = presets.source(name)
        assert p.source and p.published_source and p.published_params > 0
        assert p.model.dtype == "bfloat16" and p.model.param_dtype == "float32"
        assert f"| {name} |" in table


MAXTEXT_2023_DIMS = {  # name: (d_model, n_layers, n_heads, d_ff, seq_len), from the config scripts
    "maxtext-v5e-16b": (5120, 32, 32, 32768, 2048),  # global_parameter_scale 16 on base 2560/16/8/8192
    "maxtext-v5e-32b": (10240, 32, 32, 32768, 2048),  # scale 32
    "maxtext-v5e-64b": (10240, 64, 32, 32768, 2048),  # scale 64
    "maxtext-v5e-128b": (10240, 64, 64, 65536, 2048),  # scale 128
    "maxtext-v4-22b": (6144, 48, 24, 24576, 1024),  # scale=3 (x3 every base dim) on base 2048/16/8/8192
}


def _maxtext_2023_scale(scale: int) -> tuple[int, int, int, int]:
    """MaxText/pyconfig.py get_individual_scales (2023-10..12): doublings rotate over
    (heads and mlp), embed, layers; the returned dims are on base 2560 / 16 layers / 8 heads / 8192."""
    log2 = scale.bit_length() - 1
    base, rem = divmod(log2, 3)
    heads = base + int(rem > 0)
    emb = base + int(rem > 1)
    return 2560 * 2 ** emb, 16 * 2 ** base, 8 * 2 ** heads, 8192 * 2 ** heads


@pytest.mark.parametrize("name", sorted(MAXTEXT_2023_DIMS))
def test_maxtext_2023_presets_have_the_config_dims_and_architecture(name):
    """Parallel blocks (MaxText's DecoderLayer), non-gated ReLU MLP, multi-head attention of 256-wide heads,
    RoPE, tied embeddings, vocab 32768."""
    m = presets.get(name)
    assert (m.d_model, m.n_layers, m.n_heads, m.d_ff, m.seq_len) == MAXTEXT_2023_DIMS[name]
    assert (m.mlp, m.block, m.activation, m.position, m.tie_embeddings, m.vocab_size, m.head_dim) == (
        "dense", "parallel", "relu", "rope", True, 32768, 256)
    assert m.n_kv_heads is None and m.kv_heads == m.n_heads
    if name.startswith("maxtext-v5e-"):
        scale = int(name.split("-")[-1].rstrip("b"))
        assert _maxtext_2023_scale(scale) == (m.d_model, m.n_layers, m.n_heads, m.d_ff)
        assert f"global_parameter_scale={scale}" in presets.source(name).source
    else:  # April 2023: `scale` multiplied every base dim (2048 / 16 / 8 / 8192)
        assert (m.d_model, m.n_layers, m.n_heads, m.d_ff) == (3 * 2048, 3 * 16, 3 * 8, 3 * 8192)


def test_unknown_preset_is_one_line_listing_the_names():
    with pytest.raises(ConfigError) as e:
        presets.get("llama9-1t")
    message = str(e.value)
    assert "\n" not in message and "llama9-1t" in message
    assert all(name in message for name in presets.names())
    with pytest.raises(ConfigError, match="unknown ModelConfig field"):
        presets.replace("llama3-8b", layers=2)


def test_set_model_preset_replaces_the_model_and_later_fields_override_it():
    """The `paxsearch train FILE --set` path (configio.apply_overrides)."""
    base = configio.to_fiddle(TrainConfig())
    cfg = configio.build(configio.apply_overrides(base, ["model=llama3-8b", "model.seq_len=256", "steps=3"]))
    assert cfg.model == dataclasses.replace(presets.get("llama3-8b"), seq_len=256)
    assert cfg.steps == 3
    # a field set before the preset is replaced with the rest of the model
    cfg = configio.build(configio.apply_overrides(base, ["model.seq_len=256", "model=gpt3-xl"]))
    assert cfg.model == presets.get("gpt3-xl")
    with pytest.raises(configio.ConfigFileError, match="unknown model preset 'gpt5'"):
        configio.apply_overrides(base, ["model=gpt5"])


def test_set_model_preset_in_a_space_applies_to_every_trial():
    space = load_space(MESH_SWEEP)
    space.apply_sets(["model=llama2-7b", "model.n_layers=2"])
    expected = dataclasses.replace(presets.get("llama2-7b"), n_layers=2)
    points = list(space.points())
    for point in (points[0], points[-1]):
        assert configio.build(space.config(point)).model == expected
    with pytest.raises(SpaceError, match="unknown model preset 'llama2-7'"):
        load_space(MESH_SWEEP).apply_sets(["model=llama2-7"])


def test_preset_as_a_decision_in_a_space_file(tmp_path):
    path = tmp_path / "presets_space.py"
    path.write_text(textwrap.dedent("""
        import fiddle as fdl
        import pyglove as pg
        from paxsearch.search.study.space import preset
        from paxsearch.trainer.config import TrainConfig

        def space():
            return fdl.Config(TrainConfig, model=preset(pg.oneof(["gpt3-xl", "llama3-8b"], name="model"),
                                                        seq_len=512))
    """))
    space = load_space(str(path))
    assert [d.describe() for d in space.decisions] == ["model: one of gpt3-xl, llama3-8b"]
    for name in ("gpt3-xl", "llama3-8b"):
        model = configio.build(space.config({"model": name})).model
        assert model == dataclasses.replace(presets.get(name), seq_len=512)
    space.apply_sets(["model=llama3-8b"])  # --set fixes the decision
    assert space.fixed == {"model": "llama3-8b"} and space.size() == 1


def test_cli_run_dry_run_with_a_model_preset():
    proc = cli("run", MESH_SWEEP, "--dry-run", "--set", "model=llama3-8b", "--set", "model.seq_len=256",
               timeout=300)
    assert "config overrides: model=llama3-8b, model.seq_len=256" in proc.stdout
    assert "pass the static checks" in proc.stdout


def test_cli_unknown_preset_is_one_line_and_a_nonzero_exit(tmp_path):
    proc = cli("run", MESH_SWEEP, "--dry-run", "--set", "model=llama5", check=False, timeout=300)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown model preset 'llama5'" in lines[0] and "llama3-8b" in lines[0], proc.stderr
    config = tmp_path / "config.py"
    config.write_text("from paxsearch.trainer.config import TrainConfig\n\ndef config():\n    return TrainConfig()\n")
    proc = cli("train", config, "--set", "model=llama5", "--run-dir", tmp_path / "run", check=False, timeout=300)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown model preset 'llama5'" in lines[0], proc.stderr


LLAMA_PLAN = os.path.join(REPO, "spaces", "llama_plan.py")


def test_llama_plan_space_is_the_llama3_preset_over_layouts():
    space = load_space(LLAMA_PLAN)
    assert [d.name for d in space.decisions] == ["mesh", "attention", "quantization", "rules", "per_device_batch",
                                                 "remat"]
    assert space.settings.target.startswith("tpu:") and space.size() == 96
    point = {"mesh": "1x8x8", "attention": "dot_product", "quantization": "int8", "rules": "sequence_parallel",
             "per_device_batch": 2, "remat": "minimal"}
    cfg = configio.build(space.config(point))
    assert cfg.model == dataclasses.replace(presets.get("llama3-8b"), attention="dot_product", quantization="int8")
    assert cfg.mesh.ici == (1, 8, 8) and cfg.mesh.rules == "sequence_parallel"
    assert cfg.per_device_batch == 2 and cfg.remat == "minimal"


@pytest.mark.slow
@needs_libtpu
def test_llama_plan_compiles_one_point_for_the_tpu_slice(tmp_path):
    """One real compile of Llama 3 8B with the splash kernel for v5e-64 (~6 minutes on 2 cores)."""
    run = tmp_path / "llama_plan"
    cli("run", LLAMA_PLAN, "--trials", "1", "--run-dir", run, "--no-progress", "--set", "mesh=1x64x1",
        "--set", "attention=flash", "--set", "rules=default", "--set", "per_device_batch=1", "--set", "remat=full",
        "--set", "quantization=none", timeout=1800)
    study = load(run, "llama_plan")
    (trial,) = study.trials
    plan = trial.user_attrs["plan"]
    assert trial.user_attrs.get("failure_kind") is None, trial.user_attrs.get("failure_message")
    assert plan["plan_only"] and plan["fits"] and plan["param_count"] == presets.source("llama3-8b").published_params
    assert 0 < plan["peak_bytes"] <= plan["hbm_bytes"]


# MaxText's configs/models/llama3.1-*.yml @ tpu-recipes-v0.1.4 (the model keys, as data)
LLAMA31_MAXTEXT_YML = {
    "llama3.1-8b": dict(base_emb_dim=4096, base_num_query_heads=32, base_num_kv_heads=8, base_num_decoder_layers=32,
                        base_mlp_dim=14336),
    "llama3.1-70b": dict(base_emb_dim=8192, base_num_query_heads=64, base_num_kv_heads=8, base_num_decoder_layers=80,
                         base_mlp_dim=28672),
    "llama3.1-405b": dict(base_emb_dim=16384, base_num_query_heads=128, base_num_kv_heads=8,
                          base_num_decoder_layers=126, base_mlp_dim=53248),
}


@pytest.mark.parametrize("name", sorted(LLAMA31_MAXTEXT_YML))
def test_llama31_presets_are_exact_and_match_maxtexts_model_yml(name):
    """The count of the real model equals the published one to the parameter; the dims are those of
    MaxText's own yml for the model, read through trainer/maxtext_yml.py; the RoPE-scaling gap is named."""
    from paxsearch.trainer import maxtext_yml

    p = presets.source(name)
    assert model_param_count(p.model) == p.published_params
    doc = dict(LLAMA31_MAXTEXT_YML[name], head_dim=128, mlp_activations=["silu", "linear"], vocab_size=128256,
               enable_dropout=False, logits_via_embedding=False, normalization_layer_epsilon=1.0e-5,
               rope_max_timescale=500_000, decoder_block="llama2", max_target_length=8192)
    assert maxtext_yml.from_dict(doc) == p.model
    assert p.model.seq_len == 8192 and p.model.rope_theta == 500_000.0 and not p.model.tie_embeddings
    assert "rope_scaling" in p.note and "factor 8" in p.note and "FLOPs" in p.note
    assert "max_target_length 8192" in p.source


def test_llama31_8b_is_llama3_8b_with_the_same_count():
    assert presets.get("llama3.1-8b") == presets.get("llama3-8b")
    assert presets.source("llama3.1-8b").published_params == presets.source("llama3-8b").published_params

"""Named ModelConfigs of models people train, each with where its dimensions and its
published parameter count come from.

    from paxsearch.trainer import presets
    cfg = presets.get("llama3-8b")           # a ModelConfig
    presets.names()                          # ('gpt3-xl', 'llama2-70b', ...)
    presets.source("llama3-8b")              # a Preset: dims source, published count, notes
    print(presets.table())                   # the Markdown table of all of them

Every preset trains in bfloat16 activations with float32 parameters (`dtype="bfloat16"`,
`param_dtype="float32"`), as MaxText's defaults (`dtype: bfloat16`, float32 weights) and
Paxml's C4 configs (`FPROP_DTYPE = jnp.bfloat16`, float32 variables) do, and leaves
`attention="auto"` (the fused kernel where the platform has one). Layers are scanned.

The model here is pre-norm with RMSNorm (a scale per norm, no biases anywhere), so a
source model with LayerNorm biases, linear biases or a parallel attention/MLP block differs
by a few vectors per layer; each note says how, and by how many parameters when it matters.

Published figures are of two kinds. `exact=True`: an exact published count (Hugging Face /
keras-hub metadata, the GPT-3 paper's Table D.1 in millions); the preset's count is within
1% of it (tests/test_presets.py counts the real Flax model with jax.eval_shape). `exact=False`:
only a nominal label exists ("16B" in a class or file name, never an exact count); the
preset keeps the published dimensions unchanged, and `deviation` states how far its count
is from the label (also checked by the test), with the reason in the note.

Use in a space file: `paxsearch.search.space.preset(name, **fields)` (a Fiddle config, so a
`pg.oneof` of preset names is a decision); on the command line: `--set model=llama3-8b`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .config import ModelConfig
from .errors import ConfigError

# ModelConfig fields shared by presets (dict[str, Any]: their values are of several types).
_TRAINING: dict[str, Any] = dict(dtype="bfloat16", param_dtype="float32", scan_layers=True, attention="auto")

_LLAMA: dict[str, Any] = dict(mlp="gated", activation="silu", position="rope", tie_embeddings=False, **_TRAINING)
_PAXML_C4: dict[str, Any] = dict(mlp="dense", activation="gelu_exact", position="learned", tie_embeddings=True,
                                 **_TRAINING)
# MaxText's "default" decoder layer is a parallel block: one RMS pre-norm, attention and MLP both on
# it, their sum added to the input (google/maxtext DecoderLayer @281e04bf MaxText/layers.py and
# @632f6514 MaxText/layers/models.py, both read; NNXDecoderLayer in MaxText 0.2.5).
_MAXTEXT_2023: dict[str, Any] = dict(mlp="dense", block="parallel", activation="relu", position="rope",
                                     rope_theta=10_000.0, tie_embeddings=True, n_kv_heads=None, **_TRAINING)

_MAXTEXT_COMMIT = "google/maxtext@632f65147607dff421c108f1592b7eb416ea7d6a, 2023-12-15,"
_MAXTEXT_SCALE = (
    "MaxText/configs/base.yml base_emb_dim 2560, base_num_heads 8, base_mlp_dim 8192, base_num_decoder_layers 16, "
    "head_dim 256, mlp_activations [relu], logits_via_embedding True, vocab_size 32768; MaxText/pyconfig.py "
    "get_individual_scales: scale 16 -> emb x2, heads x4, mlp x4, layers x2; scale 32 -> emb x4, heads x4, mlp x4, "
    "layers x2. RoPE (layers/attentions.py LLaMARotaryEmbedding, max_timescale 10000), MHA.")
# MaxText's v5p table (2023-12-15): the same base.yml and scaling rule, read at this commit.
_MAXTEXT_V5P = "76bd53b0f44caf989c88189afadeb1062f9254f0"
_MAXTEXT_SCALE_V5P = (
    "MaxText/configs/base.yml there: base_emb_dim 2560, base_num_heads 8, base_mlp_dim 8192, "
    "base_num_decoder_layers 16, head_dim 256, mlp_activations [relu], logits_via_embedding True, vocab_size 32768; "
    "MaxText/pyconfig.py get_individual_scales: log2(scale) = 3 b + r, heads and mlp x 2^(b + (r > 0)), "
    "emb x 2^(b + (r > 1)), layers x 2^b.")
_MAXTEXT_NOTE = (
    "{label}: no exact count is published (README 'TPU v5e' table and the script's comment '{label} parameter "
    "model'); MaxText's own doc says each global_parameter_scale step 'is not a perfect doubling', and these dims "
    "give {deviation:+.1%} over the label. MaxText's 2023 decoder is a parallel block (attention and MLP read one "
    "RMSNorm, layers/models.py DecoderLayer), and so is this preset (block='parallel'). Built as a sequential block "
    "instead (a second norm per layer), the same dims planned 5.8-7.7 GiB more per v5p chip (the v5p-128 64B "
    "refused at 97.2 GiB) and exposed more tensor-axis communication: benchmarks/RESULTS.md.")
_PAXML_NOTE = (
    "{label}: Paxml names it '{label} params' (class docstring) but publishes no exact count; the dims in c4.py give "
    "{deviation:+.1%}. Paxml uses sinusoidal absolute positions (no parameters; TRAINABLE_POSITION_EMB False) and "
    "LayerNorm with biases and FFN biases; this preset uses learned absolute positions (+seq_len x d_model = "
    "{pos:,} parameters) and RMSNorm.")

# Llama 3.1 (trainer/presets.py llama3.1-*): MaxText's model ymls and recipes, read
_MAXTEXT_LLAMA31 = ("AI-Hypercomputer/maxtext MaxText/configs/models/llama3.1-{size}.yml"
                    "@9f1820b472ef362e7b5c782fe1d6fda8a0943eff (tag tpu-recipes-v0.1.4)")
_LLAMA31_SEQ = ("MaxText's Llama 3.1 recipes train at max_target_length 8192 "
                "(benchmarks/maxtext_trillium_model_configs.py@92e59fdf547421f647590087f50fea5729da42d8 "
                "llama3_1-8b-8192, llama3_1-70b-8192, llama3-1-405b-8192-fsdp-dcn), the pre-training length "
                "before Llama 3.1's long-context stage")
_LLAMA31_NOTE = ("Architecture as published: RMSNorm pre-norm, SwiGLU, RoPE theta 500000, GQA with 8 K/V heads, "
                 "untied embeddings, no biases; this preset's count equals the published one to the parameter. "
                 "Gap: Llama 3.1's RoPE frequency scaling (rope_scaling rope_type llama3: factor 8, low_freq_factor 1, "
                 "high_freq_factor 4, original_max_position_embeddings 8192; MaxText layers/embeddings.py "
                 "LLaMARotaryEmbedding use_scale) is not in this model: plain RoPE theta 500000. It rescales the "
                 "rotation frequencies only (no parameters, no matmul), so FLOPs, memory and the compiled step's "
                 "shape are the same; positions beyond 8192 would rotate differently.")


@dataclass(frozen=True)
class Preset:
    """A named model and where it comes from."""

    name: str
    model: ModelConfig
    source: str  # repository, file and commit (or URL) of the dimensions
    published_params: int  # the published parameter count (or the nominal label's value)
    published_source: str  # where that figure is published, quoted
    exact: bool  # True: an exact published count; False: a nominal label ("16B")
    deviation: float = 0.0  # nominal labels: (count - label) / label of this preset's dims
    note: str = ""
    # mixtures of experts: the published count of parameters activated per token (0: a dense model)
    published_active: int = 0


def _llama(**dims) -> ModelConfig:
    return ModelConfig(**_LLAMA, **dims)


# Mixtures of experts (trainer/moe.py): Llama's body with a MoE layer in place of every MLP.
_MOE_NOTE = ("Counts: only routed experts are sharded over the mesh axis `expert`; model FLOPs count the router and "
             "the experts_per_token activated experts (trainer/flops.py). ")
# DeepSeek (multi-head latent attention, trainer/mla.py; the DeepSeekMoE layers of trainer/moe.py)
_DEEPSEEK_GAPS = (
    "Gaps (no parameter or matmul of theirs is missing; the routing and RoPE details below change which experts a "
    "token picks or how positions rotate, not the FLOPs, shapes or memory): YaRN RoPE scaling (rope_scaling type "
    "yarn, factor 40, original_max_position_embeddings 4096: frequencies and the softmax scale's mscale for long "
    "context) is not modeled, plain RoPE at rope_theta 10000, as the 4096-token pre-training; DeepSeek's "
    "interleaved RoPE pair layout is the rotate-half one here (a fixed permutation of the 64 RoPE dims). The MTP "
    "module (num_nextn_predict_layers) is not part of the main model and not built. ")
_DEEPSEEK_ACTIVE = ("DeepSeek counts activated parameters without the input embedding table (its lookup is no "
                    "matmul); flops.param_count(active=True) counts it: {with_embed:,} with it, {without:,} "
                    "without, the published {label} to 0.1B. ")



_PRESETS = (
    Preset(
        name="llama2-7b",
        model=_llama(vocab_size=32000, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=None, head_dim=128,
                     d_ff=11008, seq_len=4096, rope_theta=10_000.0),
        source="https://huggingface.co/meta-llama/Llama-2-7b-hf/blob/main/config.json (hidden_size 4096, "
               "num_hidden_layers 32, num_attention_heads 32, intermediate_size 11008, vocab_size 32000, "
               "max_position_embeddings 4096, rope_theta 10000, tie_word_embeddings false)",
        published_params=6_738_415_616,
        published_source="keras-team/keras-hub keras_hub/src/models/llama/llama_presets.py@5d163cac782502025a639d48"
                         "27c8f3cfea8ab532: llama2_7b_en 'params': 6738415616",
        exact=True,
        note="Architecture as published: RMSNorm pre-norm, SwiGLU, RoPE, MHA, untied embeddings, no biases."),
    Preset(
        name="llama3-8b",
        model=_llama(vocab_size=128256, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128,
                     d_ff=14336, seq_len=8192, rope_theta=500_000.0),
        source="https://huggingface.co/meta-llama/Meta-Llama-3-8B/blob/main/config.json (hidden_size 4096, "
               "num_hidden_layers 32, num_attention_heads 32, num_key_value_heads 8, intermediate_size 14336, "
               "vocab_size 128256, max_position_embeddings 8192, rope_theta 500000)",
        published_params=8_030_261_248,
        published_source="keras-team/keras-hub keras_hub/src/models/llama3/llama3_presets.py@2f5dce1e346369fb08cac9"
                         "3a59cad55707159d1e: llama3_8b_en 'params': 8030261248",
        exact=True,
        note="Architecture as published: GQA with 8 K/V heads, SwiGLU, RoPE theta 500000, untied embeddings."),
    Preset(
        name="llama-tiny",
        model=_llama(vocab_size=512, d_model=128, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=32,
                     d_ff=512, seq_len=128, rope_theta=10_000.0),
        source="paxsearch's own: Llama 2/3's architecture (RMSNorm pre-norm, SwiGLU, RoPE, GQA, untied "
               "embeddings, no biases) at laptop size; d_ff = 8/3 d_model rounded up to a multiple of 256 as "
               "Llama's FeedForward does (meta-llama/llama model.py multiple_of), vocab 512 >= the 259 ids of the "
               "byte vocabulary of paxsearch's synthetic data",
        published_params=1_115_264,
        published_source="not a published model: the count is this preset's own (4 layers x 246,016 + "
                         "2 x 512 x 128 embeddings + 128 final norm)",
        exact=True,
        note="Not a published model: a small Llama for trying paxsearch on a CPU (`paxsearch train --set "
             "model=llama-tiny` trains it on 8 simulated CPU devices), and for tests. GQA with 2 K/V heads for "
             "4 query heads, SwiGLU, RoPE theta 10000, untied embeddings."),
    Preset(
        name="llama2-70b",
        model=_llama(vocab_size=32000, d_model=8192, n_layers=80, n_heads=64, n_kv_heads=8, head_dim=128,
                     d_ff=28672, seq_len=4096, rope_theta=10_000.0),
        source="https://huggingface.co/meta-llama/Llama-2-70b-hf/blob/main/config.json (hidden_size 8192, "
               "num_hidden_layers 80, num_attention_heads 64, num_key_value_heads 8, intermediate_size 28672, "
               "vocab_size 32000, max_position_embeddings 4096)",
        published_params=68_976_648_192,
        published_source="https://huggingface.co/api/models/meta-llama/Llama-2-70b-hf safetensors.total "
                         "68,976,653,312, of which 5,120 are the stored rotary inv_freq buffers (64 x 80 layers), "
                         "not parameters",
        exact=True,
        note="Architecture as published: GQA with 8 K/V heads, SwiGLU, RoPE, untied embeddings. The Llama 2 "
             "paper's label is '70B' (-1.5% for the exact count)."),
    Preset(
        name="llama3.1-8b",
        model=_llama(vocab_size=128256, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128,
                     d_ff=14336, seq_len=8192, rope_theta=500_000.0),
        source="https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json (hidden_size 4096, "
               "num_hidden_layers 32, num_attention_heads 32, num_key_value_heads 8, intermediate_size 14336, "
               "vocab_size 128256, rope_theta 500000, max_position_embeddings 131072, rope_scaling llama3 factor 8); "
               "the same dims in " + _MAXTEXT_LLAMA31.format(size="8b") + "; seq_len 8192: " + _LLAMA31_SEQ,
        published_params=8_030_261_248,
        published_source="keras-team/keras-hub keras_hub/src/models/llama3/llama3_presets.py@d7a5c31f7d8306228a11865"
                         "82e169efd2bd3ceef: llama3.1_8b 'params': 8030261248",
        exact=True,
        note="Same dims as llama3-8b. " + _LLAMA31_NOTE),
    Preset(
        name="llama3.1-70b",
        model=_llama(vocab_size=128256, d_model=8192, n_layers=80, n_heads=64, n_kv_heads=8, head_dim=128,
                     d_ff=28672, seq_len=8192, rope_theta=500_000.0),
        source="https://huggingface.co/meta-llama/Llama-3.1-70B/blob/main/config.json (hidden_size 8192, "
               "num_hidden_layers 80, num_attention_heads 64, num_key_value_heads 8, intermediate_size 28672, "
               "vocab_size 128256, rope_theta 500000, max_position_embeddings 131072, rope_scaling llama3 factor 8); "
               "the same dims in " + _MAXTEXT_LLAMA31.format(size="70b") + "; seq_len 8192: " + _LLAMA31_SEQ,
        published_params=70_553_706_496,
        published_source="https://huggingface.co/api/models/meta-llama/Llama-3.1-70B safetensors.total "
                         "70,553,706,496 (revision 349b2ddb53ce8f2849a6c168a81980ab25258dac)",
        exact=True,
        note="Llama 2 70B's body (GQA 8 K/V heads, d_ff 28672) with the 128256-token vocabulary. " + _LLAMA31_NOTE),
    Preset(
        name="llama3.1-405b",
        model=_llama(vocab_size=128256, d_model=16384, n_layers=126, n_heads=128, n_kv_heads=8, head_dim=128,
                     d_ff=53248, seq_len=8192, rope_theta=500_000.0),
        source="https://huggingface.co/meta-llama/Llama-3.1-405B/blob/main/config.json (hidden_size 16384, "
               "num_hidden_layers 126, num_attention_heads 128, num_key_value_heads 8, intermediate_size 53248, "
               "vocab_size 128256, rope_theta 500000, max_position_embeddings 131072, rope_scaling llama3 factor 8); "
               "the same dims in " + _MAXTEXT_LLAMA31.format(size="405b") + "; seq_len 8192: " + _LLAMA31_SEQ,
        published_params=405_853_388_800,
        published_source="https://huggingface.co/api/models/meta-llama/Llama-3.1-405B safetensors.total "
                         "405,853,388,800 (revision b906e4dc842aa489c962f9db26554dcfdde901fe)",
        exact=True,
        note="126 layers: not divisible by 4 or 8 pipeline stages (by 2, 3, 6, 7, 9, 14, ...). " + _LLAMA31_NOTE),
    Preset(
        name="gpt3-xl",
        model=ModelConfig(vocab_size=50257, d_model=2048, n_layers=24, n_heads=16, head_dim=128, d_ff=8192,
                          seq_len=2048, mlp="dense", activation="gelu", position="learned", tie_embeddings=True,
                          **_TRAINING),
        source="Brown et al. 2020, Language Models are Few-Shot Learners, https://arxiv.org/abs/2005.14165, "
               "Table 2.1 (GPT-3 XL: n_layers 24, d_model 2048, d_head 128, n_ctx 2048) and GPT-2's vocabulary "
               "(50257), learned positions, tied embeddings, d_ff = 4 d_model",
        published_params=1_320_000_000,
        published_source="arXiv 2005.14165 Table D.1: GPT-3 XL, Params (M) 1,320 (Table 2.1 rounds it to 1.3B)",
        exact=True,
        note="Table 2.1 lists n_heads 24 with d_head 128, which does not multiply to d_model 2048; 16 heads of "
             "128 keep the attention at d_model (as the 1,320M count requires; 24 x 128 would give ~1.52B). "
             "Paxml's C4SpmdPipelineGpt3SmallAdam64Replicas, which its README calls GPT3-XL, is a different "
             "model (d_model 3072). No biases and RMSNorm here: GPT-3's biases and LayerNorm offsets add ~0.5M."),
    Preset(
        name="paxml-c4-1b",
        model=ModelConfig(vocab_size=32000, d_model=2560, n_layers=13, n_heads=20, head_dim=128, d_ff=10240,
                          seq_len=1024, **_PAXML_C4),
        source="google/paxml paxml/tasks/lm/params/c4.py@6348af57621a0a88524176756d033b837ad0f4c1 "
               "C4Spmd1BAdam4Replicas (NUM_LAYERS 13, MODEL_DIMS 2560, HIDDEN_DIMS 4 x MODEL_DIMS, NUM_HEADS 20, "
               "DIMS_PER_HEAD 128, MAX_SEQ_LEN 1024, VOCAB_SIZE 32000; C4SpmdAdam: GELU, not gated; "
               "paxml/tasks/lm/model_params.py: SEPARATE_EMBEDDING False, i.e. tied)",
        published_params=1_000_000_000,
        published_source="c4.py C4Spmd1BAdam4Replicas docstring 'GPT-3 config with 1B params'; README '1B model "
                         "on c4 dataset'",
        exact=False,
        deviation=0.107,
        note=_PAXML_NOTE.format(label="1B", deviation=0.107, pos=1024 * 2560)),
    Preset(
        name="paxml-c4-16b",
        model=ModelConfig(vocab_size=32000, d_model=6144, n_layers=36, n_heads=48, head_dim=128, d_ff=24576,
                          seq_len=1024, **_PAXML_C4),
        source="google/paxml paxml/tasks/lm/params/c4.py@6348af57621a0a88524176756d033b837ad0f4c1 "
               "C4Spmd16BAdam32Replicas (NUM_LAYERS 36, MODEL_DIMS 6144, HIDDEN_DIMS 4 x MODEL_DIMS, NUM_HEADS 48, "
               "DIMS_PER_HEAD 128, MAX_SEQ_LEN 1024, VOCAB_SIZE 32000; GELU, not gated, tied)",
        published_params=16_000_000_000,
        published_source="c4.py C4Spmd16BAdam32Replicas docstring 'GPT-3 config with 16B params'; README '16B "
                         "model on c4 dataset'",
        exact=False,
        deviation=0.032,
        note=_PAXML_NOTE.format(label="16B", deviation=0.032, pos=1024 * 6144)),
    Preset(
        name="maxtext-v5e-16b",
        model=ModelConfig(vocab_size=32768, d_model=5120, n_layers=32, n_heads=32, head_dim=256, d_ff=32768,
                          seq_len=2048, **_MAXTEXT_2023),
        source=f"{_MAXTEXT_COMMIT} MaxText/configs/v5e/16b.sh (global_parameter_scale=16, max_target_length=2048, "
               f"attention='flash', remat_policy=full, per_device_batch_size=6). {_MAXTEXT_SCALE}",
        published_params=16_000_000_000,
        published_source="MaxText/configs/v5e/16b.sh '# 16B parameter model.'; README 'TPU v5e' table (16B)",
        exact=False,
        deviation=0.017,
        note=_MAXTEXT_NOTE.format(label="16B", deviation=0.017)),
    Preset(
        name="maxtext-v5e-32b",
        model=ModelConfig(vocab_size=32768, d_model=10240, n_layers=32, n_heads=32, head_dim=256, d_ff=32768,
                          seq_len=2048, **_MAXTEXT_2023),
        source=f"{_MAXTEXT_COMMIT} MaxText/configs/v5e/32b.sh (global_parameter_scale=32, max_target_length=2048, "
               f"attention='flash', remat_policy=full, per_device_batch_size=4). {_MAXTEXT_SCALE}",
        published_params=32_000_000_000,
        published_source="MaxText/configs/v5e/32b.sh '# 32B parameter model.'; README 'TPU v5e' table (32B)",
        exact=False,
        deviation=0.017,
        note=_MAXTEXT_NOTE.format(label="32B", deviation=0.017)),
    Preset(
        name="maxtext-v5e-64b",
        model=ModelConfig(vocab_size=32768, d_model=10240, n_layers=64, n_heads=32, head_dim=256, d_ff=32768,
                          seq_len=2048, **_MAXTEXT_2023),
        source=f"{_MAXTEXT_COMMIT} MaxText/configs/v5e/64b.sh (global_parameter_scale=64, max_target_length=2048, "
               f"attention='flash', remat_policy=full, per_device_batch_size=2); the same dims in "
               f"MaxText/configs/v5p/64b.sh. {_MAXTEXT_SCALE} Scale 64 -> emb x4, heads x4, mlp x4, layers x4.",
        published_params=64_000_000_000,
        published_source="MaxText/configs/v5e/64b.sh '# 64B parameter model.'; README 'TPU v5e' table (64B)",
        exact=False,
        deviation=0.012,
        note=_MAXTEXT_NOTE.format(label="64B", deviation=0.012)),
    Preset(
        name="maxtext-v5e-128b",
        model=ModelConfig(vocab_size=32768, d_model=10240, n_layers=64, n_heads=64, head_dim=256, d_ff=65536,
                          seq_len=2048, **_MAXTEXT_2023),
        source=f"{_MAXTEXT_COMMIT} MaxText/configs/v5e/128b.sh (global_parameter_scale=128, max_target_length=2048, "
               f"attention='flash', remat_policy=full, per_device_batch_size=1, ici_fsdp_parallelism=16, "
               f"ici_tensor_parallelism=16). {_MAXTEXT_SCALE} Scale 128 -> emb x4, heads x8, mlp x8, layers x4.",
        published_params=128_000_000_000,
        published_source="MaxText/configs/v5e/128b.sh '# 128B parameter model.'; README 'TPU v5e' table (128B)",
        exact=False,
        deviation=0.009,
        note=_MAXTEXT_NOTE.format(label="128B", deviation=0.009)),
    *(Preset(
        name=f"maxtext-v5p-{label.lower()}",
        model=ModelConfig(vocab_size=32768, d_model=20480, n_layers=layers, n_heads=heads, head_dim=256, d_ff=ff,
                          seq_len=2048, **_MAXTEXT_2023),
        source=f"google/maxtext@{_MAXTEXT_V5P}, 2023-12-15, MaxText/configs/v5p/{label.lower()}.sh "
               f"(global_parameter_scale={scale}, max_target_length=2048, attention='flash', remat_policy={remat}, "
               f"per_device_batch_size=2, ici_tensor_parallelism={tensor}). {_MAXTEXT_SCALE_V5P} Scale {scale} -> "
               f"{rule}.",
        published_params=int(label[:-1]) * 1_000_000_000,
        published_source=f"MaxText/configs/v5p/{label.lower()}.sh '# {label} parameter model.'; "
                         f"MaxText/configs/v5p/README.md '{label} model' table",
        exact=False,
        deviation=deviation,
        note=_MAXTEXT_NOTE.replace("'TPU v5e' table", "'TPU v5p' tables").format(label=label, deviation=deviation))
      for label, scale, layers, heads, ff, remat, tensor, rule, deviation in (
          ("256B", 256, 64, 64, 65536, "minimal", 8, "emb x8, heads x8, mlp x8, layers x4", 0.0092),
          ("512B", 512, 128, 64, 65536, "full", 16, "emb x8, heads x8, mlp x8, layers x8", 0.0080),
          ("1024B", 1024, 128, 128, 131072, "full", 16, "emb x8, heads x16, mlp x16, layers x8", 0.0073))),
    Preset(
        name="maxtext-v4-22b",
        model=ModelConfig(vocab_size=32768, d_model=6144, n_layers=48, n_heads=24, head_dim=256, d_ff=24576,
                          seq_len=1024, **_MAXTEXT_2023),
        source="google/maxtext@281e04bf31557482e2aa6bb870897e7b7be47f38, 2023-04-27, MaxText/configs/1xv4-128.sh "
               "(scale=3, ici_fsdp_parallelism=64, per_device_batch_size=16, remat_policy=full); MaxText/configs/"
               "base.yml there: base_emb_dim 2048, base_num_heads 8, base_mlp_dim 8192, base_num_decoder_layers 16, "
               "head_dim 256, mlp_activations [relu], logits_via_embedding True, vocab_size 32768, "
               "max_target_length 1024; MaxText/pyconfig.py: scale multiplies all four base dims (x3). The same "
               "dims written out in MaxText/configs/v4/22b.sh@76bd53b0f44caf989c88189afadeb1062f9254f0.",
        published_params=22_000_000_000,
        published_source="MaxText/configs/1xv4-128.sh '# TFLOP/s 165, 22B'; README 'TPU v4' table 'For a 22B model'",
        exact=False,
        deviation=-0.0025,
        note="22B: no exact count is published (README 'TPU v4' table 'For a 22B model' and the script's comment "
             "'22B'); these dims give -0.2% under the label. As for the v5e presets, MaxText's decoder is a parallel "
             "block (MaxText/layers.py DecoderLayer at that commit, read), and so is this preset. At that commit "
             "MaxText's decoder had T5-style relative position biases (MaxText/layers.py RelativePositionBiases, "
             "32 buckets x heads per layer) instead of RoPE; RoPE here (neither is a matmul, so the model FLOPs are "
             "the same)."),
)

_MOE_PRESETS = (
    Preset(
        name="mixtral-8x7b",
        model=_llama(vocab_size=32000, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128,
                     d_ff=14336, seq_len=4096, rope_theta=1_000_000.0, n_experts=8, experts_per_token=2,
                     load_balance_weight=0.02),
        source="https://huggingface.co/mistralai/Mixtral-8x7B-v0.1/blob/main/config.json (hidden_size 4096, "
               "num_hidden_layers 32, num_attention_heads 32, num_key_value_heads 8, intermediate_size 14336, "
               "num_local_experts 8, num_experts_per_tok 2, vocab_size 32000, rope_theta 1000000, "
               "router_aux_loss_coef 0.02, tie_word_embeddings false); seq_len 4096 as MaxText's Mixtral recipes "
               "(tpu-recipes training/trillium/Mixtral-8x7B-MaxText, max_target_length 4096)",
        published_params=46_700_000_000,
        published_source="Mistral AI, 'Mixtral of experts' (2023-12-11, https://mistral.ai/news/mixtral-of-experts): "
                         "'Mixtral has 46.7B total parameters but only uses 12.9B parameters per token'",
        exact=True,
        published_active=12_900_000_000,
        note=_MOE_NOTE + "Architecture as published: SwiGLU experts, softmax top-2 router (weights renormalized), GQA "
             "with 8 K/V heads, RoPE theta 1e6, untied embeddings; 46,702,792,704 parameters, 12,879,925,248 active. "
             "Mixtral's sliding window is off in this config (sliding_window null)."),
    Preset(
        name="mixtral-8x22b",
        model=_llama(vocab_size=32000, d_model=6144, n_layers=56, n_heads=48, n_kv_heads=8, head_dim=128,
                     d_ff=16384, seq_len=4096, rope_theta=1_000_000.0, n_experts=8, experts_per_token=2,
                     load_balance_weight=0.001),
        source="https://huggingface.co/mistral-community/Mixtral-8x22B-v0.1/blob/main/config.json (hidden_size 6144, "
               "num_hidden_layers 56, num_attention_heads 48, num_key_value_heads 8, intermediate_size 16384, "
               "num_local_experts 8, num_experts_per_tok 2, vocab_size 32000, rope_theta 1000000, "
               "router_aux_loss_coef 0.001); seq_len 4096 as MaxText's recipe (tpu-recipes "
               "training/trillium/Mixtral-8x22B-MaxText)",
        published_params=141_000_000_000,
        published_source="Mistral AI, 'Cheaper, Better, Faster, Stronger' (2024-04-17, "
                         "https://mistral.ai/news/mixtral-8x22b): 'uses only 39B active parameters out of 141B'",
        exact=True,
        published_active=39_000_000_000,
        note=_MOE_NOTE + "Architecture as Mixtral 8x7B's; 140,620,634,112 parameters (-0.27% under the rounded 141B), "
             "39,152,031,744 active. The Instruct v0.1 release has vocab_size 32768 (+768 x 6144 x 2)."),
    Preset(
        name="qwen3-30b-a3b",
        model=_llama(vocab_size=151936, d_model=2048, n_layers=48, n_heads=32, n_kv_heads=4, head_dim=128,
                     d_ff=6144, expert_d_ff=768, seq_len=4096, rope_theta=1_000_000.0, n_experts=128,
                     experts_per_token=8, load_balance_weight=0.001),
        source="https://huggingface.co/Qwen/Qwen3-30B-A3B/blob/main/config.json (hidden_size 2048, "
               "num_hidden_layers 48, num_attention_heads 32, num_key_value_heads 4, head_dim 128, "
               "moe_intermediate_size 768, num_experts 128, num_experts_per_tok 8, norm_topk_prob true, "
               "decoder_sparse_step 1, mlp_only_layers [], intermediate_size 6144 (unused: no dense layer), "
               "vocab_size 151936, rope_theta 1000000, router_aux_loss_coef 0.001, tie_word_embeddings false); "
               "seq_len 4096 (a pre-training length; max_position_embeddings 40960)",
        published_params=30_500_000_000,
        published_source="https://huggingface.co/Qwen/Qwen3-30B-A3B model card: 'Number of Parameters: 30.5B in "
                         "total and 3.3B activated'",
        exact=True,
        published_active=3_300_000_000,
        note=_MOE_NOTE + "SwiGLU experts, softmax top-8 router with the weights renormalized (norm_topk_prob), GQA "
             "with 4 K/V heads. Gap: Qwen3's QK-norm (an RMSNorm scale on each query and key head, 2 x 128 "
             "parameters a layer, no matmul) is not in this model: 30,532,110,336 parameters here, 12,288 fewer "
             "than the checkpoint's 30,532,122,624. Active: 3,353,020,416 (the card's 3.3B, rounded down)."),
    Preset(
        name="deepseek-v3",
        model=_llama(vocab_size=129280, d_model=7168, n_layers=61, n_heads=128, head_dim=192, d_ff=18432,
                     expert_d_ff=2048, seq_len=4096, rope_theta=10_000.0, n_experts=256, experts_per_token=8,
                     n_shared_experts=1, first_dense_layers=3, router="sigmoid", load_balance_weight=0.0,
                     attention_type="mla", q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
                     qk_rope_head_dim=64, v_head_dim=128),
        source="https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json (hidden_size 7168, "
               "num_hidden_layers 61, first_k_dense_replace 3, moe_layer_freq 1, num_attention_heads 128, "
               "num_key_value_heads 128, q_lora_rank 1536, kv_lora_rank 512, qk_nope_head_dim 128, "
               "qk_rope_head_dim 64, v_head_dim 128, intermediate_size 18432, moe_intermediate_size 2048, "
               "n_routed_experts 256, num_experts_per_tok 8, n_shared_experts 1, scoring_func sigmoid, "
               "topk_method noaux_tc, n_group 8, "
               "topk_group 4, norm_topk_prob true, routed_scaling_factor 2.5, vocab_size 129280, rope_theta 10000, "
               "rms_norm_eps 1e-6, tie_word_embeddings false, num_nextn_predict_layers 1); the same dims in "
               "AI-Hypercomputer/maxtext src/MaxText/configs/models/deepseek3-671b.yml"
               "@3eb77db3c94580f56f1b738f8d254b03bd205e35 (read); seq_len 4096, its pre-training length "
               "(original_max_position_embeddings 4096)",
        published_params=671_000_000_000,
        published_source="https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/README_WEIGHTS.md, Main Model "
                          "Weights: 'Total parameters: 671B', 'Activation parameters: 36.6B (including 0.9B for the "
                          "output Head)'; the checkpoint's 685B adds the MTP module's 11.5B unique parameters (and its "
                          "norms and projection), which are not the main model",
        exact=True,
        published_active=36_600_000_000,
        note=_MOE_NOTE + "Architecture as published: multi-head latent attention (trainer/mla.py: a 1536-rank query "
             "latent and a 512-rank key/value latent, RMSNorm on both, 128 heads of 128 + 64 (decoupled RoPE key "
             "shared across heads), values 128 wide), 3 leading dense SwiGLU layers of width 18432, then 58 MoE "
             "layers of 256 SwiGLU experts of width 2048, top-8, 1 shared expert, sigmoid router with a routing bias "
             "(aux-loss-free balancing; load_balance_weight 0: DeepSeek's complementary sequence-wise loss, "
             "alpha 0.0001 in the paper, is not this batch-wise one), untied embeddings; 671,026,419,200 "
             "parameters (the 58 x 256 routing biases included). " + _DEEPSEEK_ACTIVE.format(
                 with_embed=37_552_297_472, without=36_625_618_432, label="36.6B")
             + _DEEPSEEK_GAPS + "Routing gaps: group-limited routing (n_group 8, topk_group 4: the top-8 taken within "
             "the 4 best of 8 expert groups) is not modeled (top-8 over all 256); routed_scaling_factor 2.5 (the "
             "routed experts' output scaled) is not modeled (a constant factor, learnable by the next layer's "
             "weights, no FLOPs)."),
    Preset(
        name="deepseek-v2-lite",
        model=_llama(vocab_size=102400, d_model=2048, n_layers=27, n_heads=16, head_dim=192, d_ff=10944,
                     expert_d_ff=1408, seq_len=4096, rope_theta=10_000.0, n_experts=64, experts_per_token=6,
                     n_shared_experts=2, first_dense_layers=1, router="softmax", load_balance_weight=0.001,
                     attention_type="mla", q_lora_rank=0, kv_lora_rank=512, qk_nope_head_dim=128,
                     qk_rope_head_dim=64, v_head_dim=128),
        source="https://huggingface.co/deepseek-ai/DeepSeek-V2-Lite/blob/main/config.json (hidden_size 2048, "
               "num_hidden_layers 27, first_k_dense_replace 1, moe_layer_freq 1, num_attention_heads 16, "
               "num_key_value_heads 16, q_lora_rank null, kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64, "
               "v_head_dim 128, intermediate_size 10944, moe_intermediate_size 1408, n_routed_experts 64, "
               "num_experts_per_tok 6, n_shared_experts 2, scoring_func softmax, topk_method greedy, "
               "norm_topk_prob false, routed_scaling_factor 1.0, aux_loss_alpha 0.001, vocab_size 102400, rope_theta "
               "10000, tie_word_embeddings false); the same dims in AI-Hypercomputer/maxtext "
               "src/MaxText/configs/models/deepseek2-16b.yml@3eb77db3c94580f56f1b738f8d254b03bd205e35 (read); "
               "seq_len 4096, its pre-training length",
        published_params=15_700_000_000,
        published_source="https://huggingface.co/deepseek-ai/DeepSeek-V2-Lite model page: 15.7B params (the "
                          "safetensors count; its README's table rounds to '16B' total, '2.4B' activated)",
        exact=True,
        published_active=2_400_000_000,
        note=_MOE_NOTE + "The reduced DeepSeek-V2 (the model card's '16B'): multi-head latent attention without a "
             "query latent (q_lora_rank 0: one query projection of 16 heads x 192), a 512-rank key/value latent, "
             "1 leading dense SwiGLU layer of width 10944, then 26 MoE layers of 64 SwiGLU experts of width 1408, "
             "top-6, 2 shared experts, softmax router with load_balance_weight 0.001 (aux_loss_alpha); "
             "15,706,484,224 parameters. " + _DEEPSEEK_ACTIVE.format(
                 with_embed=2_661_150_208, without=2_451_435_008, label="2.4B")
             + _DEEPSEEK_GAPS.replace(" The MTP module (num_nextn_predict_layers) is not part of the main model and "
                                      "not built.", "")
             + "Routing gap: norm_topk_prob false (the top-6 softmax weights used as they are) is not modeled: the "
             "softmax router here renormalizes the chosen weights to sum to 1."),
    Preset(
        name="moe-tiny",
        model=_llama(vocab_size=512, d_model=128, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=32, d_ff=512,
                     expert_d_ff=256, seq_len=128, rope_theta=10_000.0, n_experts=8, experts_per_token=2,
                     n_shared_experts=1, first_dense_layers=1),
        source="paxsearch's own: llama-tiny's body (RMSNorm pre-norm, SwiGLU, RoPE, GQA, untied embeddings) with "
               "MoE layers: one leading dense layer (DeepSeek's first_k_dense_replace), then 3 MoE layers of 8 "
               "SwiGLU experts of width 256, top-2 softmax routing, 1 shared expert",
        published_params=3_182_720,
        published_source="not a published model: the count is this preset's own (trainer/flops.py param_count)",
        exact=True,
        published_active=1_413_248,
        note="Not a published model: a small mixture of experts for trying paxsearch on a CPU (`paxsearch train "
             "--set model=moe-tiny` trains it on 8 simulated CPU devices; add --set mesh.ici=... with an expert "
             "axis for expert parallelism), and for tests."),
)

_PRESETS = _PRESETS + _MOE_PRESETS
_BY_NAME = {p.name: p for p in _PRESETS}


def names() -> tuple[str, ...]:
    """The preset names, in the order of the table."""
    return tuple(_BY_NAME)


def source(name: str) -> Preset:
    """The preset with its sources and published count (ConfigError for an unknown name)."""
    try:
        return _BY_NAME[name]
    except (KeyError, TypeError):
        raise ConfigError(f"unknown model preset {name!r}; presets: {', '.join(_BY_NAME)}, or "
                          f"{MAXTEXT_PREFIX}PATH.yml for a MaxText model yml") from None


MAXTEXT_PREFIX = "maxtext:"  # "maxtext:PATH.yml": a MaxText model yml read as a preset (trainer/maxtext_yml.py)


def get(name: str) -> ModelConfig:
    """The ModelConfig of a preset (ConfigError, one line listing the names, for an unknown one);
    "maxtext:PATH.yml" reads a MaxText model yml (e.g. its configs/models/llama3-8b.yml)."""
    if isinstance(name, str) and name.startswith(MAXTEXT_PREFIX):
        from . import maxtext_yml

        return maxtext_yml.load(name[len(MAXTEXT_PREFIX):])
    return source(name).model


def replace(name: str, **fields) -> ModelConfig:
    """A preset with some fields changed, e.g. replace("llama3-8b", seq_len=2048, n_layers=4)."""
    cfg = get(name)
    known = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ConfigError(f"model preset {name!r}: unknown ModelConfig field(s) {', '.join(unknown)}; "
                          f"known: {', '.join(sorted(known))}")
    return dataclasses.replace(cfg, **fields)


def table() -> str:
    """A Markdown table of the presets: dims, published count and kind, and the dims' source."""
    rows = ["| preset | d_model | layers | heads (kv) x head_dim | d_ff | vocab | seq | mlp | position | tied "
            "| published | source |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in _PRESETS:
        m = p.model
        heads = f"{m.n_heads} ({m.n_kv_heads or m.n_heads}) x {m.head_dim}"
        if m.attention_type == "mla":  # latent attention: the latents' ranks, query/key and value head dims
            heads = (f"{m.n_heads} MLA (q latent {m.q_lora_rank or '-'}, kv latent {m.kv_lora_rank}) x "
                     f"{m.head_dim} / v {m.v_head_dim}")
        mlp = f"{m.mlp} {m.activation}"
        if m.n_experts:  # a mixture of experts: experts, top-k, shared, and the active count
            mlp += (f", MoE {m.n_experts} x {m.expert_d_ff or m.d_ff} top-{m.experts_per_token}"
                    + (f" + {m.n_shared_experts} shared" if m.n_shared_experts else "")
                    + (f" (active {p.published_active / 1e9:g}B)" if p.published_active >= 10 ** 8 else ""))
        published = f"{p.published_params:,}" if p.exact else f"~{p.published_params / 1e9:g}B (label)"
        rows.append(f"| {p.name} | {m.d_model} | {m.n_layers} | {heads} | {m.d_ff} | {m.vocab_size} | {m.seq_len} "
                    f"| {mlp} | {m.position} | {'yes' if m.tie_embeddings else 'no'} | {published} "
                    f"| {p.source.split(' (')[0]} |")
    return "\n".join(rows)

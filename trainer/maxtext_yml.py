"""A MaxText model yml (its configs/models/*.yml, e.g. llama3-8b.yml, mixtral-8x7b.yml,
deepseek3-671b.yml, qwen3-30b-a3b.yml) as a ModelConfig.

    cfg = load("configs/models/llama3-8b.yml")    # presets.get("maxtext:PATH") calls this

Only data is read (yaml.safe_load: no tags, nothing that names code). Every key must be one this
module knows: a model key maps to a ModelConfig field; a key outside the model (optimizer, run and
data settings MaxText lets a model file set) is listed in NOT_MODEL and left to the search's own
config; any other key is a ConfigError naming the key. The model trains as the presets do: bfloat16
activations, float32 parameters, scanned layers, attention "auto". Keys the yml leaves out take
base.yml's values (BASE_DEFAULTS: AI-Hypercomputer/maxtext configs/base.yml, the model keys read here).

Decoder blocks (MaxText's decoder_block, read in its layers/decoders.py and models/*.py):
- llama2, mistral: sequential RMSNorm pre-norm block; default: MaxText's parallel block. Dense
  only: num_experts > 1 with them is refused (MaxText builds no MoE layer there).
- mixtral, qwen3_moe: the llama2 block with every MLP a MoE layer (MaxText's RoutedMoE); num_experts
  > 1 required. mixtral's experts are base_mlp_dim wide and MaxText requires base_moe_mlp_dim equal to
  it; qwen3_moe's are base_moe_mlp_dim wide (MaxText sets base_mlp_dim to it: no dense MLP remains).
  Routing: top-k of the router logits, softmax over those k (= softmax, top-k, renormalized: our
  router "softmax"; norm_topk_prob renormalizes again, a no-op). routed_score_func must stay "".
- deepseek: first_num_dense_layers dense layers (base_mlp_dim wide), then MoE layers of
  base_moe_mlp_dim-wide routed experts plus shared_experts (MaxText builds them as one MLP of
  shared_experts x base_moe_mlp_dim: the same parameters and FLOPs as our n_shared_experts experts).
  routed_score_func "sigmoid" with routed_bias true is our router "sigmoid" (top-k on scores + bias,
  the chosen scores normalized); "softmax" with routed_bias false is our "softmax" router (a gap:
  MaxText's deepseek block does not renormalize the top-k softmax weights, ours does). Other
  combinations have no router of ours (the routing bias is a parameter: it exists iff "sigmoid").
  attention_type "mla" is multi-head latent attention (trainer/mla.py), the deepseek block only:
  q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim map one to one, head_dim
  is qk_nope_head_dim + qk_rope_head_dim (MaxText's MLA ignores the head_dim key), K/V heads = heads.
Experts' MLPs: MaxText's routed experts are always gated (RoutedMoE: wi_0, wi_1 and wo, the first of
mlp_activations applied to wi_0's output times wi_1's), whatever mlp_activations says; its dense MLPs
(the leading dense layers, the shared experts) follow mlp_activations. So a MoE yml with a single
activation [act] is read as gated experts (mlp "gated") when it has neither leading dense layers nor
shared experts, and refused otherwise (our `mlp` is one form for all three).
MoE keys: num_experts -> n_experts, num_experts_per_tok -> experts_per_token (base.yml: 1),
base_moe_mlp_dim -> expert_d_ff. Token dropping: MaxText drops tokens only on its dense-matmul path
(sparse_matmul false) with capacity_factor > 0 (expert capacity ceil(k x tokens / experts) x
capacity_factor): expert_compute "capacity" with that capacity_factor; otherwise (sparse_matmul true,
megablox or not: kernels, not the model; or capacity_factor <= 0) every token is computed: "dropless".
megablox: true set in the yml (with the dropless experts) -> grouped_matmul "megablox" (the same Pallas
kernel); left to base.yml's true, or false: grouped_matmul "auto" (the kernel is no part of the model,
and "auto" runs on every platform).
load_balance_loss_weight (base.yml: 0) -> load_balance_weight x num_experts_per_tok: MaxText's loss is
experts x sum_e d_e P_e with d_e the mean number of a token's k routes going to e (k x our f_e).

Gaps: the policy of the presets. Where trainer/presets.py's notes accept a difference for planning
(deepseek-v3, deepseek-v2-lite, qwen3-30b-a3b, llama3.1: it changes which experts a token picks, how
positions rotate, a scale or a few norm scales, not the matmuls, their shapes or the memory), the
yml's value is read and not applied, and gaps(doc) names each one (load() warns with them, in one
line): YaRN RoPE scaling (rope_type yarn and its rope_factor / beta_fast / beta_slow /
original_max_position_embeddings / max_position_embeddings / rope_truncate / rope_attention_scaling),
YaRN's interleaved RoPE layout (rope_interleave), MLA's mscale softmax scale (which MaxText applies
whenever max_position_embeddings > original_max_position_embeddings, as base.yml has them), llama3.1
RoPE scaling (rope_type llama3.1), group-limited routing (n_routing_groups, topk_routing_group),
routed_scaling_factor != 1, the deepseek softmax router's unnormalized weights, how the sigmoid
router's bias moves (MaxText: routed_bias_update_rate x sign(mean load - load) added each step
outside the optimizer, none at its base.yml 0; ours: the optimizer, on the load error), Qwen3's QK-norm
(use_qk_norm: 2 x head_dim RMSNorm scales a layer, no matmul), MaxText's per-sequence
load-balancing loss (ours is over the step's tokens), and normalization_layer_epsilon (our RMSNorm's
epsilon is fixed at 1e-6). Any other value with no paxsearch equivalent (a decoder block, an
attention type, a router, dropout on, shared experts or dense layers outside the deepseek block) is
a ConfigError naming the key and what is missing.
"""
from __future__ import annotations

import os
import warnings
from typing import Any

from .config import ModelConfig
from .errors import ConfigError

# base.yml's values of the model keys a model yml may leave out (AI-Hypercomputer/maxtext
# src/MaxText/configs/base.yml; the MoE and MLA ones read at e591f30cbbf217ed67ef71263ec0538239f9c3b8)
BASE_DEFAULTS: dict[str, Any] = {
    "max_target_length": 2048, "logits_via_embedding": False, "rope_max_timescale": 10_000, "decoder_block": "llama2",
    "vocab_size": 32_000,
    # mixture of experts
    "num_experts": 1, "num_experts_per_tok": 1, "base_moe_mlp_dim": -1, "first_num_dense_layers": 0,
    "shared_experts": 0, "routed_score_func": "", "routed_bias": False, "routed_bias_update_rate": 0.0,
    "routed_scaling_factor": 1.0,
    "n_routing_groups": -1, "topk_routing_group": -1, "norm_topk_prob": False, "capacity_factor": -1.0,
    "sparse_matmul": True, "megablox": True, "load_balance_loss_weight": 0.0,
    # attention
    "attention_type": "global", "q_lora_rank": 0, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "use_qk_norm": False,
    # RoPE (YaRN's keys matter with rope_type yarn, and mscale in MLA's softmax scale)
    "rope_type": "default", "max_position_embeddings": 163_840, "original_max_position_embeddings": 4096,
    "rope_factor": 40, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "rope_interleave": True,
    "rope_truncate": True, "rope_attention_scaling": False,
}
REQUIRED = ("base_emb_dim", "base_num_query_heads", "base_num_decoder_layers", "base_mlp_dim", "head_dim",
            "mlp_activations")
# MaxText decoder blocks our model builds (see the module docstring): our block, and whether MaxText
# builds MoE layers in it
BLOCKS = {"llama2": "sequential", "mistral": "sequential", "default": "parallel", "mixtral": "sequential",
          "qwen3_moe": "sequential", "deepseek": "sequential"}
MOE_BLOCKS = ("mixtral", "qwen3_moe", "deepseek")
ATTENTION_TYPES = {"global": "mha", "mla": "mla"}
ROPE_TYPES = ("default", "yarn", "llama3.1")
ACTIVATIONS = ("gelu", "silu", "relu")
# keys that a model yml may set and that are not the model (left to the search's config), or that
# are the model's defaults here
NOT_MODEL = frozenset({
    "model_name", "enable_dropout", "dropout_rate", "normalization_layer_epsilon", "opt_type", "adam_b1", "adam_b2",
    "adam_eps", "adam_eps_root", "adam_weight_decay", "gradient_clipping_threshold", "learning_rate",
    "per_device_batch_size", "steps", "tokenizer_path", "tokenizer_type", "dtype", "weight_dtype", "scan_layers",
    "sliding_window_size"})


def _int(doc: dict, key: str, least: int = 1) -> int:
    value = doc[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ConfigError(f"MaxText yml key {key}: {value!r} is not an integer >= {least}")
    return value


def _number(doc: dict, key: str) -> float:
    value = doc[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"MaxText yml key {key}: {value!r} is not a number")
    return float(value)


def _bool(doc: dict, key: str) -> bool:
    if not isinstance(doc[key], bool):
        raise ConfigError(f"MaxText yml key {key}: {doc[key]!r} is not true or false")
    return doc[key]


def _choice(doc: dict, key: str, allowed, where: str) -> str:
    if doc[key] not in allowed:
        raise ConfigError(f"{where}: {key} {doc[key]!r} has no paxsearch equivalent; choose one of "
                          f"{', '.join(repr(a) for a in allowed)}")
    return doc[key]


def _checked(doc: Any, where: str) -> dict:
    """base.yml's defaults under the yml's keys, after the checks that need no model."""
    if not isinstance(doc, dict):
        raise ConfigError(f"{where} is not a mapping of MaxText keys")
    known = set(BASE_DEFAULTS) | set(REQUIRED) | {"base_num_kv_heads"} | NOT_MODEL
    unknown = sorted(map(str, (k for k in doc if k not in known)))
    if unknown:
        raise ConfigError(f"{where}: MaxText key(s) {', '.join(unknown)} have no paxsearch equivalent; "
                          f"remove them to import the rest (known: {', '.join(sorted(known))})")
    return {**BASE_DEFAULTS, **doc}


def gaps(doc: dict, where: str = "MaxText yml") -> tuple[str, ...]:
    """The yml's values that are read and not applied, one line each (the module docstring's policy)."""
    d = _checked(doc, where)
    out = []
    mla = d["attention_type"] == "mla"
    if d["rope_type"] == "yarn":
        out.append(f"rope_type yarn (YaRN RoPE scaling, rope_factor {d['rope_factor']}, "
                   f"original_max_position_embeddings {d['original_max_position_embeddings']}): plain RoPE here")
    elif d["rope_type"] == "llama3.1":
        out.append("rope_type llama3.1 (Llama 3.1's RoPE frequency scaling): plain RoPE here")
    if mla and d["max_position_embeddings"] > d["original_max_position_embeddings"]:
        out.append(f"MLA's YaRN softmax scale (mscale {d['mscale']}, rope_factor {d['rope_factor']}): "
                   "1/sqrt(head dim) here")
    if d["rope_type"] == "yarn" and d["rope_interleave"]:
        out.append("rope_interleave true (interleaved RoPE pairs): the rotate-half layout here, a fixed permutation")
    if d["n_routing_groups"] != -1 or d["topk_routing_group"] != -1:
        out.append(f"group-limited routing (n_routing_groups {d['n_routing_groups']}, topk_routing_group "
                   f"{d['topk_routing_group']}): top-k over all experts here")
    if d["routed_scaling_factor"] != 1:
        out.append(f"routed_scaling_factor {d['routed_scaling_factor']} (the routed experts' output scaled): "
                   "not scaled here")
    if d["decoder_block"] == "deepseek" and d["routed_score_func"] == "softmax":
        out.append("deepseek block's softmax router keeps the top-k weights unnormalized: renormalized here")
    if d["routed_bias"] and d["num_experts"] > 1:
        rate = d["routed_bias_update_rate"]
        how = (f"MaxText adds {rate} x sign(mean load - load) to each expert's routing bias a step, outside the "
               "optimizer" if rate else "MaxText's routing bias gets no load-balancing update")
        out.append(f"routed_bias_update_rate {rate} ({how}): here the optimizer moves the bias by the load error "
                   "(trainer/moe.py)")
    if d["use_qk_norm"]:
        out.append("use_qk_norm true (RMSNorm scales on each query and key head): not in this model")
    if d["load_balance_loss_weight"] and d["num_experts"] > 1:
        out.append("MaxText's load-balancing loss is per sequence: over the step's tokens here")
    if "normalization_layer_epsilon" in d and d["normalization_layer_epsilon"] != 1e-6:
        out.append(f"normalization_layer_epsilon {d['normalization_layer_epsilon']}: RMSNorm epsilon 1e-6 here")
    return tuple(out)


def from_dict(doc: dict, where: str = "MaxText yml") -> ModelConfig:
    """The ModelConfig of a parsed MaxText model yml (see the module docstring)."""
    d = _checked(doc, where)
    block = _choice(d, "decoder_block", tuple(BLOCKS), where)
    attention = ATTENTION_TYPES[_choice(d, "attention_type", tuple(ATTENTION_TYPES), where)]
    _choice(d, "rope_type", ROPE_TYPES, where)
    mla = attention == "mla"
    missing = [k for k in REQUIRED if k not in d and not (mla and k == "head_dim")]
    if missing:
        raise ConfigError(f"{where}: missing MaxText key(s) {', '.join(missing)}")
    if d.get("enable_dropout") or d.get("dropout_rate"):
        raise ConfigError(f"{where}: dropout (enable_dropout / dropout_rate) has no paxsearch equivalent; set "
                          "enable_dropout: false")
    acts = d["mlp_activations"]
    if (not isinstance(acts, list) or len(acts) not in (1, 2) or acts[0] not in ACTIVATIONS
            or acts[1:] not in ([], ["linear"])):
        raise ConfigError(f"{where}: mlp_activations {acts!r} has no paxsearch equivalent; use [act] (dense) or "
                          f"[act, linear] (gated) with act one of {', '.join(ACTIVATIONS)}")
    heads = _int(d, "base_num_query_heads")
    kv = _int(d, "base_num_kv_heads") if "base_num_kv_heads" in d else heads
    if heads % kv:
        raise ConfigError(f"{where}: base_num_kv_heads {kv} does not divide base_num_query_heads {heads}")
    theta = d["rope_max_timescale"]
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or theta <= 0:
        raise ConfigError(f"{where}: rope_max_timescale {theta!r} is not a positive number")
    for key in ("logits_via_embedding", "routed_bias", "norm_topk_prob", "sparse_matmul", "megablox", "use_qk_norm",
                "rope_interleave", "rope_truncate", "rope_attention_scaling"):
        _bool(d, key)
    for key in ("routed_scaling_factor", "routed_bias_update_rate", "capacity_factor", "load_balance_loss_weight",
                "mscale", "rope_factor",
                "beta_fast", "beta_slow", "max_position_embeddings", "original_max_position_embeddings"):
        _number(d, key)
    for key in ("n_routing_groups", "topk_routing_group"):
        _int(d, key, least=-1)
    d_ff = _int(d, "base_mlp_dim")
    fields: dict[str, Any] = {}
    n_experts = _int(d, "num_experts")
    if n_experts > 1:
        fields.update(_moe(d, where, block, n_experts, d_ff))
        if doc.get("megablox") is True and fields["expert_compute"] == "dropless":  # set in the yml, not base.yml's
            fields["grouped_matmul"] = "megablox"
        if block == "qwen3_moe":
            d_ff = fields["expert_d_ff"]  # MaxText sets base_mlp_dim to base_moe_mlp_dim: no dense MLP remains
        if len(acts) == 1 and (fields["n_shared_experts"] or fields["first_dense_layers"]):
            raise ConfigError(f"{where}: mlp_activations {acts!r} with shared_experts {fields['n_shared_experts']} / "
                              f"first_num_dense_layers {fields['first_dense_layers']}: MaxText's routed experts are "
                              "always gated (wi_0, wi_1) and its dense MLPs are not, which one model.mlp cannot hold; "
                              f"use mlp_activations [{acts[0]}, linear]")
    elif block in MOE_BLOCKS:
        raise ConfigError(f"{where}: decoder_block {block} builds mixture-of-experts layers and needs num_experts "
                          f"> 1, got {n_experts}")
    else:
        for key in ("shared_experts", "first_num_dense_layers"):
            if d[key] != BASE_DEFAULTS[key]:
                raise ConfigError(f"{where}: {key} {d[key]!r} without a mixture of experts has no paxsearch "
                                  "equivalent; remove it")
    if mla:
        if block != "deepseek":
            raise ConfigError(f"{where}: attention_type mla (multi-head latent attention) is built by decoder_block "
                              f"deepseek only, not {block}")
        if kv != heads:
            raise ConfigError(f"{where}: attention_type mla up-projects keys and values for every query head: "
                              f"base_num_kv_heads must be base_num_query_heads {heads}, got {kv}")
        dims = {k: _int(d, k, least=0 if k == "q_lora_rank" else 1)
                for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")}
        fields.update(attention_type="mla", **dims)
        head_dim = dims["qk_nope_head_dim"] + dims["qk_rope_head_dim"]
    else:
        head_dim = _int(d, "head_dim")
    try:
        return ModelConfig(
            vocab_size=_int(d, "vocab_size"), d_model=_int(d, "base_emb_dim"),
            n_layers=_int(d, "base_num_decoder_layers"), n_heads=heads, n_kv_heads=None if kv == heads else kv,
            head_dim=head_dim, d_ff=d_ff, seq_len=_int(d, "max_target_length"),
            mlp="gated" if len(acts) == 2 or n_experts > 1 else "dense",  # routed experts: always gated
            activation=acts[0], block=BLOCKS[block], position="rope",
            rope_theta=float(theta), tie_embeddings=d["logits_via_embedding"], dtype="bfloat16",
            param_dtype="float32", scan_layers=True, attention="auto", **fields)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None


def _moe(d: dict, where: str, block: str, n_experts: int, d_ff: int) -> dict[str, Any]:
    """ModelConfig's mixture-of-experts fields of a yml with num_experts > 1 (module docstring)."""
    if block not in MOE_BLOCKS:
        raise ConfigError(f"{where}: num_experts={n_experts} (mixture of experts) in decoder_block {block}, which "
                          f"MaxText builds without MoE layers; use decoder_block {', '.join(MOE_BLOCKS)}")
    k = _int(d, "num_experts_per_tok")
    if k > n_experts:
        raise ConfigError(f"{where}: num_experts_per_tok {k} exceeds num_experts {n_experts}")
    width = _int(d, "base_moe_mlp_dim", least=-1)
    if width < 1:
        raise ConfigError(f"{where}: base_moe_mlp_dim {width} (the experts' width) must be set to a positive integer "
                          "with num_experts > 1")
    if block == "mixtral" and width != d_ff:
        raise ConfigError(f"{where}: decoder_block mixtral's experts are base_mlp_dim {d_ff} wide and MaxText requires "
                          f"base_moe_mlp_dim equal to it, got {width}")
    shared, dense = _int(d, "shared_experts", least=0), _int(d, "first_num_dense_layers", least=0)
    if block != "deepseek" and (shared or dense):
        raise ConfigError(f"{where}: shared_experts {shared} / first_num_dense_layers {dense}: decoder_block {block} "
                          "builds neither (MaxText's deepseek block does); set them to 0 or use decoder_block deepseek")
    score, bias = d["routed_score_func"], d["routed_bias"]
    if block != "deepseek":
        if score != "" or bias:
            raise ConfigError(f"{where}: routed_score_func {score!r} / routed_bias {bias} in decoder_block {block}: no "
                              "paxsearch router scores that way (ours: softmax top-k renormalized, as routed_score_func"
                              " ''); remove them")
        router = "softmax"
    elif (score, bias) == ("sigmoid", True):
        router = "sigmoid"
    elif (score, bias) == ("softmax", False):
        router = "softmax"
    else:
        raise ConfigError(f"{where}: routed_score_func {score!r} with routed_bias {bias} has no paxsearch router; use "
                          "sigmoid with routed_bias true (router 'sigmoid') or softmax with routed_bias false")
    capacity = not d["sparse_matmul"] and d["capacity_factor"] > 0
    fields: dict[str, Any] = dict(
        n_experts=n_experts, experts_per_token=k, expert_d_ff=width, n_shared_experts=shared, first_dense_layers=dense,
        router=router, load_balance_weight=float(k * d["load_balance_loss_weight"]),
        expert_compute="capacity" if capacity else "dropless")
    for key in ("load_balance_loss_weight", "routed_bias_update_rate"):
        if d[key] < 0:
            raise ConfigError(f"{where}: {key} {d[key]} must be >= 0")
    if capacity:
        fields["capacity_factor"] = float(d["capacity_factor"])
    return fields


def load(path: str) -> ModelConfig:
    """The ModelConfig of the MaxText model yml at `path` (ConfigError, one line, on any problem;
    a UserWarning, one line, naming the gaps: values read and not applied)."""
    import yaml  # type: ignore[import-untyped]

    try:
        with open(path) as f:
            doc = yaml.safe_load(f)
    except OSError as e:
        raise ConfigError(f"cannot read MaxText yml {path}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"MaxText yml {path} is not plain YAML data: {first}") from None
    where = f"MaxText yml {os.path.basename(path)}"
    model = from_dict(doc, where)
    missing = gaps(doc, where)
    if missing:
        warnings.warn(f"{where} read with gaps (not modeled; the matmuls and their shapes are the same): "
                      + "; ".join(missing), stacklevel=2)
    return model

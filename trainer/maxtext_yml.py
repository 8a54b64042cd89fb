"""A MaxText model yml (its configs/models/*.yml, e.g. llama3-8b.yml) as a ModelConfig.

    cfg = load("configs/models/llama3-8b.yml")    # presets.get("maxtext:PATH") calls this

Only data is read (yaml.safe_load: no tags, nothing that names code). Every key must be one
this module knows: a model key maps to a ModelConfig field, a key outside the model (optimizer,
run and data settings MaxText lets a model file set) is listed in NOT_MODEL and left to the
search's own config; any other key, or a value with no paxsearch equivalent (a decoder block
other than llama2 / mistral / default, dropout on, mixture of experts), is a ConfigError naming
the key. The model trains as the presets do: bfloat16 activations, float32 parameters,
scanned layers, attention "auto". Keys the yml leaves out take base.yml's values
(BASE_DEFAULTS: MaxText 0.2.5's configs/base.yml). normalization_layer_epsilon is read and not
applied: our RMSNorm's epsilon is fixed at 1e-6 (MaxText's llama ymls say 1e-5).
"""
from __future__ import annotations

import os
from typing import Any

from .config import ModelConfig
from .errors import ConfigError

# base.yml's values of the model keys a model yml may leave out
BASE_DEFAULTS: dict[str, Any] = {"max_target_length": 2048, "logits_via_embedding": False,
                                 "rope_max_timescale": 10_000, "decoder_block": "llama2", "vocab_size": 32_000}
REQUIRED = ("base_emb_dim", "base_num_query_heads", "base_num_decoder_layers", "base_mlp_dim", "head_dim",
            "mlp_activations")
# MaxText decoder blocks our model builds: llama2 / mistral (sequential RMSNorm pre-norm, RoPE; mistral
# adds a sliding window only when one is set), default (MaxText's parallel block)
BLOCKS = {"llama2": "sequential", "mistral": "sequential", "default": "parallel"}
ACTIVATIONS = ("gelu", "silu", "relu")
# keys that a model yml may set and that are not the model (left to the search's config), or that
# are the model's defaults here
NOT_MODEL = frozenset({
    "model_name", "enable_dropout", "dropout_rate", "normalization_layer_epsilon", "opt_type", "adam_b1", "adam_b2",
    "adam_eps", "adam_eps_root", "adam_weight_decay", "gradient_clipping_threshold", "learning_rate",
    "per_device_batch_size", "steps", "tokenizer_path", "tokenizer_type", "dtype", "weight_dtype", "scan_layers",
    "num_experts", "num_experts_per_tok", "sliding_window_size", "base_moe_mlp_dim"})


def _int(doc: dict, key: str) -> int:
    value = doc[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"MaxText yml key {key}: {value!r} is not a positive integer")
    return value


def from_dict(doc: dict, where: str = "MaxText yml") -> ModelConfig:
    """The ModelConfig of a parsed MaxText model yml (see the module docstring)."""
    if not isinstance(doc, dict):
        raise ConfigError(f"{where} is not a mapping of MaxText keys")
    known = set(BASE_DEFAULTS) | set(REQUIRED) | {"base_num_kv_heads"} | NOT_MODEL
    unknown = sorted(k for k in doc if k not in known)
    if unknown:
        raise ConfigError(f"{where}: MaxText key(s) {', '.join(map(str, unknown))} have no paxsearch equivalent; "
                          f"remove them to import the rest (known: {', '.join(sorted(known))})")
    missing = [k for k in REQUIRED if k not in doc]
    if missing:
        raise ConfigError(f"{where}: missing MaxText key(s) {', '.join(missing)}")
    if doc.get("enable_dropout") or doc.get("dropout_rate"):
        raise ConfigError(f"{where}: dropout (enable_dropout / dropout_rate) has no paxsearch equivalent; set "
                          "enable_dropout: false")
    if (doc.get("num_experts") or 1) > 1:
        raise ConfigError(f"{where}: num_experts={doc['num_experts']} (mixture of experts) has no paxsearch "
                          "equivalent")
    d = {**BASE_DEFAULTS, **doc}
    block = d["decoder_block"]
    if block not in BLOCKS:
        raise ConfigError(f"{where}: decoder_block {block!r} has no paxsearch equivalent; "
                          f"choose one of {', '.join(BLOCKS)}")
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
    for key in ("logits_via_embedding",):
        if not isinstance(d[key], bool):
            raise ConfigError(f"{where}: {key} {d[key]!r} is not true or false")
    return ModelConfig(
        vocab_size=_int(d, "vocab_size"), d_model=_int(d, "base_emb_dim"), n_layers=_int(d, "base_num_decoder_layers"),
        n_heads=heads, n_kv_heads=None if kv == heads else kv, head_dim=_int(d, "head_dim"),
        d_ff=_int(d, "base_mlp_dim"), seq_len=_int(d, "max_target_length"), mlp="gated" if len(acts) == 2 else "dense",
        activation=acts[0], block=BLOCKS[block], position="rope", rope_theta=float(theta),
        tie_embeddings=d["logits_via_embedding"], dtype="bfloat16", param_dtype="float32", scan_layers=True,
        attention="auto")


def load(path: str) -> ModelConfig:
    """The ModelConfig of the MaxText model yml at `path` (ConfigError, one line, on any problem)."""
    import yaml  # type: ignore[import-untyped]

    try:
        with open(path) as f:
            doc = yaml.safe_load(f)
    except OSError as e:
        raise ConfigError(f"cannot read MaxText yml {path}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"MaxText yml {path} is not plain YAML data: {first}") from None
    return from_dict(doc, f"MaxText yml {os.path.basename(path)}")

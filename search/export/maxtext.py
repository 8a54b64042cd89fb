"""A TrainConfig as MaxText 0.2.5 config overrides (key=value on the command line after base.yml).

    keys, notes = overrides(cfg, target)        # [(key, value text)], Notes
    print(command(cfg, target, run_name="x"))   # a shell script: env, comments, the command

Names are MaxText 0.2.5's base.yml keys (read from the installed package). What has no
MaxText form: a model knob that changes the math (learned absolute positions, exact GELU) is
refused in one line (ExportRefused); a layout or run knob (our "default" activation rules, our
data task, ZeRO-1) becomes a visible "# dropped ..." / "# approximated ..." comment.

Correspondences (ours -> MaxText):
- block sequential -> decoder_block=llama2 (RMSNorm pre-norm, RoPE); parallel -> default (one
  norm, x + attn + mlp, MaxText's own decoder layer). mlp gated -> two mlp_activations
  [act, "linear"] (their product); dense -> one. position must be rope.
- batch: MaxText's per_device_batch_size counts every chip (tensor, stage and context too) and
  one microbatch of gradient accumulation: global_batch / (grad_accum_steps x chips).
- mesh axes data, stage, fsdp, context, tensor -> ici_/dcn_ data, pipeline, fsdp, context,
  tensor _parallelism (every axis written, for base.yml's dcn_data_parallelism is -1; expert too
  for a mixture of experts).
- pipeline: num_pipeline_microbatches, num_layers_per_pipeline_stage = n_layers / (stages x
  repeats) (MaxText's repeats are n_layers / (stages x that): circular when > 1).
- remat: full -> full; every tagged policy (qkv_proj, minimal, offload, custom) -> remat_policy=
  custom with each tensor's choice (MaxText's names; device / offload / remat); none -> every
  tensor saved ("device"), approximated; dots / dots_no_batch -> the projections saved,
  approximated (MaxText has no policy saving the attention's batched dots).
- attention auto -> flash on TPU/GPU targets, dot_product elsewhere (as ours resolves it).
- quantization int8 -> quantization=int8 (AQT) with quantization_local_shard_count=1 (one
  range over the whole batch for the weight-gradient matmul, as ours); int8_fwd -> int8 with
  quantization_local_shard_count=0 (MaxText's weight-gradient matmul in bf16, its input-gradient
  matmul still int8), approximated. AQT rounds the gradients stochastically, ours to nearest.
- optimizer: AdamW with linear warm-up and cosine decay to end_lr_ratio on both sides.

Mixtures of experts (model.n_experts > 0) and multi-head latent attention (attention_type "mla"):
the inverse of trainer/maxtext_yml.py, which reads these keys back into the same ModelConfig (the
expert width spelled out: expert_d_ff 0 comes back as d_ff). Per field (ModelConfig.MOE_FIELDS):
- decoder_block: deepseek when the model has shared experts, leading dense layers, the sigmoid
  router or MLA (the block MaxText builds them in); otherwise mixtral when the experts are d_ff
  wide (MaxText requires base_moe_mlp_dim = base_mlp_dim there), qwen3_moe when not (MaxText then
  sets base_mlp_dim to base_moe_mlp_dim: our d_ff is used by no layer of such a model).
- n_experts -> num_experts, experts_per_token -> num_experts_per_tok, expert_d_ff (0: d_ff) ->
  base_moe_mlp_dim, n_shared_experts -> shared_experts and first_dense_layers ->
  first_num_dense_layers (deepseek; MaxText's one shared MLP of shared_experts x base_moe_mlp_dim is
  our n_shared_experts experts, the same parameters and FLOPs).
- router softmax: the mixtral / qwen3_moe blocks' own routing (softmax of the top-k logits = ours);
  in the deepseek block routed_score_func=softmax, routed_bias=false, approximated (that block leaves
  the top-k softmax weights unnormalized). sigmoid: routed_score_func=sigmoid, routed_bias=true,
  approximated (MaxText takes the weights before the bias only under a model_name deepseek3-*, which
  this export does not set, and moves the bias by routed_bias_update_rate, base.yml 0, not by our
  load error).
- load_balance_weight -> load_balance_loss_weight = load_balance_weight / experts_per_token (MaxText's
  loss counts a token's k routes, k x ours); approximated when > 0 (MaxText's is per sequence).
- expert_compute dropless -> sparse_matmul=true, capacity_factor=-1; capacity -> sparse_matmul=false
  with capacity_factor, approximated (MaxText sizes each sequence's expert buffers, ours each
  device's: the same slots in all, other tokens dropped).
- grouped_matmul megablox -> megablox=true (the same Pallas kernel at MaxText's default tiles);
  auto and ragged_dot -> megablox=false (jax.lax.ragged_dot, what "auto" is on TPU and GPU; it is
  read back as "auto").
- the mesh axis expert -> ici_/dcn_expert_parallelism.
- refused in one line (no MaxText key): moe_every > 1 (MaxText's MoE blocks make every layer after
  the dense ones MoE), mlp dense with experts (MaxText's experts are always gated: wi_0, wi_1), a
  parallel block with experts (MaxText's default block has no MoE layer), and MLA in a dense model
  (MaxText builds MLA in its deepseek block only, whose layers are MoE).
- MLA: attention_type=mla, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim,
  v_head_dim one to one, head_dim their query/key sum (MaxText's MLA ignores it), and
  max_position_embeddings = original_max_position_embeddings = seq_len, so that MaxText applies no
  YaRN softmax scale (it does whenever the first exceeds the second, as base.yml has them).
"""
from __future__ import annotations

import math
import shlex

from ...trainer import flagsets
from ...trainer import remat as remat_lib
from ...trainer.config import ModelConfig, TrainConfig, expert_width
from .common import ExportRefused, Notes, axis_sizes, global_batch

TRAIN_MODULE = "maxtext.trainers.pre_train.train"
COMPILE_MODULE = "maxtext.trainers.pre_train.train_compile"

# our mesh axis -> MaxText's parallelism name (ici_<name>_parallelism, dcn_<name>_parallelism)
AXES = {"data": "data", "stage": "pipeline", "fsdp": "fsdp", "context": "context", "tensor": "tensor"}
# our remat tensor tag -> MaxText's remat_policy=custom keys; a gated MLP's two input matmuls
# are MaxText's mlpwi_0 and mlpwi_1 (ours tags both mlp1)
TENSORS = {"decoder_input": ("decoder_layer_input",), "query_proj": ("query_proj",), "key_proj": ("key_proj",),
           "value_proj": ("value_proj",), "context": ("context",), "out_proj": ("out_proj",),
           "mlp1": ("mlpwi", "mlpwi_0", "mlpwi_1"), "mlp2": ("mlpwo",)}
CHOICE = {"recompute": "remat", "device": "device", "offload": "offload"}
NORM_EPSILON = "1e-06"  # trainer/model.py RMSNorm
ACTIVATIONS = {"gelu": "gelu", "silu": "silu", "relu": "relu"}  # flax.linen names (gelu: tanh approximation)


def _bool(v: bool) -> str:
    return "true" if v else "false"


def _number(v: float) -> str:
    """An integral value as an integer (MaxText's integer keys, e.g. rope_max_timescale), else exactly."""
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def _custom_remat(choices: dict[str, str]) -> list[tuple[str, str]]:
    out = [("remat_policy", "custom")]
    for ours, theirs in TENSORS.items():
        out += [(key, CHOICE[choices[ours]]) for key in theirs]
    return out


def remat_keys(name: str, notes: Notes) -> list[tuple[str, str]]:
    """remat_policy (and the custom tensors' choices) for our policy `name`."""
    if name == "full":
        return [("remat_policy", "full")]
    if name.startswith(remat_lib.CUSTOM):
        return _custom_remat(remat_lib.parse_custom(name))
    named = {"qkv_proj": ("query_proj", "key_proj", "value_proj", "out_proj"),
             "minimal": ("query_proj", "key_proj", "value_proj", "context", "out_proj", "mlp2")}
    if name in named or name == "offload":
        saved = named.get(name) or named["minimal"]
        kind = "offload" if name == "offload" else "device"
        return _custom_remat({t: kind if t in saved else "recompute" for t in remat_lib.TENSORS})
    if name == "none":
        notes.approx("remat=none", "MaxText has no policy saving everything; every tagged tensor is saved "
                                   "(remat_policy=custom, all device), the untagged ones (norms, attention scores) "
                                   "are recomputed: more compute and less memory than ours")
        return _custom_remat(dict.fromkeys(remat_lib.TENSORS, "device"))
    if name in ("dots", "dots_no_batch"):
        notes.approx(f"remat={name}", "MaxText has no policy saving every matmul output; the projections and MLP "
                                      "matmuls are saved (remat_policy=custom), the attention's batched dots are "
                                      "recomputed" + ("" if name == "dots_no_batch" else " (ours saves them)"))
        saved = ("query_proj", "key_proj", "value_proj", "out_proj", "mlp1", "mlp2")
        return _custom_remat({t: "device" if t in saved else "recompute" for t in remat_lib.TENSORS})
    raise ExportRefused(f"remat policy {name!r} has no MaxText form; choose full, minimal, qkv_proj, offload, none, "
                        "dots or a custom:... policy")


def decoder_block(m: ModelConfig) -> str:
    """MaxText's decoder_block for model `m` (the module docstring); ExportRefused, one line, for a
    mixture of experts or an MLA model that no MaxText block builds."""
    if not m.n_experts:
        if m.attention_type == "mla":
            raise ExportRefused("model.attention_type='mla' in a dense model (n_experts=0) has no MaxText form: "
                                "MaxText builds multi-head latent attention only in its deepseek decoder block, whose "
                                "layers after first_num_dense_layers are MoE; set model.n_experts > 0 or "
                                "attention_type='mha'")
        return "default" if m.block == "parallel" else "llama2"
    if m.block == "parallel":
        raise ExportRefused("model.block='parallel' with a mixture of experts (n_experts > 0) has no MaxText form: its "
                            "parallel ('default') decoder block has no MoE layer; use block='sequential'")
    if m.mlp != "gated":
        raise ExportRefused(f"model.mlp={m.mlp!r} with a mixture of experts has no MaxText form: MaxText's experts are "
                            "always gated (wi_0, wi_1); use mlp='gated' to export to MaxText")
    if m.moe_every != 1:
        raise ExportRefused(f"model.moe_every={m.moe_every} (dense and MoE layers interleaved) has no MaxText form: "
                            "its MoE decoder blocks make every layer after first_num_dense_layers MoE; use "
                            "moe_every=1 (and first_dense_layers for leading dense layers)")
    if m.n_shared_experts or m.first_dense_layers or m.router == "sigmoid" or m.attention_type == "mla":
        return "deepseek"
    return "mixtral" if expert_width(m) == m.d_ff else "qwen3_moe"


def per_route_weight(weight: float, k: int) -> str:
    """MaxText's load_balance_loss_weight for our `weight` with k routes a token: weight / k, written
    so that k x the value read back is `weight` exactly where a neighbouring float allows it."""
    x = weight / k
    for v in (x, math.nextafter(x, math.inf), math.nextafter(x, -math.inf)):
        if k * v == weight:
            return repr(v)
    return repr(x)


def moe_keys(m: ModelConfig, block: str, notes: Notes) -> list[tuple[str, str]]:
    """The mixture-of-experts keys of `m` in decoder block `block` (empty for a dense model; the
    module docstring has the mapping and the approximations, each a note)."""
    if not m.n_experts:
        return []
    k = m.experts_per_token
    keys = [("num_experts", str(m.n_experts)), ("num_experts_per_tok", str(k)),
            ("base_moe_mlp_dim", str(expert_width(m)))]
    if block == "deepseek":
        keys += [("shared_experts", str(m.n_shared_experts)), ("first_num_dense_layers", str(m.first_dense_layers))]
        if m.router == "sigmoid":
            keys += [("routed_score_func", "sigmoid"), ("routed_bias", "true")]
            notes.approx("model.router='sigmoid'", "MaxText's deepseek block takes the routing weights before the "
                                                   "routing bias only under a model_name deepseek3-*, which this "
                                                   "export leaves 'default' (its weights include the bias), and moves "
                                                   "the bias by routed_bias_update_rate (base.yml 0), ours by the "
                                                   "load error (trainer/moe.py)")
        else:
            keys += [("routed_score_func", "softmax"), ("routed_bias", "false")]
            notes.approx("model.router='softmax'", "MaxText's deepseek block keeps the top-k softmax weights "
                                                   "unnormalized; ours renormalizes them to sum to 1")
    keys.append(("load_balance_loss_weight", per_route_weight(m.load_balance_weight, k)))
    if m.load_balance_weight:
        notes.approx(f"model.load_balance_weight={m.load_balance_weight:g}",
                     f"MaxText's load_balance_loss_weight (= ours / experts_per_token {k}: it counts each of a "
                     "token's routes) weighs a loss taken per sequence; ours is over the step's tokens")
    if m.expert_compute == "capacity":
        keys += [("sparse_matmul", "false"), ("capacity_factor", repr(float(m.capacity_factor)))]
        notes.approx(f"model.capacity_factor={m.capacity_factor:g}",
                     "MaxText's expert capacity is per sequence (ceil(k x seq_len / experts) x capacity_factor "
                     "slots), ours per device's tokens: the same slots in all, other tokens dropped")
    else:
        keys += [("sparse_matmul", "true"), ("capacity_factor", "-1.0"),
                 ("megablox", _bool(m.grouped_matmul == "megablox"))]
    return keys


def mla_keys(m: ModelConfig) -> list[tuple[str, str]]:
    """The multi-head latent attention keys of `m` (empty for attention_type "mha")."""
    if m.attention_type != "mla":
        return []
    keys = [("attention_type", "mla")]
    keys += [(name, str(getattr(m, name))) for name in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                                                        "qk_rope_head_dim", "v_head_dim")]
    # equal: MaxText's MLA scales the softmax by YaRN's mscale whenever the first exceeds the second
    return keys + [("max_position_embeddings", str(m.seq_len)), ("original_max_position_embeddings", str(m.seq_len))]


def model_keys(cfg: TrainConfig, platform: str, notes: Notes) -> list[tuple[str, str]]:
    m = cfg.model
    if m.position != "rope":
        raise ExportRefused(f"model.position={m.position!r} (learned absolute positions) has no MaxText form: its "
                            "decoder blocks use RoPE; use position='rope' to export to MaxText")
    if m.activation not in ACTIVATIONS:
        raise ExportRefused(f"model.activation={m.activation!r} has no MaxText form (its 'gelu' is the tanh "
                            f"approximation); use one of {', '.join(ACTIVATIONS)} to export to MaxText")
    acts = [ACTIVATIONS[m.activation]] + (["linear"] if m.mlp == "gated" else [])
    attention = m.attention
    if attention == "auto":
        attention = "flash" if platform in ("tpu", "gpu") else "dot_product"
    if m.attention_block != 128 and attention == "flash":
        notes.drop(f"model.attention_block={m.attention_block}", "the block of our CPU blockwise attention; "
                                                                 "MaxText's flash kernels choose their own blocks")
    block = decoder_block(m)
    keys = [
        ("decoder_block", block),
        ("base_emb_dim", str(m.d_model)), ("base_num_query_heads", str(m.n_heads)),
        ("base_num_kv_heads", str(m.kv_heads)), ("head_dim", str(m.head_dim)), ("base_mlp_dim", str(m.d_ff)),
        ("base_num_decoder_layers", str(m.n_layers)), ("mlp_activations", "[" + ",".join(acts) + "]"),
        ("vocab_size", str(m.vocab_size)), ("max_target_length", str(m.seq_len)),
        ("logits_via_embedding", _bool(m.tie_embeddings)), ("rope_max_timescale", _number(m.rope_theta)),
        # our RMSNorm's epsilon (trainer/model.py); MaxText divides tied logits by sqrt(d_model) unless told not to
        ("normalization_layer_epsilon", NORM_EPSILON), ("normalize_embedding_logits", "false"),
        ("dtype", m.dtype), ("weight_dtype", m.param_dtype), ("scan_layers", _bool(m.scan_layers)),
        ("attention", attention), ("enable_dropout", "false"),
    ]
    if m.vocab_tiles > 1:
        keys.append(("num_vocab_tiling", str(m.vocab_tiles)))
    keys += moe_keys(m, block, notes) + mla_keys(m)
    if m.quantization == "int8":
        keys += [("quantization", "int8"), ("quantization_local_shard_count", "1")]
    elif m.quantization == "int8_fwd":
        notes.approx("model.quantization='int8_fwd'", "MaxText has no forward-only int8; quantization=int8 with "
                                                      "quantization_local_shard_count=0 keeps only its weight-gradient "
                                                      "matmul in bf16, the input-gradient matmul stays int8")
        keys += [("quantization", "int8"), ("quantization_local_shard_count", "0")]
    return keys


def mesh_keys(cfg: TrainConfig, num_devices: int, num_slices: int, notes: Notes) -> list[tuple[str, str]]:
    ici, dcn = axis_sizes(cfg, num_devices)
    axes = {**AXES, "expert": "expert"} if cfg.model.n_experts else AXES  # our expert axis is MaxText's
    keys = [(f"ici_{theirs}_parallelism", str(ici[ours])) for ours, theirs in axes.items()]
    keys += [(f"dcn_{theirs}_parallelism", str(dcn[ours])) for ours, theirs in axes.items()]
    if num_slices > 1:
        keys.append(("num_slices", str(num_slices)))
    rows = global_batch(cfg, ici, dcn)
    per_chip = rows / (cfg.grad_accum_steps * num_devices)
    keys.append(("per_device_batch_size", f"{per_chip:g}"))
    if cfg.grad_accum_steps > 1:
        keys.append(("gradient_accumulation_steps", str(cfg.grad_accum_steps)))
    stages = ici["stage"] * dcn["stage"]
    if stages > 1:
        p = cfg.pipeline
        keys += [("num_pipeline_microbatches", str(p.microbatches)),
                 ("num_layers_per_pipeline_stage", str(cfg.model.n_layers // (stages * p.repeats)))]
    tensor = ici["tensor"] * dcn["tensor"]
    if cfg.mesh.rules == "default" and tensor > 1:
        notes.drop("mesh.rules='default'", "MaxText shards the activations' embed dim over tensor, as our "
                                           "'sequence_parallel' rules do; ours kept it replicated")
    elif cfg.mesh.rules not in ("default", "sequence_parallel"):
        notes.drop(f"mesh.rules={cfg.mesh.rules!r}", "MaxText's own logical-axis rules apply")
    return keys


def optimizer_keys(cfg: TrainConfig, notes: Notes) -> list[tuple[str, str]]:
    o = cfg.optimizer
    decay = o.decay_steps or cfg.steps
    keys = [("opt_type", "adamw"), ("learning_rate", f"{o.peak_lr:g}"),
            ("warmup_steps_fraction", f"{o.warmup_steps / max(decay, 1):g}"),
            ("learning_rate_schedule_steps", str(decay)),
            ("learning_rate_final_fraction", f"{o.end_lr_ratio:g}"),
            ("adam_b1", f"{o.b1:g}"), ("adam_b2", f"{o.b2:g}"), ("adam_eps", f"{o.eps:g}"),
            ("adam_weight_decay", f"{o.weight_decay:g}"), ("gradient_clipping_threshold", f"{o.clip_norm:g}")]
    if o.offload_state:
        keys.append(("optimizer_memory_host_offload", "true"))
    if cfg.offload_params:
        keys.append(("parameter_memory_host_offload", "true"))
    if o.zero1:
        keys.append(("shard_optimizer_over_data", "true"))
    return keys


def run_keys(cfg: TrainConfig, notes: Notes) -> list[tuple[str, str]]:
    d = cfg.data
    what = f"data.text_files={list(d.text_files)}" if d.text_files else f"data.task={d.task!r}"
    notes.drop(what, "MaxText reads its own datasets; dataset_type=synthetic here, set dataset_type / dataset_path "
                     "for real data")
    ck = cfg.checkpoint
    keys = [("steps", str(cfg.steps)), ("dataset_type", "synthetic"),
            ("enable_checkpointing", _bool(ck.enabled)), ("log_period", str(cfg.log.every_steps)),
            ("init_weights_seed", str(cfg.seed))]
    if ck.enabled and ck.every_steps:
        keys.append(("checkpoint_period", str(ck.every_steps)))
    if cfg.eval.enabled and cfg.eval.every_steps:
        keys.append(("eval_interval", str(cfg.eval.every_steps)))
    return keys


def overrides(cfg: TrainConfig, platform: str, num_devices: int, num_slices: int = 1) -> tuple[list[tuple[str, str]],
                                                                                               Notes]:
    """MaxText key=value overrides of `cfg` on `num_devices` devices of `platform` in `num_slices`
    slices, and the notes of what they leave out. ExportRefused (one line) on a model knob
    MaxText cannot express."""
    notes = Notes()
    keys = model_keys(cfg, platform, notes)
    keys += mesh_keys(cfg, num_devices, num_slices, notes)
    keys += remat_keys(cfg.remat, notes)
    keys += optimizer_keys(cfg, notes)
    keys += run_keys(cfg, notes)
    return keys, notes


def flag_env(cfg: TrainConfig, platform: str) -> dict[str, str]:
    """The config's compiler flag set as the variables the platform reads: LIBTPU_INIT_ARGS on TPU
    (with any XLA_FLAGS that are not GPU-only), XLA_FLAGS elsewhere. Empty for "default"."""
    s = flagsets.check(cfg.flags)
    xla = [f for f in s.xla_flags if platform not in ("tpu", "cpu") or not f.startswith("--xla_gpu_")]
    env = {"XLA_FLAGS": " ".join(xla)}
    if platform == "tpu":
        env["LIBTPU_INIT_ARGS"] = " ".join(s.libtpu_init_args)
    return {k: v for k, v in env.items() if v}


def argv(keys: list[tuple[str, str]], run_name: str, base_yml: str) -> list[str]:
    """MaxText's arguments after `python -m <module>`: base.yml, run_name, the overrides."""
    return [base_yml, f"run_name={run_name}", *(f"{k}={v}" for k, v in keys)]


CONFIGS_DIR = ("${MAXTEXT_CONFIGS:-$(\"$PYTHON\" -c 'import maxtext, os; "
               "print(os.path.join(os.path.dirname(maxtext.__file__), \"configs\"))')}")


def command(cfg: TrainConfig, platform: str, num_devices: int, num_slices: int = 1, *, run_name: str,
            compile_topology: str | None = None, header: str = "") -> str:
    """A shell script that runs `cfg` with MaxText: every dropped or approximated knob as a
    comment, the flag set's environment, then MaxText's train; with the argument `compile` (and
    compile_topology, a TPU slice name such as v5e-4), MaxText's ahead-of-time train_compile of
    the same keys for that topology instead, on any machine with libtpu."""
    keys, notes = overrides(cfg, platform, num_devices, num_slices)
    lines = ["#!/bin/sh", "# MaxText 0.2.5 form of a paxsearch config" + (f": {header}" if header else "")]
    lines += [f"# {n}" for n in notes.lines]
    lines += ["# usage: sh THIS_FILE            train (PYTHON: the interpreter with maxtext; MAXTEXT_CONFIGS: "
              "its configs folder)"]
    if compile_topology:
        lines.append(f"#        sh THIS_FILE compile    compile only, for {compile_topology} x {num_slices} "
                     "slice(s) (MaxText's train_compile)")
    lines += ["set -e", 'PYTHON=${PYTHON:-python3}']
    lines += [f"export {k}={shlex.quote(v)}" for k, v in flag_env(cfg, platform).items()]
    lines.append(f"MODULE={TRAIN_MODULE}")
    if compile_topology:
        lines += ['if [ "${1:-}" = compile ]; then',
                  f"  MODULE={COMPILE_MODULE}",
                  f"  set -- compile_topology={compile_topology} compile_topology_num_slices={num_slices}",
                  "else", "  set --", "fi"]
    else:
        lines.append("set --")
    args = [shlex.quote(a) for a in argv(keys, run_name, "BASE")]
    args[0] = f'"{CONFIGS_DIR}/base.yml"'
    lines.append('"$PYTHON" -m "$MODULE" \\\n  ' + " \\\n  ".join(args) + ' \\\n  "$@"')
    return "\n".join(lines) + "\n"


def yaml_overrides(cfg: TrainConfig, platform: str, num_devices: int, num_slices: int = 1, *,
                   run_name: str, header: str = "") -> str:
    """The same overrides as a YAML file MaxText reads after base.yml (`base_config: base.yml`)."""
    keys, notes = overrides(cfg, platform, num_devices, num_slices)
    lines = ["# MaxText 0.2.5 overrides of a paxsearch config" + (f": {header}" if header else "")]
    lines += [f"# {n}" for n in notes.lines]
    for k, v in flag_env(cfg, platform).items():
        lines.append(f"# run with {k}={shlex.quote(v)}")
    lines += ['base_config: "base.yml"', f'run_name: "{run_name}"']
    for k, v in keys:
        lines.append(f"{k}: {_yaml_float(v) if v[:1] == '[' or _plain(v) else repr(v)}")
    return "\n".join(lines) + "\n"


def _yaml_float(v: str) -> str:
    """`v` as YAML reads it back: a number in exponent form gets its point ("1e-06" -> "1.0e-06"), without
    which YAML 1.1 (PyYAML, MaxText's loader) reads a string."""
    low = v.lower()
    if "e" in low and "." not in low and low.lstrip("+-")[:1].isdigit():
        mantissa, exponent = low.split("e", 1)
        return f"{mantissa}.0e{exponent if exponent[:1] in '+-' else '+' + exponent}"
    return v


def _plain(v: str) -> bool:
    try:
        float(v)
        return True
    except ValueError:
        return v in ("true", "false") or v.replace("_", "").isalnum()


__all__ = ["ExportRefused", "overrides", "command", "yaml_overrides", "argv"]

"""A TrainConfig as the fields of a Paxml experiment class (a Python snippet).

    print(snippet(cfg, "tpu", 16, class_name="C4SpmdChosen"))

The class derives from paxml.tasks.lm.params.c4.C4SpmdAdam (TransformerLmSpmdAdam on C4) and
sets the fields Paxml's LM experiments read: NUM_LAYERS, MODEL_DIMS, HIDDEN_DIMS, NUM_HEADS,
DIMS_PER_HEAD, VOCAB_SIZE, MAX_SEQ_LEN, PERCORE_BATCH_SIZE, ICI_MESH_SHAPE / DCN_MESH_SHAPE
(axes [replica, data, mdl] = our data, fsdp, tensor), CHECKPOINT_POLICY, FPROP_DTYPE, the
activation, embeddings and optimizer fields. A pipelined config derives from
TransformerLmSpmdPipelineAdam's family instead: NUM_STAGES, CIRCULAR_REPEAT, NUM_MICROBATCHES,
meshes [stage, replica, data, mdl].

What has no Paxml field is refused (ExportRefused, one line) when it changes the math: grouped
K/V heads, a parallel block, RoPE's theta other than 10000; and dropped with a comment line
when it does not: context parallelism is refused (it changes the mesh), offload, ZeRO-1,
vocabulary tiling, custom remat policies that match no AutodiffCheckpointType.

Mixtures of experts (model.n_experts > 0) and multi-head latent attention (model.attention_type
'mla') are refused, naming `--to maxtext` (which writes both). MLA has no Praxis layer. Praxis's
MoE layer (praxis.layers.transformers.TransformerFeedForwardMoe: num_experts, num_groups,
unadjusted_expert_capacity_factor, gating_func, moe_load_balance_loss_weight) has no exact mapping
of ours: its gating is GShard top-2 (or expert choice), not a softmax top-k for any k; it always
drops tokens past a capacity per routing group (num_groups, typically one a device), where our
"dropless" drops none and our "capacity" counts per device; its load-balancing loss is GShard's
(first choices' density); it has no sigmoid router, shared experts or leading dense layers; and
the C4 experiments this class derives from set no MoE field. An approximate export would train a
different model under the same name, so there is none.
"""
from __future__ import annotations

from ...trainer import flagsets
from ...trainer import remat as remat_lib
from ...trainer.config import TrainConfig
from .common import ExportRefused, Notes, axis_sizes, global_batch

# praxis.layers.AutodiffCheckpointType member of each of our policies; the sets of our tensor
# tags each saves (the tensors a custom policy with only "device" choices may equal)
POLICIES = {"none": "SAVE_EVERYTHING", "full": "SAVE_NOTHING", "dots": "SAVE_DOT_ONLY",
            "dots_no_batch": "SAVE_DOT_WITH_NO_BATCH_DIM", "qkv_proj": "SAVE_QKV_OUT_PROJ",
            "minimal": "SAVE_DOT_EXCEPT_LOGITS_FFN1"}
SAVED_SETS = {frozenset(): "SAVE_NOTHING", frozenset({"decoder_input"}): "SAVE_ITERATION_INPUT",
              frozenset({"query_proj", "key_proj", "value_proj", "out_proj"}): "SAVE_QKV_OUT_PROJ",
              frozenset({"out_proj"}): "SAVE_OUT_PROJ", frozenset({"context"}): "SAVE_CONTEXT",
              frozenset({"context", "out_proj"}): "SAVE_CONTEXT_AND_OUT_PROJ"}
ACTIVATIONS = {"gelu": "activations.GELU", "gelu_exact": "activations.GELU", "silu": "activations.SiLU",
               "relu": "activations.ReLU"}
DTYPES = {"float32": "jnp.float32", "bfloat16": "jnp.bfloat16"}


def checkpoint_policy(name: str, notes: Notes) -> str:
    if name in POLICIES:
        return POLICIES[name]
    choices = remat_lib.parse_custom(name) if name.startswith(remat_lib.CUSTOM) else None
    if name == "offload" or (choices and "offload" in choices.values()):
        notes.approx(f"remat={name!r}", "Paxml's checkpoint policies keep saved tensors on the device; "
                                        "exported without the offload")
        if choices is None:
            return POLICIES["minimal"]
    if choices is not None:
        saved = frozenset(t for t, c in choices.items() if c != "recompute")
        if saved in SAVED_SETS:
            return SAVED_SETS[saved]
        raise ExportRefused(f"remat policy {name!r} saves {', '.join(sorted(saved))}, which no Paxml "
                            f"AutodiffCheckpointType saves; choose one of {', '.join(POLICIES)} or a custom policy "
                            "saving decoder_input, context, out_proj, or q/k/v/out_proj")
    raise ExportRefused(f"remat policy {name!r} has no Paxml form; choose one of {', '.join(POLICIES)}")


def fields(cfg: TrainConfig, num_devices: int, notes: Notes) -> tuple[str, list[tuple[str, str]]]:
    """(base class, [(field, Python expression)]) of the experiment class for `cfg`."""
    m = cfg.model
    if m.n_experts:
        raise ExportRefused(f"model.n_experts={m.n_experts} (a mixture of experts) has no exact Paxml form (Praxis's "
                            "MoE layer routes GShard top-2 with per-group capacity); export with --to maxtext")
    if m.attention_type == "mla":
        raise ExportRefused("model.attention_type='mla' (multi-head latent attention) has no layer in Paxml's "
                            "TransformerLm experiments; export with --to maxtext, or search attention_type='mha'")
    if m.kv_heads != m.n_heads:
        raise ExportRefused(f"model.n_kv_heads={m.n_kv_heads} (grouped K/V heads) has no field in Paxml's "
                            "TransformerLm experiments; export with --to maxtext, or search n_kv_heads=None")
    if m.block != "sequential":
        raise ExportRefused(f"model.block={m.block!r} has no field in Paxml's TransformerLm experiments; export "
                            "with --to maxtext")
    if m.position == "rope" and m.rope_theta != 10_000.0:
        raise ExportRefused(f"model.rope_theta={m.rope_theta:g} has no field in Paxml's TransformerLm experiments "
                            "(its rotary embedding uses 10000); export with --to maxtext")
    ici, dcn = axis_sizes(cfg, num_devices)
    if ici["context"] * dcn["context"] > 1:
        raise ExportRefused("mesh axis context > 1 (sequence split over devices) has no Paxml mesh axis; "
                            "export with --to maxtext")
    rows = global_batch(cfg, ici, dcn)
    out = [
        ("NUM_LAYERS", str(m.n_layers)), ("MODEL_DIMS", str(m.d_model)), ("HIDDEN_DIMS", str(m.d_ff)),
        ("NUM_HEADS", str(m.n_heads)), ("DIMS_PER_HEAD", str(m.head_dim)), ("VOCAB_SIZE", str(m.vocab_size)),
        ("MAX_SEQ_LEN", str(m.seq_len)),
        # Paxml's global batch is PERCORE_BATCH_SIZE x every device (c4.py)
        ("PERCORE_BATCH_SIZE", repr(rows / num_devices if rows % num_devices else rows // num_devices)),
        ("FPROP_DTYPE", DTYPES.get(m.dtype, repr(m.dtype))),
        ("ACTIVATION_CLS", ACTIVATIONS[m.activation]), ("USE_GATED_ACTIVATION", repr(m.mlp == "gated")),
        ("USE_ROTARY_POSITION_EMB", repr(m.position == "rope")),
        ("TRAINABLE_POSITION_EMB", repr(m.position == "learned")),
        ("SEPARATE_EMBEDDING", repr(not m.tie_embeddings)), ("USE_REPEATED_LAYER", repr(m.scan_layers)),
        ("CHECKPOINT_POLICY", "layers.AutodiffCheckpointType." + checkpoint_policy(cfg.remat, notes)),
    ]
    if m.activation == "gelu":
        notes.approx("model.activation='gelu'", "Paxml's activations.GELU; set its approximate=True for the tanh "
                                                "form ours uses")
    if m.param_dtype != "float32":
        notes.drop(f"model.param_dtype={m.param_dtype!r}", "Paxml's C4 experiments keep float32 variables")
    if m.vocab_tiles > 1:
        notes.drop(f"model.vocab_tiles={m.vocab_tiles}", "Paxml computes the logits whole")
    if m.attention in ("flash", "auto"):
        notes.drop(f"model.attention={m.attention!r}", "Paxml's TPU experiments use its dot-product attention")
    if m.quantization != "none":
        notes.drop(f"model.quantization={m.quantization!r}", "the exported Paxml experiment trains in the compute "
                                                              "dtype (Paxml's int8 goes through its own AQT layers)")
    o = cfg.optimizer
    decay = o.decay_steps or cfg.steps
    out += [("LEARNING_RATE", repr(o.peak_lr)), ("WEIGHT_DECAY", repr(o.weight_decay)),
            ("ADAM_BETA1", repr(o.b1)), ("ADAM_BETA2", repr(o.b2)), ("ADAM_EPSILON", repr(o.eps)),
            ("CLIP_GRADIENT_NORM_TO_VALUE", repr(o.clip_norm)), ("LR_SCHEDULE", "'linear_rampup_cosine_decay'"),
            ("LR_COS_WARMUP", str(o.warmup_steps)), ("LR_COS_DECAY_START", str(o.warmup_steps + 1)),
            ("LR_COS_DECAY_END", str(decay)), ("LR_COS_MIN_RATIO", repr(o.end_lr_ratio)), ("LR_COS_MAX", "1.0")]
    for knob, on in (("optimizer.zero1", o.zero1), ("optimizer.offload_state", o.offload_state),
                     ("offload_params", cfg.offload_params)):
        if on:
            notes.drop(knob, "no field in Paxml's TransformerLm experiments")
    if cfg.grad_accum_steps > 1:
        notes.drop(f"grad_accum_steps={cfg.grad_accum_steps}", "set the Paxml task's "
                                                               "optimizer ShardedStaticAccumulator by hand")
    stages = ici["stage"] * dcn["stage"]
    mesh = ("data", "fsdp", "tensor")
    base = "c4.C4SpmdAdam"
    if stages > 1:
        base = "c4.C4SpmdPipelineAdam"
        mesh = ("stage", "data", "fsdp", "tensor")
        out += [("NUM_STAGES", str(stages)), ("CIRCULAR_REPEAT", str(cfg.pipeline.repeats)),
                ("NUM_MICROBATCHES", str(cfg.pipeline.microbatches))]
    out += [("ICI_MESH_SHAPE", repr([ici[a] for a in mesh])), ("DCN_MESH_SHAPE", repr([dcn[a] for a in mesh]))]
    return base, out


def snippet(cfg: TrainConfig, platform: str, num_devices: int, *, class_name: str = "PaxsearchChosen",
            header: str = "") -> str:
    """Python source of a registered Paxml experiment class with `cfg`'s fields."""
    notes = Notes()
    base, items = fields(cfg, num_devices, notes)
    env = {k: v for k, v in flagsets.env_for(cfg.flags, platform).items() if v}
    lines = [f'"""Paxml form of a paxsearch config{": " + header if header else ""}."""',
             "from jax import numpy as jnp", "from paxml import experiment_registry",
             "from paxml.tasks.lm.params import c4", "from praxis import layers",
             "from praxis.layers import activations", ""]
    lines += [f"# {n}" for n in notes.lines]
    lines += [f"# launch with {k}='{v}'" for k, v in env.items()]
    lines += ["", "@experiment_registry.register", f"class {class_name}({base}):"]
    lines += [f"  {k} = {v}" for k, v in items]
    return "\n".join(lines) + "\n"

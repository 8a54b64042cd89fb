"""Plain-dataclass configuration of the trainer.

Nothing here knows Fiddle or PyGlove: search/ builds these dataclasses through Fiddle
(`fdl.Config(TrainConfig, ...)`) and `fdl.build` turns that into the objects below.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Sequence

from .errors import ConfigError

# Mesh axes by name, outermost to innermost. Batch rows split over data x fsdp x expert; stage
# splits the layers (pipeline), context splits the sequence; tensor splits heads, MLP hidden and
# vocabulary; expert (innermost, the fastest links, as in MaxText) splits a MoE layer's experts and,
# outside the MoE layers, acts as one more batch / fsdp axis (trainer/moe.py). Shapes are read by
# name (mesh_shape / full_shape), never by position outside this module.
MESH_AXES = ("data", "stage", "fsdp", "context", "tensor", "expert")
# What a 3-entry shape means: the axes of releases before stage and context (ici=(1, 8, 1)).
LEGACY_MESH_AXES = ("data", "fsdp", "tensor")
# What a 5-entry shape means: the axes of releases before expert (ici=(1, 1, 8, 1, 1)).
DENSE_MESH_AXES = ("data", "stage", "fsdp", "context", "tensor")


def mesh_shape(**sizes: int) -> tuple[int, ...]:
    """A shape over MESH_AXES from sizes by name; unnamed axes are 1.
    `MeshConfig(ici=mesh_shape(stage=2, fsdp=-1))` is (1, 2, -1, 1, 1): with expert 1 the shape is
    written in its 5 entries (data, stage, fsdp, context, tensor), as before the expert axis, so a
    dense model's stored config is unchanged; mesh_shape(expert=4, fsdp=2) has all 6."""
    unknown = sorted(set(sizes) - set(MESH_AXES))
    if unknown:
        raise ValueError(f"unknown mesh axis {', '.join(unknown)}; the axes are {', '.join(MESH_AXES)}")
    axes = MESH_AXES if sizes.get("expert", 1) != 1 else DENSE_MESH_AXES
    return tuple(sizes.get(name, 1) for name in axes)


def full_shape(shape: Sequence[int]) -> tuple[int, ...]:
    """`shape` over MESH_AXES: one entry per axis as is; 3 entries (data, fsdp, tensor), as
    configs before the stage and context axes wrote them, with stage = context = expert = 1; 5
    entries (data, stage, fsdp, context, tensor), as before the expert axis, with expert = 1. The
    one place where a 3- or 5-entry shape is read. Other lengths are returned as they are (the
    mesh checks refuse them)."""
    shape = tuple(shape)
    if len(shape) == len(LEGACY_MESH_AXES):
        return tuple(dict(zip(LEGACY_MESH_AXES, shape, strict=True)).get(name, 1) for name in MESH_AXES)
    if len(shape) == len(DENSE_MESH_AXES):
        return tuple(dict(zip(DENSE_MESH_AXES, shape, strict=True)).get(name, 1) for name in MESH_AXES)
    return shape


def compact_shape(shape: Sequence[int]) -> tuple[int, ...]:
    """The inverse of full_shape where it has one: a full shape whose axes outside
    LEGACY_MESH_AXES are all 1 as its 3 entries (data, fsdp, tensor), one with expert 1 as its 5
    (data, stage, fsdp, context, tensor), else the full shape. Keys derived from shapes (search's
    plan keys) stay what earlier releases computed."""
    shape = full_shape(shape)
    named = dict(zip(MESH_AXES, shape, strict=True)) if len(shape) == len(MESH_AXES) else None
    if named is None:
        return shape
    if all(named[a] == 1 for a in MESH_AXES if a not in LEGACY_MESH_AXES):
        return tuple(named[a] for a in LEGACY_MESH_AXES)
    if named["expert"] == 1:
        return tuple(named[a] for a in DENSE_MESH_AXES)
    return shape


@dataclass(frozen=True)
class ModelConfig:
    """A decoder-only Transformer LM."""

    vocab_size: int = 384  # >= the data vocabulary (ByteVocabulary has 259 ids)
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    head_dim: int = 32
    d_ff: int = 512
    seq_len: int = 128
    dtype: str = "float32"  # activation dtype: "float32" | "bfloat16"
    param_dtype: str = "float32"  # "float32" | "bfloat16"
    scan_layers: bool = True  # layers under nn.scan: compile time flat in depth
    activation: str = "gelu"  # MLP activation: gelu (tanh approx.) | gelu_exact | silu | relu
    # "dense": act(x W1) W2 (GPT-2, 2 matrices); "gated": (act(x W_gate) * x W_up) W2 (3 matrices):
    # gated + silu is SwiGLU (Llama), gated + gelu is GeGLU.
    mlp: str = "dense"
    # "sequential": x += attn(norm1(x)); x += mlp(norm2(x)) (GPT-2, Llama); "parallel": one norm,
    # x += attn(norm(x)) + mlp(norm(x)) (GPT-J, PaLM, MaxText's "default" decoder block).
    block: str = "sequential"
    position: str = "learned"  # "learned" (absolute, GPT-2) | "rope" (rotary, Llama)
    rope_theta: float = 10_000.0
    n_kv_heads: int | None = None  # None: n_heads (MHA); 1: MQA; a divisor of n_heads: GQA
    tie_embeddings: bool = False  # the unembedding is the transposed embedding table
    # "dot_product": softmax(QK^T)V with the S x S scores in memory; "flash": the platform's
    # fused kernel (Pallas splash on TPU, cuDNN on GPU, blockwise online softmax on CPU);
    # "auto": flash where a fused kernel exists (TPU, GPU), dot_product elsewhere.
    attention: str = "auto"
    attention_block: int = 128  # key/query block of the CPU blockwise (flash) attention
    # vocab tiling: the unembedding and cross-entropy run over this many sequence chunks, one
    # at a time (a scan, rematerialized in the backward pass), so no B x S x V logits are held
    # at once; 1: the whole logits tensor (trainer/vocab_tiling.py)
    vocab_tiles: int = 1
    # int8 matmuls in the decoder layers' projections (trainer/quant.py): "none" | "int8" (forward
    # and both backward matmuls) | "int8_fwd" (forward only); the embedding and unembedding stay
    # in `dtype`, as in MaxText
    quantization: str = "none"
    # Mixture of experts (trainer/moe.py); n_experts = 0: a dense model, and the fields below are unused.
    # A MoE layer replaces the MLP by a router over n_experts experts (each a `mlp`-style MLP of
    # width expert_d_ff), of which experts_per_token (top-k) run per token, plus n_shared_experts
    # that every token runs. Layers 0 .. first_dense_layers - 1 stay dense (width d_ff); after them
    # every moe_every-th layer is MoE (Llama 4's interleave; 1: all of them).
    n_experts: int = 0
    experts_per_token: int = 2
    n_shared_experts: int = 0
    expert_d_ff: int = 0  # 0: d_ff
    first_dense_layers: int = 0
    moe_every: int = 1
    # "softmax": softmax over the router logits, top-k, the k weights renormalized (Mixtral, Qwen3);
    # "sigmoid": sigmoid scores, top-k chosen on scores + a routing bias, weights the chosen scores
    # normalized (DeepSeek V3's aux-loss-free balancing: trainer/moe.py says how the bias moves)
    router: str = "softmax"
    load_balance_weight: float = 0.01  # x the load-balancing loss, added to the training loss
    # "dropless": every routed token computed (jax.lax.ragged_dot over tokens sorted by expert);
    # "capacity": each expert takes at most capacity_factor x its even share of the tokens, the
    # rest dropped (the dropped fraction is a metric)
    expert_compute: str = "dropless"
    capacity_factor: float = 1.25
    # the dropless experts' grouped matmul (trainer/moe.py): "auto" (jax.lax.ragged_dot on TPU and GPU,
    # blocks of rows on XLA:CPU), "ragged_dot", or "megablox": the Pallas megablox kernel (MaxText's
    # megablox=True; TPU only, tiling 512 x 1024 x 1024 as MaxText's default). "capacity" takes "auto" only.
    grouped_matmul: str = "auto"
    # Attention (trainer/mla.py for "mla"): "mha", the Q/K/V projections per head above (multi-head,
    # grouped-query or multi-query by n_kv_heads); "mla", DeepSeek's multi-head latent attention
    # (MaxText's attention_type): queries through a rank-q_lora_rank latent (0: one projection, as
    # DeepSeek-V2-Lite), keys and values up-projected per head from one rank-kv_lora_rank latent
    # (RMSNorm on both latents), each query/key head qk_nope_head_dim wide plus a qk_rope_head_dim RoPE
    # part (the key's shared by all heads), value heads v_head_dim wide. With "mla", head_dim is the
    # query/key head dim and must be qk_nope_head_dim + qk_rope_head_dim, n_kv_heads None, position
    # "rope". The defaults of the four dims are MaxText's (configs/base.yml).
    attention_type: str = "mha"
    q_lora_rank: int = 0
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128

    def __post_init__(self):
        check_attention_type(self)

    @property
    def kv_heads(self) -> int:
        """The number of key/value heads (n_kv_heads, or n_heads when it is None)."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads


# The values ModelConfig's family fields accept (trainer/mesh.py checks them).
MLPS = ("dense", "gated")
BLOCKS = ("sequential", "parallel")
POSITIONS = ("learned", "rope")
ATTENTIONS = ("dot_product", "flash", "auto")
QUANTIZATIONS = ("none", "int8", "int8_fwd")  # trainer/quant.py checks it
ROUTERS = ("softmax", "sigmoid")  # trainer/moe.py checks these two
EXPERT_COMPUTES = ("dropless", "capacity")
GROUPED_MATMULS = ("auto", "ragged_dot", "megablox")  # trainer/moe.py checks them
# ModelConfig's mixture-of-experts fields: left out of a dense model's stored form (to_dict), so
# that its stored config reads as before they existed
MOE_FIELDS = ("n_experts", "experts_per_token", "n_shared_experts", "expert_d_ff", "first_dense_layers",
              "moe_every", "router", "load_balance_weight", "expert_compute", "capacity_factor", "grouped_matmul")


ATTENTION_TYPES = ("mha", "mla")
# ModelConfig's multi-head latent attention fields: left out of a standard ("mha") model's stored form
# (to_dict) and plan keys, so that its stored config reads as before they existed
MLA_FIELDS = ("attention_type", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


def check_attention_type(m: ModelConfig) -> None:
    """attention_type, and with "mla" its fields (ModelConfig.__post_init__): ConfigError, one line."""
    if m.attention_type not in ATTENTION_TYPES:
        raise ConfigError(f"unknown model.attention_type {m.attention_type!r}; choose one of "
                          f"{', '.join(ATTENTION_TYPES)}")
    if m.attention_type != "mla":
        return
    for name, least in (("q_lora_rank", 0), ("kv_lora_rank", 1), ("qk_nope_head_dim", 1), ("qk_rope_head_dim", 2),
                        ("v_head_dim", 1)):
        v = getattr(m, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < least:
            raise ConfigError(f"attention_type='mla' needs model.{name} an integer >= {least}"
                              f"{' (0: no query latent)' if name == 'q_lora_rank' else ''}, got {v!r}")
    qk = m.qk_nope_head_dim + m.qk_rope_head_dim
    if m.qk_rope_head_dim % 2:
        raise ConfigError(f"attention_type='mla' rotates pairs of the RoPE part: qk_rope_head_dim must be even, "
                          f"got {m.qk_rope_head_dim}")
    if m.head_dim != qk:
        raise ConfigError(f"attention_type='mla': head_dim is the query/key head dim and must be qk_nope_head_dim + "
                          f"qk_rope_head_dim = {m.qk_nope_head_dim} + {m.qk_rope_head_dim} = {qk}, got {m.head_dim}; "
                          f"set head_dim={qk}")
    if m.v_head_dim > qk:
        raise ConfigError(f"attention_type='mla': v_head_dim={m.v_head_dim} above the query/key head dim {qk} is not "
                          f"supported (values are zero-padded to it); use v_head_dim <= {qk}")
    if m.n_kv_heads not in (None, m.n_heads):
        raise ConfigError(f"attention_type='mla' up-projects keys and values for every query head: n_kv_heads must "
                          f"be None (or n_heads={m.n_heads}), got {m.n_kv_heads}")
    if m.position != "rope":
        raise ConfigError(f"attention_type='mla' has a decoupled RoPE part (qk_rope_head_dim): position must be "
                          f"'rope', got {m.position!r}")


def value_head_dim(m: ModelConfig) -> int:
    """The value (and attention output) head dim: head_dim, or v_head_dim with "mla" (the query/key
    head dim is head_dim in both)."""
    return m.v_head_dim if m.attention_type == "mla" else m.head_dim


def expert_width(m: ModelConfig) -> int:
    """The hidden width of one expert of a mixture of experts (expert_d_ff, or d_ff when it is 0)."""
    return m.expert_d_ff or m.d_ff


def is_moe_layer(m: ModelConfig, layer: int) -> bool:
    """Whether decoder layer `layer` (0-based) is a MoE layer (trainer/moe.py): none of a dense model;
    after the first_dense_layers, every moe_every-th (layer first_dense_layers + moe_every - 1 the first)."""
    if not m.n_experts or layer < m.first_dense_layers:
        return False
    return (layer - m.first_dense_layers + 1) % m.moe_every == 0


def moe_layers(m: ModelConfig) -> int:
    """How many of the decoder layers are MoE layers."""
    return sum(is_moe_layer(m, i) for i in range(m.n_layers))


@dataclass(frozen=True)
class MeshConfig:
    """Device mesh: ICI shape (inside a slice) times DCN shape (across slices), over the axes
    MESH_AXES = (data, stage, fsdp, context, tensor, expert), one entry per axis (`mesh_shape(...)`
    builds one by name). A 3-entry shape means (data, fsdp, tensor), as before the stage and
    context axes existed, a 5-entry one (data, stage, fsdp, context, tensor), as before the expert
    axis (config.full_shape). Any axis may be sized in ICI and in DCN.

    One ICI entry may be -1: it takes whatever devices are left.
    """

    ici: tuple[int, ...] = (1, -1, 1)
    dcn: tuple[int, ...] = (1, 1, 1)
    # named logical-axis rules table (trainer/sharding.py RULE_SETS): "default" keeps the
    # activations' embed dim replicated over tensor; "sequence_parallel" shards it over tensor
    # (as MaxText does), so the residual stream is not replicated on the tensor axis.
    rules: str = "default"


@dataclass(frozen=True)
class PipelineConfig:
    """Pipeline parallelism over the mesh axis `stage` (trainer/pipeline.py). With stage = S:
    the batch splits into `microbatches` (a multiple of S), each stage holds `repeats` chunks
    of n_layers / (S x repeats) layers; "gpipe" passes every microbatch through the stages
    once (repeats = 1), "circular" `repeats` times, round-robin over the chunks. Bubble:
    (S - 1) / (microbatches x repeats + S - 1). With stage = 1 it must stay at its defaults."""

    microbatches: int = 1
    repeats: int = 1
    schedule: str = "gpipe"  # "gpipe" | "circular"


@dataclass(frozen=True)
class OptimizerConfig:
    """optax AdamW with linear warm-up, cosine decay and global-norm clipping."""

    peak_lr: float = 3e-3
    warmup_steps: int = 10
    decay_steps: int | None = None  # None: the run's total steps
    end_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    clip_norm: float = 1.0
    # ZeRO-1: AdamW's moments sharded over the data axis too (parameters stay as they are)
    zero1: bool = False
    # AdamW's moments kept in pinned host memory, moved to the device around the update
    # (TPU / GPU only: trainer/memory_kinds.py)
    offload_state: bool = False


@dataclass(frozen=True)
class DataConfig:
    """Where the tokens come from.

    task: a registered seqio task name; the default is paxsearch's own synthetic task
    (generated deterministically, no download). text_files: local text files (one
    document per line); when given, they are used instead of `task`.
    num_shards: how many shards the source is split into (ShardInfo). 0 means one per
    process. Each process reads num_shards / process_count of them, so a fixed
    num_shards gives the same global batches whatever the number of hosts.
    """

    task: str = "paxsearch_synthetic"
    text_files: tuple[str, ...] = ()
    pack: bool = True
    shuffle: bool = True
    seed: int = 0
    num_shards: int = 0
    eval_split: str = "validation"
    eval_examples: int = 64  # cap on eval examples (0: the whole split)


@dataclass(frozen=True)
class EvalConfig:
    every_steps: int = 0  # 0: eval only at the end when enabled
    enabled: bool = True
    max_batches: int = 4  # 0: the whole (padded) eval split


@dataclass(frozen=True)
class CheckpointConfig:
    every_steps: int = 0  # 0: no periodic checkpoints (one at the end if enabled)
    keep: int = 3
    enabled: bool = False
    async_save: bool = True
    directory: str | None = None  # None: <run_dir>/checkpoints


@dataclass(frozen=True)
class LogConfig:
    every_steps: int = 10
    tensorboard: bool = True
    progress: bool = False  # a progress bar on stderr (the CLI turns it on)


@dataclass(frozen=True)
class DistributedConfig:
    """jax.distributed.initialize settings; num_processes=1 means single process."""

    coordinator_address: str | None = None
    num_processes: int = 1
    process_id: int = 0
    local_device_count: int | None = None  # CPU only: devices per process
    # seconds a process may go without a heartbeat before the coordinator declares it dead,
    # and seconds to wait for every process to join (jax.distributed.initialize's own defaults)
    heartbeat_timeout_s: int = 100
    initialization_timeout_s: int = 300


@dataclass(frozen=True)
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    mesh: MeshConfig = field(default_factory=MeshConfig)
    per_device_batch: int | None = 2  # rows per device on the batch axes (data x fsdp)
    global_batch: int | None = None  # alternative to per_device_batch; exactly one is set
    # a remat.POLICIES name, or a custom policy "custom:<tensor>=<choice>,..." (trainer/remat.py)
    remat: str = "none"
    # gradient accumulation: each step runs this many microbatches of global_batch / k rows
    # (forward and backward each), sums their gradients weighted by tokens, updates once
    grad_accum_steps: int = 1
    # parameters kept in pinned host memory between steps, moved to the device for the step
    # (TPU / GPU only: trainer/memory_kinds.py)
    offload_params: bool = False
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    steps: int = 50
    warmup_steps_for_timing: int = 2  # steps excluded from step-time figures
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    log: LogConfig = field(default_factory=LogConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    seed: int = 0
    run_dir: str | None = None
    # named compiler flag set (trainer/flagsets.py): XLA_FLAGS / LIBTPU_INIT_ARGS applied by the
    # process before the backend starts
    flags: str = "default"
    # microbatches, repeats and schedule of the pipeline over the mesh axis `stage`
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)


def to_dict(cfg) -> dict:
    """The config as plain JSON-able data (tuples become lists). A dense model (n_experts 0)
    leaves out the mixture-of-experts fields (MOE_FIELDS), a model of standard attention
    (attention_type "mha") the latent-attention ones (MLA_FIELDS): its stored form is as before
    they existed, and from_dict reads their defaults back."""
    d = dataclasses.asdict(cfg)
    model = d.get("model") if isinstance(cfg, TrainConfig) else (d if isinstance(cfg, ModelConfig) else None)
    if model is not None and not model.get("n_experts"):
        for name in MOE_FIELDS:
            model.pop(name, None)
    if model is not None and model.get("attention_type", "mha") == "mha":
        for name in MLA_FIELDS:
            model.pop(name, None)
    return d


def from_dict(d: dict) -> TrainConfig:
    """Inverse of to_dict."""
    def sub(cls, v):
        if v is None:
            return cls()
        kw = {}
        for f in dataclasses.fields(cls):
            if f.name in v:
                val = v[f.name]
                if isinstance(val, list):
                    val = tuple(val)
                kw[f.name] = val
        return cls(**kw)

    nested = {
        "model": ModelConfig, "mesh": MeshConfig, "optimizer": OptimizerConfig,
        "data": DataConfig, "eval": EvalConfig, "checkpoint": CheckpointConfig,
        "log": LogConfig, "distributed": DistributedConfig, "pipeline": PipelineConfig,
    }
    kw = {}
    for f in dataclasses.fields(TrainConfig):
        if f.name not in d:
            continue
        if f.name in nested:
            kw[f.name] = sub(nested[f.name], d[f.name])
        else:
            kw[f.name] = d[f.name]
    return TrainConfig(**kw)

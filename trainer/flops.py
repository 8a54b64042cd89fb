"""Model FLOPs (one pinned convention), peak FLOP/s per device kind, and the CPU's measured peak.

The MFU convention (written into every report):
  MFU = model FLOPs per second / (devices x peak FLOP/s per device).
  Model FLOPs of a training step = 3 x forward FLOPs (backward = 2 x forward), where the
  forward counts 2 x (multiply-adds) of every weight matmul, the unembedding included (also
  when it is the tied embedding table), plus causal self-attention (QK^T and AV) counted at
  half of full attention; the embedding lookup, norms, softmax, activations, the gating
  product and RoPE are not counted. K/V projections have n_kv_heads heads (Hkv); a gated
  MLP (SwiGLU, GeGLU) has 3 matrices, a dense one 2 (n_mlp). Per token:
      forward = n_layers x (2*d*H*Dh + 2*2*d*Hkv*Dh + 2*H*Dh*d + n_mlp*2*d*d_ff + 2*S*H*Dh) + 2*d*V
  HFU uses XLA's executed FLOPs (rematerialization included) instead of model FLOPs.
  Multi-head latent attention (attention_type "mla", trainer/mla.py; MaxText's
  calculate_mla_tflops_per_device at its DeepSeek V3 commit counts the same), with r_q =
  q_lora_rank, r_kv = kv_lora_rank, Dn / Dr / Dv the nope, rope and value head dims, Dqk = Dn + Dr:
  the projections are 2 x (d*r_q + r_q*H*Dqk, or d*H*Dqk when r_q = 0) + 2 x (d*(r_kv + Dr) +
  r_kv*H*(Dn + Dv)) + 2*H*Dv*d, and the attention 2*S*H*Dqk (QK^T) + 2*S*H*Dv (AV), halved for
  causality, per token: the zero-padding of v to Dqk that some attention implementations run
  (trainer/mla.py) is hardware FLOPs only.
  The memory knobs do not change model FLOPs: gradient accumulation does the same work in k
  microbatches, ZeRO-1 and offload move state, and the logits that vocab tiling recomputes in
  the backward pass are hardware FLOPs (HFU; plan.py's FLOP probes unroll those loops).
  Nor does int8 quantization (ModelConfig.quantization): its matmuls count as bf16 ones, and MFU
  stays against the bf16 peak (MaxText's convention), so int8's gain shows as a higher MFU.
  Mixture of experts (trainer/moe.py): only the activated experts count, as in MaxText's
  calculate_tflops_training_per_device: a MoE layer's MLP term is
      2*d*n_experts (the router) + (experts_per_token + n_shared_experts) * n_mlp*2*d*expert_d_ff
  per token, whatever the experts run: capacity padding and the dropless grouped matmuls' extra
  work are hardware FLOPs (HFU), and dropped tokens still count (dropping raises MFU and lowers
  quality: the dropped fraction is reported beside it). Dense layers (first_dense_layers, and
  the ones moe_every leaves between) keep their d_ff term.
"""
from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

from . import hardware
from .config import ModelConfig, expert_width, moe_layers, value_head_dim

MFU_CONVENTION = (
    "MFU = model FLOPs/s / (devices x peak FLOP/s per device); model FLOPs = 3 x forward; "
    "forward = 2 x multiply-adds of every weight matmul (K/V projections with n_kv_heads heads, "
    "3 matrices in a gated MLP) incl. the unembedding (tied or not) + causal attention "
    "(QK^T, AV) at half (MLA: its latent down/up projections, QK^T at the query/key head dim, AV at the value "
    "head dim); embedding lookup, norms, softmax, activations and RoPE not counted; "
    "a MoE layer counts its router and its activated experts only (top-k + shared). "
    "HFU uses XLA's executed FLOPs (remat included).")


def _mlp_matrices(m: ModelConfig) -> int:
    return 3 if m.mlp == "gated" else 2


def _attention_weights(m: ModelConfig) -> int:
    """Weights of one layer's attention projections (their matmul FLOPs are 2 x these per token)."""
    if m.attention_type == "mla":  # trainer/mla.py: latents, up-projections, output
        h, qk, dv = m.n_heads, m.qk_nope_head_dim + m.qk_rope_head_dim, m.v_head_dim
        q = m.d_model * h * qk if not m.q_lora_rank else m.d_model * m.q_lora_rank + m.q_lora_rank * h * qk
        kv = m.d_model * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank * h * (m.qk_nope_head_dim + dv)
        return q + kv + h * dv * m.d_model
    return 2 * m.d_model * m.n_heads * m.head_dim + 2 * m.d_model * m.kv_heads * m.head_dim


def forward_flops_per_token(m: ModelConfig) -> int:
    projections = 2 * _attention_weights(m)
    mlp = _mlp_matrices(m) * 2 * m.d_model * m.d_ff
    forward = m.n_layers * (projections + mlp + _causal_attention_per_token(m)) + 2 * m.d_model * m.vocab_size
    if m.n_experts:  # MoE layers: the router and the activated experts in place of the dense MLP
        active = m.experts_per_token + m.n_shared_experts
        moe_mlp = 2 * m.d_model * m.n_experts + active * _mlp_matrices(m) * 2 * m.d_model * expert_width(m)
        forward += moe_layers(m) * (moe_mlp - mlp)
    return forward


def _causal_attention_per_token(m: ModelConfig) -> int:
    # (2 S H Dqk for QK^T + 2 S H Dv for AV), halved for causality; Dqk = Dv = head_dim but with "mla"
    return m.seq_len * m.n_heads * (m.head_dim + value_head_dim(m))


def model_flops_per_step(m: ModelConfig, global_batch: int) -> int:
    """Training FLOPs of one step over all devices (3 x forward)."""
    return 3 * forward_flops_per_token(m) * global_batch * m.seq_len


def attention_flops_per_step(m: ModelConfig, global_batch: int) -> int:
    """The causal attention's share of model_flops_per_step (QK^T and AV, 3 x forward): the part
    an attention kernel runs, the rest being matmuls with the weights."""
    return 3 * m.n_layers * _causal_attention_per_token(m) * global_batch * m.seq_len


def param_count(m: ModelConfig, active: bool = False) -> int:
    """Parameters of the model that model.TransformerLM builds for `m`; with `active`, a MoE
    model's activated ones (experts_per_token of the routed experts, the shared ones, the router)."""
    attn = _attention_weights(m)
    if m.attention_type == "mla":  # + the RMSNorm scales of its latents
        attn += m.kv_lora_rank + m.q_lora_rank
    norms = 1 if m.block == "parallel" else 2  # a parallel block's attention and MLP share one norm
    dense_mlp = _mlp_matrices(m) * m.d_model * m.d_ff
    per_layer = attn + dense_mlp + norms * m.d_model
    embed = m.vocab_size * m.d_model * (1 if m.tie_embeddings else 2)
    positions = m.seq_len * m.d_model if m.position == "learned" else 0
    count = m.n_layers * per_layer + embed + positions + m.d_model  # + final norm
    if m.n_experts:
        routed = m.experts_per_token if active else m.n_experts
        expert = _mlp_matrices(m) * m.d_model * expert_width(m)
        router = m.d_model * m.n_experts + (m.n_experts if m.router == "sigmoid" else 0)  # + the routing bias
        count += moe_layers(m) * (router + (routed + m.n_shared_experts) * expert - dense_mlp)
    return count


# Dense bf16 peak FLOP/s per JAX device: trainer/hardware.py's table (with its sources).
# PEAK_BF16_FLOPS is a view of it, keyed by lower-case device kind.
PEAK_BF16_FLOPS = {kind.lower(): entry.peak_bf16_flops.value
                   for entry in hardware.TABLE.values() for kind in entry.device_kinds}


def peak_flops_per_device(device_kind: str, platform_name: str, local_device_count: int = 1,
                          dtype: str = "float32") -> tuple[float, str]:
    """(peak FLOP/s of one device, where the figure comes from): the hardware table's bf16
    dense peak; on a CPU the measured matmul peak; UnknownDeviceKind otherwise."""
    entry = hardware.find_device_kind(device_kind)
    if entry is not None:
        return entry.peak_bf16_flops.value, f"table: {entry.name} bf16 dense ({entry.peak_bf16_flops.source})"
    if platform_name == "cpu":
        total = measured_cpu_peak(dtype)
        return total / local_device_count, (
            f"measured CPU {dtype} matmul peak {total / 1e9:.1f} GFLOP/s / {local_device_count} simulated devices")
    raise hardware.unknown_kind(device_kind)


def cache_root() -> Path:
    """paxsearch's cache folder: $PAXSEARCH_CACHE, else ~/.cache/paxsearch."""
    return Path(os.environ.get("PAXSEARCH_CACHE", os.path.join(Path.home(), ".cache", "paxsearch")))


def _cache_file() -> Path:
    return cache_root() / "cpu_peak.json"


def measured_cpu_peak(dtype: str = "float32") -> float:
    """Best matmul FLOP/s of this machine on one JAX CPU device, measured once and cached."""
    import jax

    key = f"{platform.processor() or platform.machine()}|{os.cpu_count()}|{dtype}|jax{jax.__version__}"
    path = _cache_file()
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        cached = {}
    if key in cached:
        return float(cached[key])
    peak = _measure_matmul(dtype)
    if os.getloadavg()[0] > (os.cpu_count() or 1):
        # measured on a busy machine: too low, and a cached low peak would inflate every later
        # MFU (seen here: 38 GFLOP/s cached under load against ~255 idle); use it, don't keep it
        return peak
    cached[key] = peak
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(cached))
        tmp.replace(path)
    except OSError:
        pass
    return peak


def _measure_matmul(dtype: str, n: int = 2048, repeats: int = 5) -> float:
    import jax
    import jax.numpy as jnp

    dev = jax.devices("cpu")[0]
    a = jax.device_put(jnp.ones((n, n), dtype), dev)
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        f(a).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return 2 * n ** 3 / best

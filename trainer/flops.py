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
from .config import ModelConfig, expert_width, moe_layers

MFU_CONVENTION = (
    "MFU = model FLOPs/s / (devices x peak FLOP/s per device); model FLOPs = 3 x forward; "
    "forward = 2 x multiply-adds of every weight matmul (K/V projections with n_kv_heads heads, "
    "3 matrices in a gated MLP) incl. the unembedding (tied or not) + causal attention "
    "(QK^T, AV) at half; embedding lookup, norms, softmax, activations and RoPE not counted; "
    "a MoE layer counts its router and its activated experts only (top-k + shared). "
    "HFU uses XLA's executed FLOPs (remat included).")


def _mlp_matrices(m: ModelConfig) -> int:
    return 3 if m.mlp == "gated" else 2


def forward_flops_per_token(m: ModelConfig) -> int:
    q_and_out = 2 * 2 * m.d_model * m.n_heads * m.head_dim
    kv = 2 * 2 * m.d_model * m.kv_heads * m.head_dim
    mlp = _mlp_matrices(m) * 2 * m.d_model * m.d_ff
    forward = m.n_layers * (q_and_out + kv + mlp + _causal_attention_per_token(m)) + 2 * m.d_model * m.vocab_size
    if m.n_experts:  # MoE layers: the router and the activated experts in place of the dense MLP
        active = m.experts_per_token + m.n_shared_experts
        moe_mlp = 2 * m.d_model * m.n_experts + active * _mlp_matrices(m) * 2 * m.d_model * expert_width(m)
        forward += moe_layers(m) * (moe_mlp - mlp)
    return forward


def _causal_attention_per_token(m: ModelConfig) -> int:
    return 2 * m.seq_len * m.n_heads * m.head_dim  # (2+2)*S*H*Dh, halved for causality


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
    attn = 2 * m.d_model * m.n_heads * m.head_dim + 2 * m.d_model * m.kv_heads * m.head_dim
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

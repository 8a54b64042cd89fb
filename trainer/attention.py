"""Causal self-attention within packed segments, in four implementations of one function.

    attend(q_BSHD, k_BSKD, v_BSKD, segment_ids_BS, implementation, block) -> out_BSHD

H query heads share K = n_kv_heads key/value heads (H = K x G; K == H is multi-head, K == 1
multi-query attention). Query head h reads key/value head h // G. A query attends to the keys
at or before its position that carry the same segment id (segment 0 is padding; padding rows
attend to padding, and the loss ignores them).

Implementations (`implementation(model, platform)` picks one from ModelConfig.attention):
- "dot_product": softmax(QK^T / sqrt(D)) V with the S x S scores in memory (any platform).
- "blockwise": the CPU "flash" attention: online softmax over key blocks of `block` tokens,
  one query block at a time, with a custom VJP that recomputes the scores block by block in
  the backward pass. Neither pass holds more than block x block scores per (batch, head), and
  the residuals are q, k, v, the output and the row log-sum-exp (O(S), never O(S^2)).
  Causality skips the key blocks after the query block.
- "splash": the Pallas TPU splash-attention kernel, under shard_map over the mesh axes that
  the current rules give the batch and head dims (it compiles ahead of time for TPU
  topologies on a CPU machine, in plan mode).
- "cudnn": jax.nn.dot_product_attention(implementation="cudnn") on GPU (code path only; the
  segment mask is passed as a boolean S x S mask, the scores stay in the fused kernel).
"""
from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from .config import ModelConfig
from .errors import ConfigError
from .remat import CONTEXT

USER_CHOICES = ("dot_product", "flash", "auto")
IMPLEMENTATIONS = ("dot_product", "blockwise", "splash", "cudnn")
GPU_PLATFORMS = ("gpu", "cuda", "rocm")
SPLASH_BLOCK = 512  # splash-attention tile; the largest of 512, 256, 128 dividing seq_len
_NEG = -0.7 * float(np.finfo(np.float32).max)  # finite "minus infinity" for masked scores


# ----------------------------------------------------------------------------- choosing one

def fused_for(platform: str) -> str:
    """The platform's flash implementation: splash on TPU, cuDNN on GPU, blockwise on CPU."""
    if platform == "tpu":
        return "splash"
    if platform in GPU_PLATFORMS:
        return "cudnn"
    return "blockwise"


def unsupported(impl: str, m: ModelConfig) -> str | None:
    """Why `impl` cannot run model `m` (None when it can)."""
    if impl == "blockwise" and m.seq_len % m.attention_block:
        return f"seq_len={m.seq_len} is not a multiple of attention_block={m.attention_block}"
    if impl == "blockwise" and m.attention_block < 1:
        return f"attention_block={m.attention_block} must be >= 1"
    if impl == "splash" and m.seq_len % 128:
        return f"the TPU splash kernel needs seq_len a multiple of 128, got {m.seq_len}"
    if impl == "cudnn":
        if m.dtype != "bfloat16":
            return f"cuDNN flash attention needs dtype bfloat16, got {m.dtype}"
        if m.head_dim > 128 or m.head_dim % 8:
            return f"cuDNN flash attention needs head_dim <= 128 and a multiple of 8, got {m.head_dim}"
    return None


def implementation(m: ModelConfig, platform: str) -> str:
    """The implementation that ModelConfig.attention means on `platform`.

    "auto" is the fused kernel where one exists (TPU, GPU) and the model's shape suits it,
    else dot_product; "flash" is the platform's fused (or, on CPU, blockwise) kernel and
    raises ConfigError when the shape does not suit it."""
    if m.attention not in USER_CHOICES:
        raise ConfigError(f"unknown attention {m.attention!r}; choose one of {', '.join(USER_CHOICES)}")
    if m.attention == "dot_product":
        return "dot_product"
    impl = fused_for(platform)
    why = unsupported(impl, m)
    if m.attention == "auto":
        return impl if impl != "blockwise" and why is None else "dot_product"
    if why is not None:
        raise ConfigError(f"attention='flash' ({impl} on {platform}) cannot run this model: {why}; "
                          f"use attention='auto' or 'dot_product'")
    return impl


def attend(q_BSHD, k_BSKD, v_BSKD, segment_ids_BS, implementation: str, block: int = 128):
    if implementation == "dot_product":
        return dot_product(q_BSHD, k_BSKD, v_BSKD, segment_ids_BS)
    if implementation == "blockwise":
        return blockwise(q_BSHD, k_BSKD, v_BSKD, segment_ids_BS, block)
    if implementation == "splash":
        return splash(q_BSHD, k_BSKD, v_BSKD, segment_ids_BS)
    if implementation == "cudnn":
        return cudnn(q_BSHD, k_BSKD, v_BSKD, segment_ids_BS)
    raise ConfigError(f"unknown attention implementation {implementation!r}; one of {', '.join(IMPLEMENTATIONS)}")


def _group(q_BSHD, n_kv):
    b, s, h, d = q_BSHD.shape
    return q_BSHD.reshape(b, s, n_kv, h // n_kv, d)


# ----------------------------------------------------------------------------- dot product

def dot_product(q_BSHD, k_BSKD, v_BSKD, segment_ids_BS):
    """softmax(QK^T / sqrt(D)) V with the full (B, K, G, S, S) scores; K/V heads grouped by einsum."""
    s, d, n_kv = q_BSHD.shape[1], q_BSHD.shape[-1], k_BSKD.shape[2]
    q_BSKGD = _group(q_BSHD, n_kv)
    q_idx, k_idx = jnp.arange(s)[:, None], jnp.arange(s)[None, :]
    mask_BQK = (q_idx >= k_idx)[None] & (segment_ids_BS[:, :, None] == segment_ids_BS[:, None, :])
    logits = jnp.einsum("bqkgd,bskd->bkgqs", q_BSKGD, k_BSKD).astype(jnp.float32) * (d ** -0.5)
    logits = jnp.where(mask_BQK[:, None, None], logits, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(logits, axis=-1).astype(q_BSHD.dtype)
    out_BSKGD = jnp.einsum("bkgqs,bskd->bqkgd", probs, v_BSKD)
    return out_BSKGD.reshape(q_BSHD.shape)


# ----------------------------------------------------------------------------- blockwise (CPU flash)

def blockwise(q_BSHD, k_BSKD, v_BSKD, segment_ids_BS, block: int):
    b, s, h, d = q_BSHD.shape
    n_kv = k_BSKD.shape[2]
    if s % block:
        raise ConfigError(f"blockwise attention: seq_len={s} is not a multiple of attention_block={block}")
    n = s // block
    # blocked layouts, block index first: q (n, B, K, G, bq, D), k/v (n, B, K, bk, D), seg (n, B, bq)
    qb = _group(q_BSHD, n_kv).reshape(b, n, block, n_kv, h // n_kv, d).transpose(1, 0, 3, 4, 2, 5)
    kb = k_BSKD.reshape(b, n, block, n_kv, d).transpose(1, 0, 3, 2, 4)
    vb = v_BSKD.reshape(b, n, block, n_kv, d).transpose(1, 0, 3, 2, 4)
    segb = segment_ids_BS.reshape(b, n, block).transpose(1, 0, 2)
    ob = _flash(qb, kb, vb, segb, d ** -0.5)
    return ob.transpose(1, 0, 4, 2, 3, 5).reshape(b, s, h, d)


def _mask(i, j, segb, block):
    """(B, 1, 1, bq, bk) mask of query block i against key block j."""
    q_pos = i * block + jnp.arange(block)
    k_pos = j * block + jnp.arange(block)
    causal = q_pos[:, None] >= k_pos[None, :]
    same = segb[i][:, :, None] == segb[j][:, None, :]
    return (causal[None] & same)[:, None, None]


def _scores(qi, kj, scale):
    return jnp.einsum("bkgqd,bksd->bkgqs", qi, kj, preferred_element_type=jnp.float32) * scale


def _flash_forward(qb, kb, vb, segb, scale):
    n, block = qb.shape[0], qb.shape[-2]

    def one_query_block(i):
        qi = qb[i]

        def body(j, carry):
            m, l, acc = carry
            msk = _mask(i, j, segb, block)
            sc = jnp.where(msk, _scores(qi, kb[j], scale), _NEG)
            m_new = jnp.maximum(m, sc.max(-1))
            p = jnp.where(msk, jnp.exp(sc - m_new[..., None]), 0.0)
            corr = jnp.exp(m - m_new)
            l = l * corr + p.sum(-1)
            acc = acc * corr[..., None] + jnp.einsum("bkgqs,bksd->bkgqd", p.astype(vb.dtype), vb[j],
                                                     preferred_element_type=jnp.float32)
            return m_new, l, acc

        stats = qi.shape[:-1]
        init = (jnp.full(stats, _NEG, jnp.float32), jnp.zeros(stats, jnp.float32),
                jnp.zeros(qi.shape, jnp.float32))
        m, l, acc = jax.lax.fori_loop(0, i + 1, body, init)  # key blocks after i are all masked
        return (acc / l[..., None]).astype(qb.dtype), m + jnp.log(l)

    return jax.lax.map(one_query_block, jnp.arange(n))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _flash(qb, kb, vb, segb, scale):
    return _flash_forward(qb, kb, vb, segb, scale)[0]


def _flash_fwd(qb, kb, vb, segb, scale):
    ob, lse = _flash_forward(qb, kb, vb, segb, scale)
    # named like the attention output, so remat policies that keep the context keep these too
    ob, lse = checkpoint_name(ob, CONTEXT), checkpoint_name(lse, CONTEXT)
    return ob, (qb, kb, vb, segb, ob, lse)


def _flash_bwd(scale, res, dob):
    qb, kb, vb, segb, ob, lse = res
    n, block = qb.shape[0], qb.shape[-2]
    delta = jnp.sum(dob.astype(jnp.float32) * ob.astype(jnp.float32), axis=-1)  # (n, B, K, G, bq)

    def one_key_block(dq, j):
        kj, vj = kb[j], vb[j]

        def body(i, carry):
            dk, dv, dq = carry
            qi, doi = qb[i], dob[i]
            msk = _mask(i, j, segb, block)
            p = jnp.where(msk, jnp.exp(_scores(qi, kj, scale) - lse[i][..., None]), 0.0)
            dv = dv + jnp.einsum("bkgqs,bkgqd->bksd", p.astype(doi.dtype), doi, preferred_element_type=jnp.float32)
            dp = jnp.einsum("bkgqd,bksd->bkgqs", doi, vj, preferred_element_type=jnp.float32)
            ds = (p * (dp - delta[i][..., None]) * scale).astype(qi.dtype)
            dk = dk + jnp.einsum("bkgqs,bkgqd->bksd", ds, qi, preferred_element_type=jnp.float32)
            dq = dq.at[i].add(jnp.einsum("bkgqs,bksd->bkgqd", ds, kj, preferred_element_type=jnp.float32))
            return dk, dv, dq

        zeros = jnp.zeros(kj.shape, jnp.float32)
        dk, dv, dq = jax.lax.fori_loop(j, n, body, (zeros, zeros, dq))  # query blocks before j are masked
        return dq, (dk.astype(kb.dtype), dv.astype(vb.dtype))

    dq, (dkb, dvb) = jax.lax.scan(one_key_block, jnp.zeros(qb.shape, jnp.float32), jnp.arange(n))
    return dq.astype(qb.dtype), dkb, dvb, None


_flash.defvjp(_flash_fwd, _flash_bwd)


# ----------------------------------------------------------------------------- TPU splash

def splash_block(seq_len: int) -> int:
    return next(b for b in (SPLASH_BLOCK, 256, 128) if seq_len % b == 0)


def _splash_local(q_BSHD, k_BSKD, v_BSKD, segment_ids_BS, interpret: bool = False):
    """Splash attention on one shard's arrays (all heads and the full sequence local)."""
    from jax.experimental.pallas.ops.tpu import splash_attention as sa

    _, s, h, d = q_BSHD.shape
    blk = splash_block(s)
    sizes = sa.BlockSizes(block_q=blk, block_kv=blk, block_kv_compute=blk, block_q_dkv=blk,
                          block_kv_dkv=blk, block_kv_dkv_compute=blk, block_q_dq=blk, block_kv_dq=blk)
    mask = sa.MultiHeadMask([sa.CausalMask((s, s)) for _ in range(h)])
    kernel = sa.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1, interpret=interpret,
                                residual_checkpoint_name=CONTEXT)
    q_BHSD = (q_BSHD * jnp.asarray(d ** -0.5, q_BSHD.dtype)).transpose(0, 2, 1, 3)
    k_BKSD, v_BKSD = k_BSKD.transpose(0, 2, 1, 3), v_BSKD.transpose(0, 2, 1, 3)
    seg = segment_ids_BS.astype(jnp.int32)
    out = jax.vmap(lambda q, k, v, sg: kernel(q, k, v, segment_ids=sa.SegmentIds(sg, sg)))(
        q_BHSD, k_BKSD, v_BKSD, seg)
    return out.transpose(0, 2, 1, 3)


def _dividing(spec, shape, mesh):
    """`spec` with the entries whose mesh axes do not divide the dim replaced by None (e.g. the
    batch of 1 row that initialization traces)."""
    out = []
    for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec)), strict=False):
        names = () if axes is None else (axes if isinstance(axes, tuple) else (axes,))
        size = 1
        for name in names:
            size *= mesh.shape[name]
        out.append(axes if dim % size == 0 else None)
    return jax.sharding.PartitionSpec(*out)


def splash(q_BSHD, k_BSKD, v_BSKD, segment_ids_BS, interpret: bool = False):
    """The splash kernel under shard_map over the batch and head mesh axes of the current rules."""
    mesh = jax.sharding.get_abstract_mesh()
    local = functools.partial(_splash_local, interpret=interpret)
    if mesh.empty:
        return local(q_BSHD, k_BSKD, v_BSKD, segment_ids_BS)
    q_spec = _dividing(nn.logical_to_mesh_axes(("batch", "length", "act_heads", "act_kv")), q_BSHD.shape, mesh)
    kv_spec = _dividing(nn.logical_to_mesh_axes(("batch", "length", "act_kv_heads", "act_kv")), k_BSKD.shape, mesh)
    if kv_spec[0] != q_spec[0]:
        kv_spec = jax.sharding.PartitionSpec(q_spec[0], *kv_spec[1:])
    if q_spec[1] is not None:
        raise ConfigError("splash attention needs the sequence unsharded; use rules without a length axis")
    if q_spec[2] is not None and kv_spec[2] is None:
        # K/V heads replicated over the axis that splits the query heads: give every query
        # head its own copy so each shard holds the K/V heads of its query heads
        g = q_BSHD.shape[2] // k_BSKD.shape[2]
        k_BSKD, v_BSKD = (jnp.repeat(t, g, axis=2) for t in (k_BSKD, v_BSKD))
        kv_spec = q_spec
    seg_spec = jax.sharding.PartitionSpec(q_spec[0], None)
    fn = jax.shard_map(local, mesh=mesh, in_specs=(q_spec, kv_spec, kv_spec, seg_spec), out_specs=q_spec,
                       check_vma=False)
    return fn(q_BSHD, k_BSKD, v_BSKD, segment_ids_BS)


# ----------------------------------------------------------------------------- GPU cuDNN

def cudnn(q_BSHD, k_BSKD, v_BSKD, segment_ids_BS):
    same_segment = (segment_ids_BS[:, :, None] == segment_ids_BS[:, None, :])[:, None]
    return jax.nn.dot_product_attention(q_BSHD, k_BSKD, v_BSKD, mask=same_segment, is_causal=True,
                                        implementation="cudnn")

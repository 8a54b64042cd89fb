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

from . import context as context_lib
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


def attend(q_BSHD, k_BSKD, v_BSKD, segment_ids_BS, implementation: str, block: int = 128, context: int = 1):
    """`context` > 1: the sequence is in the load-balanced layout of trainer/context.py, split
    over the mesh axis `context` (context_parallel)."""
    if context > 1:
        return context_parallel(q_BSHD, k_BSKD, v_BSKD, segment_ids_BS, implementation, block, context)
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

def dot_product(q_BSHD, k_BSKD, v_BSKD, segment_ids_BS, segment_ids_k_BS=None, q_positions_S=None):
    """softmax(QK^T / sqrt(D)) V with the full (B, K, G, Q, S) scores; K/V heads grouped by einsum.
    Keys are in natural order; queries too unless `q_positions_S` gives each query's position
    (then `segment_ids_BS` are the queries' and `segment_ids_k_BS` the keys')."""
    d, n_kv = q_BSHD.shape[-1], k_BSKD.shape[2]
    seg_k = segment_ids_BS if segment_ids_k_BS is None else segment_ids_k_BS
    q_pos = jnp.arange(q_BSHD.shape[1]) if q_positions_S is None else q_positions_S
    q_BSKGD = _group(q_BSHD, n_kv)
    q_idx, k_idx = q_pos[:, None], jnp.arange(k_BSKD.shape[1])[None, :]
    mask_BQK = (q_idx >= k_idx)[None] & (segment_ids_BS[:, :, None] == seg_k[:, None, :])
    logits = jnp.einsum("bqkgd,bskd->bkgqs", q_BSKGD, k_BSKD).astype(jnp.float32) * (d ** -0.5)
    logits = jnp.where(mask_BQK[:, None, None], logits, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(logits, axis=-1).astype(q_BSHD.dtype)
    out_BSKGD = jnp.einsum("bkgqs,bskd->bqkgd", probs, v_BSKD)
    return out_BSKGD.reshape(q_BSHD.shape)


# ----------------------------------------------------------------------------- blockwise (CPU flash)

def blockwise(q_BSHD, k_BSKD, v_BSKD, segment_ids_BS, block: int, segment_ids_k_BS=None, q_positions_S=None):
    """Keys in natural order; queries too unless `q_positions_S` gives each query's position
    (each query block then a contiguous run of positions, e.g. a context shard's chunks; its
    segment ids `segment_ids_BS`, the keys' `segment_ids_k_BS`)."""
    b, sq, h, d = q_BSHD.shape
    sk, n_kv = k_BSKD.shape[1], k_BSKD.shape[2]
    if sq % block or sk % block:
        raise ConfigError(f"blockwise attention: seq_len={sk} is not a multiple of attention_block={block}")
    nq, nk = sq // block, sk // block
    seg_k = segment_ids_BS if segment_ids_k_BS is None else segment_ids_k_BS
    # blocked layouts, block index first: q (nq, B, K, G, bq, D), k/v (nk, B, K, bk, D), seg (n, B, b)
    qb = _group(q_BSHD, n_kv).reshape(b, nq, block, n_kv, h // n_kv, d).transpose(1, 0, 3, 4, 2, 5)
    kb = k_BSKD.reshape(b, nk, block, n_kv, d).transpose(1, 0, 3, 2, 4)
    vb = v_BSKD.reshape(b, nk, block, n_kv, d).transpose(1, 0, 3, 2, 4)
    segq = segment_ids_BS.reshape(b, nq, block).transpose(1, 0, 2)
    segk = seg_k.reshape(b, nk, block).transpose(1, 0, 2)
    if q_positions_S is None:
        q_start = jnp.arange(nq, dtype=jnp.int32) * block
    else:
        q_start = jnp.asarray(q_positions_S, jnp.int32).reshape(nq, block)[:, 0]
    ob = _flash(qb, kb, vb, segq, segk, q_start, d ** -0.5)
    return ob.transpose(1, 0, 4, 2, 3, 5).reshape(b, sq, h, d)


def _mask(i, j, segq, segk, q_start, block):
    """(B, 1, 1, bq, bk) mask of query block i (positions q_start[i] ...) against key block j."""
    q_pos = q_start[i] + jnp.arange(block)
    k_pos = j * block + jnp.arange(block)
    causal = q_pos[:, None] >= k_pos[None, :]
    same = segq[i][:, :, None] == segk[j][:, None, :]
    return (causal[None] & same)[:, None, None]


def _scores(qi, kj, scale):
    return jnp.einsum("bkgqd,bksd->bkgqs", qi, kj, preferred_element_type=jnp.float32) * scale


def _flash_forward(qb, kb, vb, segq, segk, q_start, scale):
    block = qb.shape[-2]

    def one_query_block(i):
        qi = qb[i]

        def body(j, carry):
            m, l, acc = carry
            msk = _mask(i, j, segq, segk, q_start, block)
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
        # key blocks after the query block's own are all masked
        m, l, acc = jax.lax.fori_loop(0, q_start[i] // block + 1, body, init)
        return (acc / l[..., None]).astype(qb.dtype), m + jnp.log(l)

    return jax.lax.map(one_query_block, jnp.arange(qb.shape[0]))


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def _flash(qb, kb, vb, segq, segk, q_start, scale):
    return _flash_forward(qb, kb, vb, segq, segk, q_start, scale)[0]


def _flash_fwd(qb, kb, vb, segq, segk, q_start, scale):
    ob, lse = _flash_forward(qb, kb, vb, segq, segk, q_start, scale)
    # named like the attention output, so remat policies that keep the context keep these too
    ob, lse = checkpoint_name(ob, CONTEXT), checkpoint_name(lse, CONTEXT)
    return ob, (qb, kb, vb, segq, segk, q_start, ob, lse)


def _flash_bwd(scale, res, dob):
    qb, kb, vb, segq, segk, q_start, ob, lse = res
    nq, block = qb.shape[0], qb.shape[-2]
    delta = jnp.sum(dob.astype(jnp.float32) * ob.astype(jnp.float32), axis=-1)  # (nq, B, K, G, bq)
    by_start = jnp.argsort(q_start)  # query blocks in position order (a context shard's are already)

    def one_key_block(dq, j):
        kj, vj = kb[j], vb[j]

        def body(n, carry):
            dk, dv, dq = carry
            i = by_start[n]
            qi, doi = qb[i], dob[i]
            msk = _mask(i, j, segq, segk, q_start, block)
            p = jnp.where(msk, jnp.exp(_scores(qi, kj, scale) - lse[i][..., None]), 0.0)
            dv = dv + jnp.einsum("bkgqs,bkgqd->bksd", p.astype(doi.dtype), doi, preferred_element_type=jnp.float32)
            dp = jnp.einsum("bkgqd,bksd->bkgqs", doi, vj, preferred_element_type=jnp.float32)
            ds = (p * (dp - delta[i][..., None]) * scale).astype(qi.dtype)
            dk = dk + jnp.einsum("bkgqs,bkgqd->bksd", ds, qi, preferred_element_type=jnp.float32)
            dq = dq.at[i].add(jnp.einsum("bkgqs,bksd->bkgqd", ds, kj, preferred_element_type=jnp.float32))
            return dk, dv, dq

        zeros = jnp.zeros(kj.shape, jnp.float32)
        first = jnp.sum(q_start < j * block)  # query blocks that start before key block j see none of it
        dk, dv, dq = jax.lax.fori_loop(first, nq, body, (zeros, zeros, dq))
        return dq, (dk.astype(kb.dtype), dv.astype(vb.dtype))

    dq, (dkb, dvb) = jax.lax.scan(one_key_block, jnp.zeros(qb.shape, jnp.float32), jnp.arange(kb.shape[0]))
    return dq.astype(qb.dtype), dkb, dvb, None, None, None


_flash.defvjp(_flash_fwd, _flash_bwd)


# ----------------------------------------------------------------------------- TPU splash

def splash_block(seq_len: int) -> int:
    return next(b for b in (SPLASH_BLOCK, 256, 128) if seq_len % b == 0)


def _splash_kernel(s: int, h: int, context: int = 1, interpret: bool = False):
    """The splash kernel for `h` heads of causal attention over `s` tokens; with `context` > 1
    the queries come in the load-balanced layout of trainer/context.py (the mask reads each
    query's position from its q_sequence) and split into `context` shards."""
    from jax.experimental.pallas.ops.tpu import splash_attention as sa

    blk = splash_block(s // (2 * context) if context > 1 else s)
    sizes = sa.BlockSizes(block_q=blk, block_kv=blk, block_kv_compute=blk, block_q_dkv=blk,
                          block_kv_dkv=blk, block_kv_dkv_compute=blk, block_q_dq=blk, block_kv_dq=blk)
    causal = sa.CausalMask((s, s), shard_count=context)
    if context > 1:
        causal.q_sequence = context_lib.order(s, context).astype(np.int32)
    return sa.make_splash_mha(sa.MultiHeadMask([causal] * h), block_sizes=sizes, head_shards=1,
                              q_seq_shards=context, interpret=interpret, residual_checkpoint_name=CONTEXT)


def _splash_call(kernel, q_BSHD, k_BSKD, v_BSKD, segment_ids_BS, segment_ids_k_BS):
    from jax.experimental.pallas.ops.tpu import splash_attention as sa

    d = q_BSHD.shape[-1]
    q_BHSD = (q_BSHD * jnp.asarray(d ** -0.5, q_BSHD.dtype)).transpose(0, 2, 1, 3)
    k_BKSD, v_BKSD = k_BSKD.transpose(0, 2, 1, 3), v_BSKD.transpose(0, 2, 1, 3)
    seg_q, seg_k = segment_ids_BS.astype(jnp.int32), segment_ids_k_BS.astype(jnp.int32)
    out = jax.vmap(lambda q, k, v, sq, sk: kernel(q, k, v, segment_ids=sa.SegmentIds(sq, sk)))(
        q_BHSD, k_BKSD, v_BKSD, seg_q, seg_k)
    return out.transpose(0, 2, 1, 3)


def _splash_local(q_BSHD, k_BSKD, v_BSKD, segment_ids_BS, interpret: bool = False):
    """Splash attention on one shard's arrays (all heads and the full sequence local)."""
    _, s, h, _ = q_BSHD.shape
    return _splash_call(_splash_kernel(s, h, interpret=interpret), q_BSHD, k_BSKD, v_BSKD, segment_ids_BS,
                        segment_ids_BS)


def _dividing(spec, shape, mesh):
    """`spec` with the entries whose mesh axes do not divide the dim replaced by None (e.g. the
    batch of 1 row that initialization traces)."""
    out = []
    for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec)), strict=False):
        out.append(axes if dim % _axes_size(axes, mesh) == 0 else None)
    return jax.sharding.PartitionSpec(*out)


def _axes_size(axes, mesh) -> int:
    names = () if axes is None else (axes if isinstance(axes, tuple) else (axes,))
    size = 1
    for name in names:
        size *= mesh.shape[name]
    return size


def _head_specs(q_BSHD, k_BSKD, v_BSKD, mesh, q_length, kv_length):
    """(k, v, q_spec, kv_spec) for a shard_map over the batch and head axes of the current rules,
    the queries' length dim by the logical name `q_length`, the keys' by `kv_length` (None:
    whole). K/V heads replicated over the axis that splits the query heads are repeated, so
    each shard holds the K/V heads of its query heads."""
    q_spec = _dividing(nn.logical_to_mesh_axes(("batch", q_length, "act_heads", "act_kv")), q_BSHD.shape, mesh)
    kv_spec = _dividing(nn.logical_to_mesh_axes(("batch", kv_length, "act_kv_heads", "act_kv")), k_BSKD.shape, mesh)
    if kv_spec[0] != q_spec[0]:
        kv_spec = jax.sharding.PartitionSpec(q_spec[0], *kv_spec[1:])
    if q_spec[2] is not None and kv_spec[2] is None:
        g = q_BSHD.shape[2] // k_BSKD.shape[2]
        k_BSKD, v_BSKD = (jnp.repeat(t, g, axis=2) for t in (k_BSKD, v_BSKD))
        kv_spec = jax.sharding.PartitionSpec(q_spec[0], kv_spec[1], *q_spec[2:])
    return k_BSKD, v_BSKD, q_spec, kv_spec


def splash(q_BSHD, k_BSKD, v_BSKD, segment_ids_BS, interpret: bool = False):
    """The splash kernel under shard_map over the batch and head mesh axes of the current rules
    (the whole sequence on every shard; context_parallel splits it)."""
    mesh = jax.sharding.get_abstract_mesh()
    local = functools.partial(_splash_local, interpret=interpret)
    if mesh.empty:
        return local(q_BSHD, k_BSKD, v_BSKD, segment_ids_BS)
    k_BSKD, v_BSKD, q_spec, kv_spec = _head_specs(q_BSHD, k_BSKD, v_BSKD, mesh, None, None)
    seg_spec = jax.sharding.PartitionSpec(q_spec[0], None)
    fn = jax.shard_map(local, mesh=mesh, in_specs=(q_spec, kv_spec, kv_spec, seg_spec), out_specs=q_spec,
                       check_vma=False)
    return fn(q_BSHD, k_BSKD, v_BSKD, segment_ids_BS)


# ----------------------------------------------------------------------------- context parallelism

def context_parallel(q_BSHD, k_BSKD, v_BSKD, segment_ids_BS, implementation: str, block: int, context: int,
                     interpret: bool = False):
    """Attention over a sequence in the load-balanced layout (trainer/context.py) whose length
    dim is split over the mesh axis `context`: each shard keeps its queries (chunks i and
    2C-1-i); keys, values and their segment ids are all-gathered over `context` and put back
    in natural order; causality is masked by each query's original position. dot_product
    under GSPMD (the einsum split on the query dim), blockwise and splash under shard_map."""
    if implementation == "cudnn":
        raise ConfigError(f"context={context} is not implemented for cuDNN attention; use attention='dot_product' "
                          "or context 1 on GPU")
    s, h = q_BSHD.shape[1], q_BSHD.shape[2]
    q_pos = context_lib.order(s, context).astype(np.int32)
    whole = ("batch", None, "act_kv_heads", "act_kv")

    def gathered(t, names):  # all-gather over context, then natural order (a local permutation)
        return nn.with_logical_constraint(context_lib.restore(nn.with_logical_constraint(t, names), context), names)

    k_BSKD, v_BSKD = gathered(k_BSKD, whole), gathered(v_BSKD, whole)
    seg_k = gathered(segment_ids_BS, ("batch", None))
    if implementation == "dot_product":
        q_pos_S = nn.with_logical_constraint(jnp.asarray(q_pos), ("length",))
        return dot_product(q_BSHD, k_BSKD, v_BSKD, segment_ids_BS, seg_k, q_pos_S)
    if implementation not in ("blockwise", "splash"):
        raise ConfigError(f"unknown attention implementation {implementation!r}; one of {', '.join(IMPLEMENTATIONS)}")
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:  # one device holds every shard's queries: the same function on the whole layout
        if implementation == "splash":
            kernel = _splash_kernel(s, h, context, interpret)
            return _splash_call(kernel, q_BSHD, k_BSKD, v_BSKD, segment_ids_BS, seg_k)
        return blockwise(q_BSHD, k_BSKD, v_BSKD, segment_ids_BS, block, seg_k, jnp.asarray(q_pos))
    k_BSKD, v_BSKD, q_spec, kv_spec = _head_specs(q_BSHD, k_BSKD, v_BSKD, mesh, "length", None)
    P = jax.sharding.PartitionSpec
    specs = (q_spec, kv_spec, kv_spec, P(q_spec[0], q_spec[1]), P(q_spec[0], None), P(q_spec[1]))
    args = (q_BSHD, k_BSKD, v_BSKD, segment_ids_BS, seg_k, jnp.asarray(q_pos))
    if implementation == "blockwise":
        fn = jax.shard_map(lambda q, k, v, sq, sk, qp: blockwise(q, k, v, sq, block, sk, qp), mesh=mesh,
                           in_specs=specs, out_specs=q_spec, check_vma=False)
        return fn(*args)
    # splash: the kernel's mask data split over the query shards, passed as a shard_map argument
    kernel = _splash_kernel(s, h // _axes_size(q_spec[2], mesh), context, interpret)
    kernel_spec = kernel.manual_sharding_spec(jax.sharding.NamedSharding(mesh, P(None, q_spec[1])))
    splash_fn = jax.shard_map(lambda kern, q, k, v, sq, sk, _: _splash_call(kern, q, k, v, sq, sk), mesh=mesh,
                              in_specs=(kernel_spec,) + specs, out_specs=q_spec, check_vma=False)
    return splash_fn(kernel, *args)


# ----------------------------------------------------------------------------- GPU cuDNN

def cudnn(q_BSHD, k_BSKD, v_BSKD, segment_ids_BS):
    same_segment = (segment_ids_BS[:, :, None] == segment_ids_BS[:, None, :])[:, None]
    return jax.nn.dot_product_attention(q_BSHD, k_BSKD, v_BSKD, mask=same_segment, is_causal=True,
                                        implementation="cudnn")

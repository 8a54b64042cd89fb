"""Multi-head latent attention (MLA, DeepSeek-V2/V3; ModelConfig.attention_type = "mla").

Per token x (d_model), H heads, as DeepSeek's modeling code and MaxText's attention_mla.py:

    queries:  c_q = RMSNorm(x W_q_a)              rank q_lora_rank   (q_lora_rank = 0: q = x W_q, no latent)
              q   = c_q W_q_b                     H x (qk_nope + qk_rope)
    keys/values:
              [c_kv, k_rope] = x W_kv_a           rank kv_lora_rank, plus one qk_rope-wide key part
              [k_nope, v] = RMSNorm(c_kv) W_kv_b  H x (qk_nope + v_head_dim)
    RoPE on q's last qk_rope dims and on k_rope (one rotary key part, shared by all heads);
    k = [k_nope, k_rope broadcast to the H heads]; attention softmax(q k^T / sqrt(qk_nope + qk_rope)) v;
    output (H x v_head_dim) W_out back to d_model.

The attention itself is trainer/attention.py `attend` (every implementation, with context
parallelism): the scale 1/sqrt(D) it applies reads D from q, the query/key head dim. The value
head dim (128 for DeepSeek) is below it (192): the splash kernel takes a value head dim of its
own (jax's splash kernels read head_dim_v from v, forward and backward), so v goes in as it is;
the other implementations (dot_product, blockwise, cuDNN) take one head dim for q, k and v, so
v is zero-padded to the query/key head dim and the output's padded columns (zeros: each output is
a convex sum of v rows) are sliced off. Those padded columns are hardware FLOPs only: model FLOPs
count the PV product at v_head_dim (trainer/flops.py).

Parameter names are MaxText's (wq_a, q_norm, wq_b or query, wkv_a, kv_norm, wkv_b, out). Logical
axes (trainer/sharding.py): the down-projections' embed dim over fsdp as every weight's, their
latent outputs ("q_lora_up", "kv_lora_up") whole; the up-projections' latent inputs ("q_lora",
"kv_lora") over fsdp (as MaxText's rules, where the latent rank divides), their heads over tensor.
Remat tags (trainer/remat.py), as MaxText's: query_proj is the query after RoPE, key_proj the whole
key (nope and rope parts), value_proj the value, context the attention output, out_proj the output
projection; the latents are untagged (recomputed).

Not modeled: YaRN RoPE scaling (DeepSeek's rope_scaling type yarn: rotation frequencies and the
softmax scale's mscale factor for long context; no parameters, no matmul, the same FLOPs and
shapes: plain RoPE at rope_theta here) and DeepSeek's interleaved RoPE pair layout (a fixed
permutation of the RoPE dims, no effect on training from scratch).
"""
from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from . import attention as attention_lib
from . import remat as remat_lib
from .config import ModelConfig

# implementations that take a value head dim of its own; the others get v zero-padded to q's
NATIVE_V_HEAD_DIM = ("splash",)


class MLA(nn.Module):
    """Multi-head latent attention on the normed stream h_BSE; returns the B x S x E output."""

    cfg: ModelConfig
    attention_impl: str = "dot_product"  # a concrete attention.IMPLEMENTATIONS name
    context: int = 1  # context parallelism (attention.attend)

    @nn.compact
    def __call__(self, h_BSE, segment_ids_BS, positions_BS):
        from .model import Proj, RMSNorm, rope  # model.py imports this module

        c = self.cfg
        n_h, nope, r, dv = c.n_heads, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim
        dqk = nope + r
        if c.q_lora_rank:
            cq_BSL = Proj((c.d_model,), (c.q_lora_rank,), ("embed", "q_lora_up"), c, name="wq_a")(h_BSE)
            cq_BSL = RMSNorm(c, name="q_norm")(nn.with_logical_constraint(cq_BSL, ("batch", "length", None)))
            q_BSHD = Proj((c.q_lora_rank,), (n_h, dqk), ("q_lora", "heads", "kv"), c, name="wq_b")(cq_BSL)
        else:
            q_BSHD = Proj((c.d_model,), (n_h, dqk), ("embed", "heads", "kv"), c, name="query")(h_BSE)
        q_act = ("batch", "length", "act_heads", "act_kv")
        q_BSHD = nn.with_logical_constraint(q_BSHD, q_act)
        q_BSHD = jnp.concatenate([q_BSHD[..., :nope], rope(q_BSHD[..., nope:], positions_BS, c.rope_theta)], -1)
        q_BSHD = checkpoint_name(q_BSHD, remat_lib.QUERY)

        ckv_BSL = Proj((c.d_model,), (c.kv_lora_rank + r,), ("embed", "kv_lora_up"), c, name="wkv_a")(h_BSE)
        ckv_BSL = nn.with_logical_constraint(ckv_BSL, ("batch", "length", None))
        k_rope_BS1R = rope(ckv_BSL[..., None, c.kv_lora_rank:], positions_BS, c.rope_theta)
        ckv_BSL = RMSNorm(c, name="kv_norm")(ckv_BSL[..., :c.kv_lora_rank])
        kv_BSHD = Proj((c.kv_lora_rank,), (n_h, nope + dv), ("kv_lora", "heads", "kv"), c, name="wkv_b")(ckv_BSL)
        kv_BSHD = nn.with_logical_constraint(kv_BSHD, q_act)
        k_rope_BSHR = jnp.broadcast_to(k_rope_BS1R, kv_BSHD.shape[:3] + (r,))
        k_BSHD = checkpoint_name(jnp.concatenate([kv_BSHD[..., :nope], k_rope_BSHR], -1), remat_lib.KEY)
        v_BSHV = checkpoint_name(kv_BSHD[..., nope:], remat_lib.VALUE)
        kv_act = ("batch", "length", "act_kv_heads", "act_kv")
        k_BSHD, v_BSHV = (nn.with_logical_constraint(t, kv_act) for t in (k_BSHD, v_BSHV))

        native = self.attention_impl in NATIVE_V_HEAD_DIM
        v_in = v_BSHV if native or dv == dqk else jnp.pad(v_BSHV, ((0, 0), (0, 0), (0, 0), (0, dqk - dv)))
        attn_BSHD = attention_lib.attend(q_BSHD, k_BSHD, v_in, segment_ids_BS, self.attention_impl,
                                         c.attention_block, self.context)
        attn_BSHV = attn_BSHD[..., :dv]
        attn_BSHV = checkpoint_name(nn.with_logical_constraint(attn_BSHV, q_act), remat_lib.CONTEXT)
        return checkpoint_name(Proj((n_h, dv), (c.d_model,), ("heads", "kv", "embed"), c, name="out")(attn_BSHV),
                               remat_lib.OUT)

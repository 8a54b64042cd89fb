"""Published TPU training throughput of MaxText configs, with sources, converted to paxsearch's
MFU convention (README "MFU convention", trainer/flops.py `model_flops_per_step`).

Only facts are copied (numbers, dims, flags) with the repository, file and commit they come
from; no code. Each row is one published table entry that can be traced to a config script.

How MaxText counted FLOPs (google/maxtext git history, MaxText/train.py, later
MaxText/max_utils.py). Per row of S tokens (MaxText multiplies by per_device_batch_size):
  "6N"         6 x N x S. N = calculate_num_params_from_pytree: every parameter, the tied
               embedding table included (so the unembedding matmul is in 6N), plus norm scales.
               Until 0e650131c472bac58c15084a1eb0c6638e4671cf (2023-06-02, "More accurate TFLOP
               math. Now counts attention!").
  "6N+attn"    6 N S + 12 x H x L x Dh x S^2: attention (QK^T and AV) counted in full, no
               causal halving. From 0e650131 (2023-06-02) until the merge of PR #261,
               4e41a72d1929ddfd92ec45c107f6991a546b2d9c (2023-11-30), which brought
               64ee4e93811e4de8ad6785710f881aa9879e0884 ("support sequence parallelism").
  "6N+causal"  6 N S + 12 H L Dh S^2 / 2 ("noncasual_attention_flops / 2 # due to causality").
               From 4e41a72d (2023-11-30) until 353fb837cf6ecea9bf416341e568c5fc7153ccf0
               (2024-05-08, per-matmul count, attention in full again).
paxsearch per row: 3 x forward = 6 x (matmul weights, the unembedding included) x S +
6 x H x L x Dh x S^2 (causal half). So our count equals MaxText's "6N+causal" up to the norm
scales inside N (L x d + d: < 0.002% here), "6N+attn" counts the attention twice ours, "6N"
omits it. The conversion keeps MaxText's measured step time and changes only the FLOPs:
    converted TFLOP/s = published TFLOP/s x ours / MaxText's;  converted MFU likewise
(the peak per chip is the same: v4 275, v5e 197, v5p 459 TFLOP/s bf16, as in
trainer/flops.py PEAK_BF16_FLOPS; MaxText's own MFU is its TFLOP/s over the same peaks).

Which formula each number used: the commit that published it (the table's first
appearance in the README or configs README) and the formula in MaxText's code at that commit.

Batch: MaxText's per_device_batch_size is rows per chip over ALL chips (global batch =
per_device_batch_size x chips, MaxText/pyconfig.py calculate_global_batch_sizes), also
with tensor parallelism; paxsearch's per_device_batch is per device on the batch axes
only, so the bench sets `global_batch` = per_device_batch_size x chips instead.

Remat: MaxText "full" = nn.remat with policy None (nothing saved) = our "full";
MaxText "minimal" (MaxText/layers/models.py @76bd53b0) =
jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims (the same function as
dots_with_no_batch_dims_saveable) = our "dots_no_batch", not our "minimal".
Activation sharding: MaxText's logical_axis_rules at both 2023 commits shard
'activation_embed' over 'tensor' (the residual stream's embed dim), which is our
rules="sequence_parallel" (trainer/sharding.py); with tensor 1 it is the same layout as "default".
Compiler flags: the v5e scripts' LIBTPU_INIT_ARGS are exactly our flag set
"collective_fusion" (its 7 flags, from MaxText's benchmarks/xla_flags_library.py). The v5p
scripts set 6 of those 7 (not ..._fuse_all_gather) plus megacore_fusion_allow_ags=false,
async_collective_permute and ag_backward_pipelining: exactly our set "v5p_collectives", which
the v5p rows compile with ("collective_fusion" is refused by the v5p compiler:
"FAILED_PRECONDITION: Continuation fusion for AllGather is enabled on platform viper", 4 s,
the reason the v5p scripts leave that flag out). The v4 script sets only --xla_enable_async_all_gather
(and TPU_MEGACORE=MEGACORE_DENSE, the megacore mode our v4 topology compiles for): "default".
Attention: MaxText 'flash' (the Pallas TPU flash kernel) = our attention="flash" (splash kernel
on TPU); MaxText's plain attention (2023-04: MultiHeadDotProductAttention) = "dot_product".
"""
from __future__ import annotations

from dataclasses import dataclass

MAXTEXT = "google/maxtext"

# Commits (full hashes) that published numbers, with dates
C_V4_22B = "281e04bf31557482e2aa6bb870897e7b7be47f38"  # 2023-04-27 "Update readme with new perf results"
C_V5E_16_32 = "ebb226da831210cf6d6ff774aef937689bb1d612"  # 2023-10-24 "Update v5e perf results ..."
C_V5E_64_128 = "5ebcd67fe65334234b116b1453c23920480e4d78"  # 2023-10-27 "Add 64B and 128B results ..."
C_V5P = "76bd53b0f44caf989c88189afadeb1062f9254f0"  # 2023-12-15 "Refactor MaxText/configs/ and documentation"

FORMULAS = {
    "6N": "MaxText/train.py before 0e650131 (2023-06-02): 6 x params x tokens",
    "6N+attn": "MaxText/train.py calculate_training_tflops from 0e650131 (2023-06-02): "
               "6 N S + 12 H L Dh S^2 per row (attention in full)",
    "6N+causal": "MaxText/max_utils.py calculate_tflops_training_per_device from 4e41a72d (merged 2023-11-30): "
                 "6 N S + 12 H L Dh S^2 / 2 per row (causal half)",
}

PEAK_TFLOPS = {"v4": 275.0, "v5e": 197.0, "v5p": 459.0}  # bf16 dense per chip, as MaxText divides


@dataclass(frozen=True)
class Published:
    """One published MaxText throughput figure and the config it ran."""

    name: str
    preset: str  # trainer/presets.py name of the exact dims
    target: str  # paxsearch target: one slice, chips as Google Cloud names it
    chips: int
    ici: tuple[int, int, int]  # (data, fsdp, tensor) as the config script sets it
    maxtext_per_device_batch: int  # rows per chip over all chips (global = this x chips)
    remat: str  # MaxText's remat_policy
    attention: str  # MaxText's attention ("flash" or "mha")
    tflops: float  # published TFLOP/s per chip (MaxText's formula)
    mfu: float  # published MFU (fraction)
    formula: str  # key of FORMULAS used by the published number
    published_in: str  # repository, file and commit of the table entry
    config: str  # repository, file and commit of the config script
    flags: str = "default"  # our compiler flag set (trainer/flagsets.py) nearest the script's LIBTPU_INIT_ARGS
    held_out: bool = False  # kept aside: checked after the calibration rows, never tuned against
    ran: bool = True  # the config ran (a published measurement exists)
    note: str = ""

    @property
    def chip(self) -> str:
        return self.target.split(":")[1].split("-")[0]

    @property
    def global_batch(self) -> int:
        return self.maxtext_per_device_batch * self.chips


ROWS = (
    Published(
        name="v5e-256 16B", preset="maxtext-v5e-16b", target="tpu:v5e-256", chips=256, ici=(1, 256, 1),
        maxtext_per_device_batch=6, remat="full", attention="flash", tflops=120, mfu=0.6110, formula="6N+attn",
        flags="collective_fusion",
        published_in=f"{MAXTEXT} README.md@{C_V5E_16_32} (1x v5e-256: 120, 67.10%; MFU corrected to 61.10% in "
                     "9bc243c9536bbd80268be23f6374a164fa36efbe, 2023-10-27 'Fix performance numbers')",
        config=f"{MAXTEXT} MaxText/configs/largest_job/16b.sh@{C_V5E_64_128} (per_device_batch_size=6, "
               "remat_policy=full, global_parameter_scale=16, max_target_length=2048, enable_flash_attention=true; "
               "ici_fsdp_parallelism defaults to all chips); = MaxText/configs/v5e/16b.sh@" + C_V5P),
    Published(
        name="v5e-256 32B", preset="maxtext-v5e-32b", target="tpu:v5e-256", chips=256, ici=(1, 256, 1),
        maxtext_per_device_batch=4, remat="full", attention="flash", tflops=132, mfu=0.6686, formula="6N+attn",
        flags="collective_fusion", published_in=f"{MAXTEXT} README.md@{C_V5E_16_32} (1x v5e-256: 132, 66.86%)",
        config=f"{MAXTEXT} MaxText/configs/largest_job/32b.sh@{C_V5E_64_128} (per_device_batch_size=4, "
               "remat_policy=full, global_parameter_scale=32, max_target_length=2048, enable_flash_attention=true); "
               "= MaxText/configs/v5e/32b.sh@" + C_V5P),
    Published(
        name="v4-128 22B", preset="maxtext-v4-22b", target="tpu:v4-128", chips=64, ici=(1, 64, 1),
        maxtext_per_device_batch=16, remat="full", attention="mha", tflops=156, mfu=0.567, formula="6N",
        published_in=f"{MAXTEXT} README.md@{C_V4_22B} (1x v4-128: 156, 56.7%, replacing 165, 60.0%)",
        config=f"{MAXTEXT} MaxText/configs/1xv4-128.sh@{C_V4_22B} (ici_fsdp_parallelism=64, "
               "per_device_batch_size=16, remat_policy=full, scale=3; base.yml max_target_length 1024, plain "
               "attention: no flash kernel in MaxText then)",
        note="v4-128 names 128 TensorCores = 64 chips (megacore)."),
    Published(
        name="v5p-128 32B", preset="maxtext-v5e-32b", target="tpu:v5p-128", chips=64, ici=(1, 16, 4),
        maxtext_per_device_batch=8, remat="minimal", attention="flash", tflops=328, mfu=0.7147,
        formula="6N+causal",
        flags="v5p_collectives",
        published_in=f"{MAXTEXT} MaxText/configs/v5p/README.md@{C_V5P} and README.md there (1x v5p-128: 328, "
                     "71.47%)",
        config=f"{MAXTEXT} MaxText/configs/v5p/32b.sh@{C_V5P} (per_device_batch_size=8, remat_policy=minimal, "
               "global_parameter_scale=32, ici_fsdp_parallelism=-1 (16), ici_tensor_parallelism=4, "
               "max_target_length=2048, attention='flash')",
        note="The first publication of this number is the commit whose code halves causal attention (merged "
             "2023-11-30, two weeks before); that the run itself used that code is likely, not recorded."),
    # held out: the same families, kept aside to check the result, never tuned against
    Published(
        name="v5e-256 64B", preset="maxtext-v5e-64b", target="tpu:v5e-256", chips=256, ici=(1, 256, 1),
        maxtext_per_device_batch=2, remat="full", attention="flash", tflops=118, mfu=0.5990, formula="6N+attn",
        flags="collective_fusion", published_in=f"{MAXTEXT} README.md@9bc243c9536bbd80268be23f6374a164fa36efbe and "
                     f"v5e_high_performance.md@{C_V5E_64_128} (1x v5e-256: 118, 59.90%)",
        config=f"{MAXTEXT} MaxText/configs/largest_job/64b.sh@{C_V5E_64_128} (per_device_batch_size=2, "
               "remat_policy=full, global_parameter_scale=64, enable_flash_attention=true)",
        held_out=True),
    Published(
        name="v5e-256 128B", preset="maxtext-v5e-128b", target="tpu:v5e-256", chips=256, ici=(1, 16, 16),
        maxtext_per_device_batch=1, remat="full", attention="flash", tflops=110, mfu=0.5606, formula="6N+attn",
        flags="collective_fusion", published_in=f"{MAXTEXT} README.md@9bc243c9536bbd80268be23f6374a164fa36efbe and "
                     f"v5e_high_performance.md@{C_V5E_64_128} (1x v5e-256: 110, 56.06%)",
        config=f"{MAXTEXT} MaxText/configs/largest_job/128b.sh@{C_V5E_64_128} (per_device_batch_size=1, "
               "remat_policy=full, global_parameter_scale=128, ici_fsdp_parallelism=16, ici_tensor_parallelism=16, "
               "enable_flash_attention=true)",
        held_out=True),
    Published(
        name="v5p-128 64B", preset="maxtext-v5e-64b", target="tpu:v5p-128", chips=64, ici=(1, 16, 4),
        maxtext_per_device_batch=4, remat="minimal", attention="flash", tflops=323, mfu=0.7031,
        formula="6N+causal",
        flags="v5p_collectives",
        published_in=f"{MAXTEXT} MaxText/configs/v5p/README.md@{C_V5P} (1x v5p-128: 323, 70.31%)",
        config=f"{MAXTEXT} MaxText/configs/v5p/64b.sh@{C_V5P} (per_device_batch_size=4, remat_policy=minimal, "
               "global_parameter_scale=64, ici_fsdp_parallelism=-1 (16), ici_tensor_parallelism=4, attention='flash')",
        held_out=True),
)

BY_NAME = {r.name: r for r in ROWS}

# MaxText's names -> paxsearch's (trainer/remat.py, model attention)
REMAT = {"full": "full", "minimal": "dots_no_batch"}
ATTENTION = {"flash": "flash", "mha": "dot_product"}


def rules(row: Published) -> str:
    """Our activation-sharding rules for the row (see the module docstring)."""
    return "sequence_parallel" if row.ici[2] > 1 else "default"


def _dims(row: Published):
    from paxsearch.trainer import presets
    return presets.get(row.preset)


def maxtext_params(row: Published) -> int:
    """N as MaxText's calculate_num_params_from_pytree counts it for these 2023 models: per layer
    the q/k/v/out projections, two MLP matrices and one norm scale (parallel block), the tied
    embedding once, the final norm. (The April 2023 v4 model's relative position bias tables,
    32 x heads per layer, are left out: 0.0002% of N.)"""
    m = _dims(row)
    per_layer = 4 * m.d_model * m.n_heads * m.head_dim + 2 * m.d_model * m.d_ff + m.d_model
    return m.n_layers * per_layer + m.vocab_size * m.d_model + m.d_model


def maxtext_flops_per_row(row: Published) -> float:
    """Training FLOPs of one sequence as MaxText counted them for this row's number."""
    m = _dims(row)
    s = m.seq_len
    weights = 6 * maxtext_params(row) * s
    attention_full = 12 * m.n_heads * m.n_layers * m.head_dim * s * s
    return weights + {"6N": 0.0, "6N+attn": attention_full, "6N+causal": attention_full / 2}[row.formula]


def our_flops_per_row(row: Published) -> float:
    """Training FLOPs of one sequence in paxsearch's convention (trainer/flops.py)."""
    from paxsearch.trainer import flops
    return float(flops.model_flops_per_step(_dims(row), 1))


def conversion(row: Published) -> float:
    """ours / MaxText's FLOPs for the same step: multiply a published figure by it."""
    return our_flops_per_row(row) / maxtext_flops_per_row(row)


def converted_mfu(row: Published) -> float:
    return row.mfu * conversion(row)


def converted_tflops(row: Published) -> float:
    return row.tflops * conversion(row)


def published_step_time(row: Published) -> float:
    """Seconds per step implied by the published figure: MaxText's FLOPs per chip / (MFU x peak)."""
    return maxtext_flops_per_row(row) * row.maxtext_per_device_batch / (row.mfu * PEAK_TFLOPS[row.chip] * 1e12)


def table() -> str:
    """The published table, converted, as Markdown."""
    lines = ["| config | preset | mesh (d,f,t) | global batch | remat (ours) | attention (ours) | published "
             "TFLOP/s, MFU | formula | ours / MaxText FLOPs | MFU, our convention | step s (implied) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in ROWS:
        lines.append(
            f"| {r.name}{' (held out)' if r.held_out else ''} | {r.preset} | {'x'.join(map(str, r.ici))} "
            f"| {r.global_batch} | {r.remat} ({REMAT[r.remat]}) | {r.attention} ({ATTENTION[r.attention]}) "
            f"| {r.tflops:g}, {r.mfu:.2%} | {r.formula} | {conversion(r):.4f} | {converted_mfu(r):.2%} "
            f"| {published_step_time(r):.2f} |")
    return "\n".join(lines)

"""Published TPU training throughput of MaxText configs, with sources, converted to paxsearch's
MFU convention (README "MFU convention", trainer/flops.py `model_flops_per_step`).

Not a benchmark: the peer data (published figures) that bench_published.py, bench_recipes.py,
bench_published.py --gpu, bench_maxtext_compile.py and diag_figures.py compare against.

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

import dataclasses
from dataclasses import dataclass

MAXTEXT = "google/maxtext"

# Commits (full hashes) that published numbers, with dates
C_V4_22B = "281e04bf31557482e2aa6bb870897e7b7be47f38"  # 2023-04-27 "Update readme with new perf results"
C_V5E_16_32 = "ebb226da831210cf6d6ff774aef937689bb1d612"  # 2023-10-24 "Update v5e perf results ..."
C_V5E_64_128 = "5ebcd67fe65334234b116b1453c23920480e4d78"  # 2023-10-27 "Add 64B and 128B results ..."
C_FIX = "9bc243c9536bbd80268be23f6374a164fa36efbe"  # the same day, "Fix performance numbers"
C_V5P = "76bd53b0f44caf989c88189afadeb1062f9254f0"  # 2023-12-15 "Refactor MaxText/configs/ and documentation"

FORMULAS = {
    "6N": "MaxText/train.py before 0e650131 (2023-06-02): 6 x params x tokens",
    "6N+attn": "MaxText/train.py calculate_training_tflops from 0e650131 (2023-06-02): "
               "6 N S + 12 H L Dh S^2 per row (attention in full)",
    "6N+causal": "MaxText/max_utils.py calculate_tflops_training_per_device from 4e41a72d (merged 2023-11-30): "
                 "6 N S + 12 H L Dh S^2 / 2 per row (causal half)",
}

# bf16 dense per chip, as MaxText divides. v6e (Trillium): 918 TFLOP/s bf16 per chip, Google Cloud's
# TPU v6e page (https://cloud.google.com/tpu/docs/v6e: 918 TFLOP/s bf16 per chip), the figure and source
# trainer/hardware.py holds; MaxText's own logs agree: 417.397 TFLOP/s is 45.47% of it (RECIPES).
PEAK_TFLOPS = {"v4": 275.0, "v5e": 197.0, "v5p": 459.0, "v6e": 918.0}


class _OnASlice:
    """What a published run derives from its target, chips (of one slice), slices and MaxText batch."""

    target: str
    chips: int
    maxtext_per_device_batch: int
    slices = 1  # Published overrides it with a field (a Recipe runs on one slice)

    @property
    def chip(self) -> str:
        return self.target.split(":")[1].split("-")[0]

    @property
    def global_batch(self) -> int:
        return self.maxtext_per_device_batch * self.chips * self.slices


@dataclass(frozen=True)
class Published(_OnASlice):
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
    causal_attention: bool = True  # False: the published program computed every S x S block (V5E_2023_ATTENTION)
    slices: int = 1  # slices over the data-center network: MaxText's dcn_data_parallelism (-1: all of them)


# What MaxText's 2023-10 v5e program did that ours does not (read at C_V5E_16_32, MaxText/layers.py
# apply_attention): with enable_flash_attention it transposed q, k, v to (batch, heads, length, kv) and
# called jax.experimental.pallas.ops.tpu.flash_attention with causal=False, no segment ids and 512 blocks,
# under shard_map: every S x S block computed, where our splash kernel skips the blocks above the
# diagonal (n (n + 1) / 2 of n^2, 10 of 16 at S 2048, block 512). By 76bd53b0 (the v5p rows) the call
# had causal=True. benchmarks/RESULTS.md, "What the published programs did", prices the difference.
V5E_2023_ATTENTION = ("MaxText's program of this run computed attention without the causal mask (flash_attention "
                      "causal=False, 512 blocks): 1.6x our splash kernel's attention FLOPs at S 2048")


# Which 512-chip topology the 512B run had: MaxText at 76bd53b0 builds its mesh with jax's
# mesh_utils.create_device_mesh(ici_parallelism, devices) (MaxText/max_utils.py), which in Dec 2023
# (jax ccc8b3f7) laid each mesh axis on whole physical dimensions and raised "Failed to find assignment
# for logical_axis_index ... of size 16 with remaining assignable mesh [8, 8, 8]" for tensor 16 on the
# usual 8x8x8; so the run had a dimension of 16: 4x8x16, the one shape of 512 chips built of 4x4x4 cubes
# that holds fsdp 32 x tensor 16 (tests/search/planning/test_topology_wrap.py). Our trainer splits a dimension
# instead (allow_split_physical_axes), which the run could not.
TENSOR_16_ON_512 = ("planned on v5p-1024@4x8x16: the script's tensor 16 cannot be laid on the usual 8x8x8 by "
                    "the jax of its time, so the run's slice had a dimension of 16")

ROWS = (
    Published(
        name="v5e-256 16B", preset="maxtext-v5e-16b", target="tpu:v5e-256", chips=256, ici=(1, 256, 1),
        maxtext_per_device_batch=6, remat="full", attention="flash", tflops=120, mfu=0.6110, formula="6N+attn",
        flags="collective_fusion",
        published_in=f"{MAXTEXT} README.md@{C_V5E_16_32} (1x v5e-256: 120, 67.10%; MFU corrected to 61.10% in "
                     f"{C_FIX}, 'Fix performance numbers')",
        config=f"{MAXTEXT} MaxText/configs/largest_job/16b.sh@{C_V5E_64_128} (per_device_batch_size=6, "
               "remat_policy=full, global_parameter_scale=16, max_target_length=2048, enable_flash_attention=true; "
               "ici_fsdp_parallelism defaults to all chips); = MaxText/configs/v5e/16b.sh@" + C_V5P,
        note=V5E_2023_ATTENTION, causal_attention=False),
    Published(
        name="v5e-256 32B", preset="maxtext-v5e-32b", target="tpu:v5e-256", chips=256, ici=(1, 256, 1),
        maxtext_per_device_batch=4, remat="full", attention="flash", tflops=132, mfu=0.6686, formula="6N+attn",
        flags="collective_fusion", published_in=f"{MAXTEXT} README.md@{C_V5E_16_32} (1x v5e-256: 132, 66.86%)",
        config=f"{MAXTEXT} MaxText/configs/largest_job/32b.sh@{C_V5E_64_128} (per_device_batch_size=4, "
               "remat_policy=full, global_parameter_scale=32, max_target_length=2048, enable_flash_attention=true); "
               "= MaxText/configs/v5e/32b.sh@" + C_V5P,
        note=V5E_2023_ATTENTION, causal_attention=False),
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
        flags="collective_fusion", published_in=f"{MAXTEXT} README.md and v5e_high_performance.md@{C_FIX} (1x v5e-256: "
                     f"118, 59.90%; first published as 114, 57.8% in v5e_high_performance.md@{C_V5E_64_128}, the same "
                     "day, and revised by 'Fix performance numbers')",
        config=f"{MAXTEXT} MaxText/configs/largest_job/64b.sh@{C_V5E_64_128} (per_device_batch_size=2, "
               "remat_policy=full, global_parameter_scale=64, enable_flash_attention=true)",
        held_out=True,
        note=V5E_2023_ATTENTION, causal_attention=False),
    Published(
        name="v5e-256 128B", preset="maxtext-v5e-128b", target="tpu:v5e-256", chips=256, ici=(1, 16, 16),
        maxtext_per_device_batch=1, remat="full", attention="flash", tflops=110, mfu=0.5606, formula="6N+attn",
        flags="collective_fusion", published_in=f"{MAXTEXT} README.md and v5e_high_performance.md@{C_FIX} (1x v5e-256: "
                     f"110, 56.06%; first published as 113, 57.3% in v5e_high_performance.md@{C_V5E_64_128}, the same "
                     "day, and revised by 'Fix performance numbers')",
        config=f"{MAXTEXT} MaxText/configs/largest_job/128b.sh@{C_V5E_64_128} (per_device_batch_size=1, "
               "remat_policy=full, global_parameter_scale=128, ici_fsdp_parallelism=16, ici_tensor_parallelism=16, "
               "enable_flash_attention=true)",
        held_out=True,
        note=V5E_2023_ATTENTION, causal_attention=False),
    Published(
        name="v5p-128 64B", preset="maxtext-v5e-64b", target="tpu:v5p-128", chips=64, ici=(1, 16, 4),
        maxtext_per_device_batch=4, remat="minimal", attention="flash", tflops=323, mfu=0.7031,
        formula="6N+causal",
        flags="v5p_collectives",
        published_in=f"{MAXTEXT} MaxText/configs/v5p/README.md@{C_V5P} (1x v5p-128: 323, 70.31%)",
        config=f"{MAXTEXT} MaxText/configs/v5p/64b.sh@{C_V5P} (per_device_batch_size=4, remat_policy=minimal, "
               "global_parameter_scale=64, ici_fsdp_parallelism=-1 (16), ici_tensor_parallelism=4, attention='flash')",
        held_out=True),
    # The rest of the single-slice rows of the same v5p table (added 2026-12-06; held out like the others: planned
    # once with the planner as it stood, never tuned against). All six share the 32B/64B scripts' LIBTPU_INIT_ARGS.
    *(Published(
        name=f"{target} {label}", preset=preset, target=f"tpu:{target}{topology}", chips=chips,
        ici=(1, chips // tensor, tensor),
        maxtext_per_device_batch=2, remat=remat, attention="flash", tflops=tflops, mfu=mfu, formula="6N+causal",
        flags="v5p_collectives",
        published_in=f"{MAXTEXT} MaxText/configs/v5p/README.md@{C_V5P} ('{label} model', 1x {target}: {tflops}, "
                     f"{mfu:.2%})",
        config=f"{MAXTEXT} MaxText/configs/v5p/{label.lower()}.sh@{C_V5P} (per_device_batch_size=2, "
               f"remat_policy={remat}, global_parameter_scale={label[:-1]}, ici_fsdp_parallelism=-1 "
               f"({chips // tensor}), ici_tensor_parallelism={tensor}, max_target_length=2048, attention='flash')",
        held_out=True, note=TENSOR_16_ON_512 if topology else "")
      for label, preset, target, topology, chips, tensor, remat, tflops, mfu in (
          ("128B", "maxtext-v5e-128b", "v5p-256", "", 128, 8, "minimal", 315, 0.6868),
          ("128B", "maxtext-v5e-128b", "v5p-512", "", 256, 8, "minimal", 316, 0.6883),
          ("256B", "maxtext-v5p-256b", "v5p-1024", "", 512, 8, "minimal", 308, 0.6709),
          ("512B", "maxtext-v5p-512b", "v5p-1024", "@4x8x16", 512, 16, "full", 294, 0.6399),
          ("1024B", "maxtext-v5p-1024b", "v5p-2048", "", 1024, 16, "full", 254, 0.5535),
          ("1024B", "maxtext-v5p-1024b", "v5p-4096", "", 2048, 16, "full", 297, 0.6480))),
)


def _on_slices(row: Published, slices: int, tflops: float, mfu: float, published_in: str) -> Published:
    """The same config run on `slices` slices joined by DCN (data parallelism across them, as MaxText's
    base.yml dcn_data_parallelism -1 lays it); the per-chip batch, mesh and flags of one slice."""
    return dataclasses.replace(row, name=f"{slices}x {row.name}", target=f"{row.target},slices={slices}",
                               slices=slices, tflops=tflops, mfu=mfu, published_in=published_in, held_out=True)


# The multi-slice entries of the same tables (held out; added 2026-12-06, planned once, never tuned against):
# MaxText's README at the commits of the one-slice figures (v5e: 2x, 4x, 8x and 16x of each size, all the
# README had at C_FIX; v5p: every 2x entry).
_V5E_README = f"{MAXTEXT} README.md@{C_FIX}"
_V5P_README = f"{MAXTEXT} MaxText/configs/v5p/README.md@{C_V5P}"
_ONE_SLICE = {r.name: r for r in ROWS}
MULTISLICE_ROWS = tuple(
    _on_slices(_ONE_SLICE[name], n, tflops, mfu, f"{readme} ('{n}x {name.split()[0]}' of the {name.split()[1]} table: "
                                                   f"{tflops}, {mfu:.2%})")
    for name, n, tflops, mfu, readme in (
        ("v5e-256 16B", 2, 117, 0.5937, _V5E_README), ("v5e-256 16B", 4, 117, 0.5914, _V5E_README),
        ("v5e-256 32B", 2, 128, 0.6481, _V5E_README), ("v5e-256 32B", 4, 126, 0.6410, _V5E_README),
        ("v5e-256 64B", 2, 112, 0.5666, _V5E_README), ("v5e-256 64B", 4, 110, 0.5585, _V5E_README),
        ("v5e-256 128B", 2, 110, 0.5582, _V5E_README), ("v5e-256 128B", 4, 108, 0.5493, _V5E_README),
        ("v5e-256 16B", 8, 115, 0.5827, _V5E_README), ("v5e-256 16B", 16, 111, 0.5656, _V5E_README),
        ("v5e-256 32B", 8, 125, 0.6367, _V5E_README), ("v5e-256 32B", 16, 123, 0.6226, _V5E_README),
        ("v5e-256 64B", 8, 108, 0.5496, _V5E_README), ("v5e-256 64B", 16, 105, 0.5339, _V5E_README),
        ("v5e-256 128B", 8, 104, 0.5293, _V5E_README), ("v5e-256 128B", 16, 100, 0.5086, _V5E_README),
        ("v5p-128 32B", 2, 319, 0.6943, _V5P_README), ("v5p-128 64B", 2, 309, 0.6726, _V5P_README),
        ("v5p-256 128B", 2, 305, 0.6634, _V5P_README), ("v5p-512 128B", 2, 274, 0.5966, _V5P_README),
        ("v5p-1024 256B", 2, 289, 0.6299, _V5P_README), ("v5p-1024 512B", 2, 282, 0.6145, _V5P_README),
        ("v5p-2048 1024B", 2, 237, 0.5155, _V5P_README), ("v5p-4096 1024B", 2, 279, 0.6083, _V5P_README)))
ROWS = ROWS + MULTISLICE_ROWS

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


NONCAUSAL_BLOCK = 512  # the 2023 kernel's block (V5E_2023_ATTENTION)


def _splash_matmuls_full_remat() -> int:
    """S x S matmuls per head and layer of our splash kernels under full remat, as the roofline
    counts them (search/planning/roofline/cost.py SPLASH_MATMULS): the forward twice, dK/dV and dQ once (11)."""
    from paxsearch.search.planning.roofline import SPLASH_MATMULS
    k = dict(SPLASH_MATMULS)
    return 2 * k["splash_mha_fwd"] + k["splash_mha_dkv"] + k["splash_mha_dq"]


def noncausal_extra_flops_per_chip(row: Published) -> float:
    """FLOPs per chip and step that the published program computed beyond our causal splash
    kernels: the S x S blocks above the diagonal (n^2 - n (n + 1) / 2 of n^2, n = S / 512), for
    a row whose program left out the causal mask; 0 for the others. Rows of full remat only."""
    if row.causal_attention:
        return 0.0
    if row.remat != "full":
        raise ValueError(f"{row.name}: the extra attention work is counted for remat 'full' only")
    m = _dims(row)
    s = m.seq_len
    n = s // NONCAUSAL_BLOCK
    data, fsdp, tensor = row.ici
    rows = row.global_batch / (data * fsdp * row.slices)  # sequences per chip (a slice's share of the batch)
    heads = m.n_heads / tensor  # query heads per chip
    every_block = m.n_layers * heads * rows * _splash_matmuls_full_remat() * 2 * s * s * m.head_dim
    return every_block * (1 - n * (n + 1) / 2 / n ** 2)


def noncausal_extra_seconds(row: Published) -> float:
    """noncausal_extra_flops_per_chip at the rate the planner prices the splash kernels at on
    the row's chip (the roofline's Hardware of that chip: peak x attention_efficiency)."""
    from paxsearch.search.planning.predict import hardware_for
    return noncausal_extra_flops_per_chip(row) / hardware_for((), row.chip).sustained_attention_flops


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


# ----------------------------------------------------------------------------------------------------
# MaxText's 2025 recipes (Llama on v6e / v5p), one slice each: the runs issue 19 names as today's
# records. Published in MaxText's docs/reference/models/tiering.md ("Optimized models tiering": MFU and
# approximate tokens/s per device) with a link to each recipe; the run logs quoted in tpu-recipes'
# READMEs give TFLOP/s and tokens/s per device. Each knob of the recipe is traced to our config field
# or named as a gap. `recipe_config` builds the nearest config paxsearch can express (the same model,
# mesh, global batch, remat policy, attention kind and the nearest compiler flag set).

MX = "AI-Hypercomputer/maxtext"  # google/maxtext moved here; the same repository and history
TPU_RECIPES = "AI-Hypercomputer/tpu-recipes"
C_TIERING = "66266787a6ca847790a3b36f90d8e5338af656f5"  # 2026-06-15, docs/reference/models/tiering.md
C_RECIPES = "92e59fdf547421f647590087f50fea5729da42d8"  # 2025-09-26, the commit tiering.md links
C_TAG_V012 = "14b5876ea857c09cc3d8645385f984689376a331"  # tag tpu-recipes-v0.1.2, 2025-04-16
C_TAG_V014 = "9f1820b472ef362e7b5c782fe1d6fda8a0943eff"  # tag tpu-recipes-v0.1.4, 2025-07-10
C_CAUSAL = "a4c01726ee1ba2ab4b5971cb655fcc82aa2fa4d5"  # 2025-07-22 "correct mask flops" (PR #1988)
TRILLIUM = "benchmarks/maxtext_trillium_model_configs.py"
TIERING = f"{MX} docs/reference/models/tiering.md@{C_TIERING}"

RECIPE_FORMULAS = {
    "matmul+attn": f"{MX} MaxText/maxtext_utils.py calculate_tflops_training_per_device@{C_TAG_V014} (and "
                   f"@{C_TAG_V012}): 3 x (2 x tokens x every matmul weight: q/k/v, out, the MLP's 3, the "
                   "unembedding) + 12 H L Dh S^2 per row ('megatron tflops calculation does not account for "
                   "causality in attention'): attention in full",
    "matmul+causal": f"the same, MaxText/maxtext_utils.py@{C_CAUSAL} (2025-07-22, PR #1988) on: attention "
                     "halved 'due to causal mask' (tiering.md footnote 2): our convention exactly",
}


@dataclass(frozen=True)
class Recipe(_OnASlice):
    """One published MaxText recipe run and the nearest config paxsearch expresses."""

    name: str
    preset: str  # trainer/presets.py name of the exact dims
    target: str  # paxsearch target: one slice, named as Google Cloud names it
    chips: int
    maxtext_per_device_batch: int  # rows per chip over all chips (global = this x chips)
    mfu: float  # published MFU (fraction), MaxText's formula
    tokens_per_s: float  # published tokens/s per chip
    formula: str  # key of RECIPE_FORMULAS the published MFU used (checked against tokens/s)
    published_in: str  # repository, file and commit of the figure
    config: str  # repository, file, commit and entry of the recipe
    # every knob of the recipe: (MaxText knob, its value, our field = value, or "gap: ...")
    knobs: tuple[tuple[str, str, str], ...]
    ici: tuple[int, int, int]  # ours: (data, fsdp, tensor)
    remat: str  # ours: a trainer/remat.py policy
    attention: str = "flash"  # ours
    flags: str = "default"  # ours: the nearest trainer/flagsets.py set
    tflops: float | None = None  # TFLOP/s per chip of a quoted log line, where one is published
    ran: bool = True
    note: str = ""

    @property
    def gaps(self) -> list[str]:
        return [f"{k}={v}: {ours[len('gap: '):]}" for k, v, ours in self.knobs if ours.startswith("gap: ")]


_SPLASH_GAP = ("gap: our splash kernel's blocks are fixed (trainer/attention.py SPLASH_BLOCK 512, the largest of "
               "512/256/128 dividing seq_len); MaxText's default is 512 too")
_COMMON_KNOBS = (
    ("attention", "flash", "model.attention=flash (the Pallas splash kernel on TPU)"),
    ("use_iota_embed", "True", "gap: the embedding is a gather (nn.Embed), not an iota one-hot; not a model FLOP "
                               "either way (our convention leaves the lookup out, MaxText's formula too)"),
    ("dataset_type / reuse_example_batch / enable_checkpointing / profiler", "synthetic / - / False / xplane",
     "no effect on the compiled step (plan mode reads no data; checkpoints off by default)"),
    ("dtype / weight_dtype (base.yml)", "bfloat16 / float32", "the presets' dtype=bfloat16, param_dtype=float32"),
    ("opt_type (base.yml)", "adamw", "optimizer: AdamW (OptimizerConfig)"),
)
# the two flags of MaxText's v6e groups that this libtpu refuses on v6e (trainer/flagsets.py, benchmarks/RESULTS.md)
_V6E_REFUSED = ("less --xla_tpu_enable_async_collective_fusion_fuse_all_gather=true, refused by the v6e compiler, "
                "and --2a886c8_chip_config_name, unknown to this libtpu")


def _offload_custom(*tensors: str) -> str:
    from paxsearch.trainer import remat
    return remat.custom(**dict.fromkeys(tensors, "offload"))


_LLAMA31_8B_OFFLOADED = ("decoder_input", "query_proj", "key_proj", "value_proj", "out_proj")
_LLAMA31_8B_XLA = ("DENSE_VMEM_LIMIT_FLAG + LAYOUT_FOR_ALL_REDUCE_SCATTER + DATA_PARALLEL_OVERLAP + "
                   "CF_FOR_ALL_GATHER + ENABLE_SPARSECORE_OFFLOADING_FOR_ALL_REDUCE + HOST_OFFLOAD_FLAGS")


def _llama31_8b_knobs(rows: int, chips: int, xla: str, flags: str) -> tuple[tuple[str, str, str], ...]:
    """The knobs of MaxText's Llama3.1-8B Trillium recipes (llama3_1_8b_8192 and its _no_collective_matmul
    variant): `rows` per chip over `chips`, the recipe's XLA flag groups `xla`, our nearest set `flags`."""
    return (
        ("per_device_batch_size", str(rows), f"global_batch={rows * chips} ({rows} x {chips} chips)"),
        ("ici_fsdp_parallelism", "-1", f"mesh.ici=(1, {chips}, 1): fsdp over the slice"),
        ("remat_policy", "custom", "remat='custom:...' (trainer/remat.py)"),
        ("decoder_layer_input, out_proj, query_proj, key_proj, value_proj", "offload",
         "custom decoder_input/out_proj/query_proj/key_proj/value_proj=offload; the rest recomputed, as MaxText's "
         "save_and_offload_only_these_names"),
        ("max_target_length", "8192", "model.seq_len=8192 (the preset)"),
        ("sa_block_q, sa_block_kv, sa_block_kv_compute, *_dkv, *_dq", "2048", _SPLASH_GAP),
        ("sa_use_fused_bwd_kernel", "True", "gap: our splash backward is the kernel's default (separate dq and "
                                            "dkv kernels)"),
        *_COMMON_KNOBS,
        ("xla_flags", xla, f"flags={flags} (those groups; {_V6E_REFUSED})"),
    )


RECIPES = (
    Recipe(
        name="v6e-256 Llama3.1-8B", preset="llama3.1-8b", target="tpu:v6e-256", chips=256,
        maxtext_per_device_batch=4, mfu=0.4546, tokens_per_s=7207.336, tflops=417.397, formula="matmul+attn",
        published_in=f"{TIERING} (Trillium Gold: 256 chips, SL=8192, 45.46%, ~7,207 tokens/s/device); the log line "
                     f"in {TPU_RECIPES} training/trillium/Llama3.1-8B-MaxText/v6e-256/README.md@a9e09290174425595a0ef6"
                     "ec5f765d5f04360423 ('TFLOP/s/device: 417.397, Tokens/s/device: 7207.336', MaxText tag "
                     "tpu-recipes-v0.1.4, JAX 0.6.1)",
        config=f"{MX} {TRILLIUM}@{C_TAG_V014} llama3_1_8b_8192 (model llama3.1-8b; the same entry @{C_RECIPES})",
        knobs=_llama31_8b_knobs(4, 256, _LLAMA31_8B_XLA, "v6e_llama3"),
        ici=(1, 256, 1), remat=_offload_custom(*_LLAMA31_8B_OFFLOADED), flags="v6e_llama3",
        note="The model is Llama 3.1's (rope scaling aside: trainer/presets.py llama3.1-8b)."),
    Recipe(
        name="v6e-8 Llama3.1-8B", preset="llama3.1-8b", target="tpu:v6e-8", chips=8,
        maxtext_per_device_batch=3, mfu=0.4504, tokens_per_s=7138.890, tflops=413.433, formula="matmul+attn",
        published_in=f"{TPU_RECIPES} training/trillium/Llama3.1-8B-MaxText/v6e-8/README.md@10ca5b92b479825ce36305c06e05"
                     "aefdcb90541f (the log line 'completed step: 14, seconds: 3.443, TFLOP/s/device: 413.433, "
                     "Tokens/s/device: 7138.890', MaxText tag tpu-recipes-v0.1.4); reproduced on another v6e-8 at "
                     "409.4 TFLOP/s and 7,069.7 tokens/s per device, -1.0% (https://github.com/vlasenkoalexey/"
                     "tpu_performance_autoresearch_wiki wiki/experiments/llama3_8B_autoresearch_optimization/maxtext/"
                     "experiments/2026-04-25-maxtext-llama3-1-8b-v6e8-baseline.md@066a0d7f)",
        config=f"{MX} {TRILLIUM}@{C_TAG_V014} llama3_1_8b_8192_no_collective_matmul (model llama3.1-8b)",
        knobs=_llama31_8b_knobs(3, 8, _LLAMA31_8B_XLA + " + DISABLE_COLLECTIVE_MATMUL",
                                "v6e_llama3_no_collective_matmul"),
        ici=(1, 8, 1), remat=_offload_custom(*_LLAMA31_8B_OFFLOADED), flags="v6e_llama3_no_collective_matmul",
        note="Held out: added after the v6e matmul and attention-kernel figures were set (benchmarks/RESULTS.md); "
             "neither was taken from it. The same recipe family as the v6e-256 row, on one 8-chip slice."),
    Recipe(
        name="v6e-256 Llama3.1-70B", preset="llama3.1-70b", target="tpu:v6e-256", chips=256,
        maxtext_per_device_batch=5, mfu=0.5033, tokens_per_s=960, formula="matmul+attn",
        published_in=f"{TIERING} (Trillium Gold: 256 chips, SL=8192, 50.33%, ~960 tokens/s/device; its link "
                     f"{TRILLIUM}@{C_RECIPES}#L959)",
        config=f"{MX} {TRILLIUM}@{C_RECIPES} llama3_1_70b_8192 (model llama3.1-70b)",
        knobs=(
            ("per_device_batch_size", "5", "global_batch=1280 (5 x 256 chips)"),
            ("ici_fsdp_parallelism", "-1", "mesh.ici=(1, 256, 1): fsdp over the slice"),
            ("remat_policy", "custom", "remat='custom:...' (trainer/remat.py)"),
            ("decoder_layer_input, query_proj, key_proj, value_proj", "offload",
             "custom decoder_input/query_proj/key_proj/value_proj=offload; the rest recomputed"),
            ("max_target_length", "8192", "model.seq_len=8192 (the preset)"),
            ("sa_block_q, sa_block_kv, sa_block_kv_compute, *_dkv, *_dq", "2048", _SPLASH_GAP),
            ("sa_use_fused_bwd_kernel", "True", "gap: our splash backward is the kernel's default (separate dq and "
                                                "dkv kernels)"),
            *_COMMON_KNOBS,
            ("xla_flags", "DENSE_VMEM_LIMIT_FLAG + LAYOUT_FOR_ALL_REDUCE_SCATTER + DATA_PARALLEL_OVERLAP + "
             "CF_FOR_ALL_GATHER + HOST_OFFLOAD_FLAGS",
             f"gap: nearest flags=v6e_llama3, those groups ({_V6E_REFUSED}) plus the SparseCore all-reduce offload "
             "that this recipe does not set"),
        ),
        ici=(1, 256, 1), remat=_offload_custom("decoder_input", "query_proj", "key_proj", "value_proj"),
        flags="v6e_llama3",
        note="tokens/s is tiering.md's 'approx' figure: 960 x MaxText's full-attention FLOPs per token / 918 TFLOP/s "
             "= 50.34%, so the figure was counted before the causal halving although the link is to a later commit."),
    Recipe(
        name="v6e-256 Llama2-70B", preset="llama2-70b", target="tpu:v6e-256", chips=256,
        maxtext_per_device_batch=3, mfu=0.438, tokens_per_s=905.021, tflops=402.274, formula="matmul+attn",
        published_in=f"{TIERING} (Trillium Gold: 256 chips, SL=4096, 43.8%, ~900 tokens/s/device); the log line in "
                     f"{TPU_RECIPES} training/trillium/Llama2-70B-MaxText/README.md@9e458c71883a862cb3ba0cd466a223b8a9"
                     "cba426 ('TFLOP/s/device: 402.274, Tokens/s/device: 905.021', MaxText tag tpu-recipes-v0.1.2, "
                     "JAX 0.5.2)",
        config=f"{MX} {TRILLIUM}@{C_TAG_V012} llama2_70b_4096_sc (model llama2-70b; the same entry @{C_RECIPES})",
        knobs=(
            ("per_device_batch_size", "3", "global_batch=768 (3 x 256 chips)"),
            ("ici_fsdp_parallelism, ici_fsdp_transpose_parallelism, ici_tensor_parallelism", "1, -1, 1",
             "gap: no fsdp_transpose axis (MaxText shards the weights' other dim, e.g. the MLP dim, over it); "
             "nearest: mesh.ici=(1, 256, 1), fsdp over the slice: the same per-chip parameter bytes, other "
             "collectives"),
            ("remat_policy", "qkv_proj_offloaded",
             "custom query_proj/key_proj/value_proj=offload, the rest recomputed (MaxText: "
             "save_and_offload_only_these_names, nothing saved, q/k/v offloaded)"),
            ("max_target_length", "4096", "model.seq_len=4096 (the preset)"),
            ("sa_block_q, sa_block_q_dkv, sa_block_q_dq", "1024, 2048, 2048", _SPLASH_GAP),
            *_COMMON_KNOBS,
            ("xla_flags", "DENSE_VMEM_LIMIT_FLAG + CF_FOR_ALL_GATHER + ENABLE_SPARSECORE_OFFLOADING_FOR_ALL_REDUCE",
             f"flags=v6e_sparsecore (those groups; {_V6E_REFUSED})"),
        ),
        ici=(1, 256, 1), remat=_offload_custom("query_proj", "key_proj", "value_proj"), flags="v6e_sparsecore"),
    Recipe(
        name="v5p-1024 Llama2-70B", preset="llama2-70b", target="tpu:v5p-1024", chips=512,
        maxtext_per_device_batch=4, mfu=0.654, tokens_per_s=692, formula="matmul+causal",
        published_in=f"{TIERING} (v5p Gold: '512 Chips, BF16, SL=4096', 65.4%, ~692 tokens/s/device; its link "
                     f"benchmarks/maxtext_v5p_model_configs.py@{C_RECIPES}#L156)",
        config=f"{MX} benchmarks/maxtext_v5p_model_configs.py@{C_RECIPES} llama2_70b_v5p_128 (model llama2-70b)",
        knobs=(
            ("per_device_batch_size", "4", "global_batch=2048 (4 x 512 chips)"),
            ("ici_fsdp_parallelism", "-1", "mesh.ici=(1, 512, 1): fsdp over the slice"),
            ("remat_policy", "save_dot_except_mlpwi",
             "custom query_proj/key_proj/value_proj/out_proj/mlp2=device, the rest recomputed (MaxText: "
             "save_only_these_names q/k/v, qkv_proj, out_proj, mlpwo; qkv_proj is a fused name Llama does not use)"),
            ("max_target_length", "4096", "model.seq_len=4096 (the preset)"),
            ("attention (base.yml)", "autoselected", "model.attention=flash: MaxText autoselects flash on TPU at "
                                                     "this length"),
            ("use_iota_embed", "True", _COMMON_KNOBS[1][2]),
            *_COMMON_KNOBS[2:],
            ("xla_flags", "CF_FOR_ALL_GATHER + DATA_PARALLEL_OVERLAP",
             "gap: the v5p compiler of our libtpu refused collective_fusion's fuse_all_gather flag (module "
             "docstring); nearest: flags=v5p_collectives, which drops it and adds "
             "megacore_fusion_allow_ags=false, async collective-permute and all-gather backward pipelining"),
        ),
        ici=(1, 512, 1), remat="custom:query_proj=device,key_proj=device,value_proj=device,out_proj=device,mlp2=device",
        flags="v5p_collectives",
        note="The chip count is tiering.md's '512 Chips': a v5p-1024 in Google Cloud's naming (v5p-N counts "
             "TensorCores, N/2 chips); the entry's own name says v5p_128 (ici_fsdp_parallelism=-1 fits any size), "
             "and issue 19 calls it v5p-512 (256 chips). The formula is uncertain: the approximate 692 tokens/s "
             "gives 64.6% with the causal halving and 67.0% without; 65.4% is nearer the first."),
)

RECIPES_BY_NAME = {r.name: r for r in RECIPES}


def recipe_model(r: Recipe):
    from paxsearch.trainer import presets
    return presets.get(r.preset)


def recipe_our_flops_per_token(r: Recipe) -> float:
    """Training FLOPs per token in paxsearch's convention (trainer/flops.py)."""
    from paxsearch.trainer import flops
    m = recipe_model(r)
    return float(flops.model_flops_per_step(m, 1)) / m.seq_len


def recipe_maxtext_flops_per_token(r: Recipe) -> float:
    """Training FLOPs per token as MaxText's formula for the figure counts them (RECIPE_FORMULAS)."""
    m = recipe_model(r)
    kv = m.n_kv_heads or m.n_heads
    matmul = m.n_layers * (m.d_model * (m.n_heads + 2 * kv) * m.head_dim + m.d_model * m.n_heads * m.head_dim
                           + 3 * m.d_model * m.d_ff) + m.d_model * m.vocab_size
    attention_full = 12 * m.n_heads * m.head_dim * m.n_layers * m.seq_len
    return 6 * matmul + {"matmul+attn": attention_full, "matmul+causal": attention_full / 2}[r.formula]


def recipe_implied_flops_per_token(r: Recipe) -> float:
    """FLOPs per token the published MFU and tokens/s imply together: MFU x peak / tokens/s."""
    return r.mfu * PEAK_TFLOPS[r.chip] * 1e12 / r.tokens_per_s


def recipe_conversion(r: Recipe) -> float:
    """ours / MaxText's FLOPs for the same step: multiply a published figure by it."""
    return recipe_our_flops_per_token(r) / recipe_maxtext_flops_per_token(r)


def recipe_converted_mfu(r: Recipe) -> float:
    return r.mfu * recipe_conversion(r)


def recipe_step_time(r: Recipe) -> float:
    """Seconds per step implied by the published tokens/s per chip."""
    return r.maxtext_per_device_batch * recipe_model(r).seq_len / r.tokens_per_s


def recipe_config(r: Recipe):
    """The nearest TrainConfig paxsearch expresses for the recipe (plan it with target r.target)."""
    import dataclasses

    from paxsearch.trainer.config import EvalConfig, MeshConfig, TrainConfig

    model = dataclasses.replace(recipe_model(r), attention=r.attention)
    return TrainConfig(model=model, mesh=MeshConfig(ici=r.ici, rules="default"), per_device_batch=None,
                       global_batch=r.global_batch, remat=r.remat, flags=r.flags, steps=1000,
                       eval=EvalConfig(enabled=False))


def recipes_table() -> str:
    """The recipes, their published and converted MFU, our nearest config and the gaps, as Markdown."""
    lines = ["| recipe | preset | mesh (d,f,t) | global batch | remat (ours) | flags (ours) | published MFU, "
             "tokens/s/chip | formula | ours / MaxText FLOPs | MFU, our convention | step s (implied) | gaps |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in RECIPES:
        lines.append(
            f"| {r.name} | {r.preset} | {'x'.join(map(str, r.ici))} | {r.global_batch} | {r.remat} | {r.flags} "
            f"| {r.mfu:.2%}, {r.tokens_per_s:g} | {r.formula} | {recipe_conversion(r):.4f} "
            f"| {recipe_converted_mfu(r):.2%} | {recipe_step_time(r):.2f} | {len(r.gaps)}: "
            f"{'; '.join(g.split(':')[0] for g in r.gaps)} |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------
# MaxText on NVIDIA GPUs (A3: 8 x H100 80GB per node), planned as gpu:h100x8 (search/planning/gpu_topology.py)

C_A3_CONFIGS = "1200dd7e023b8f09af97f4695cc91848d03ad4c1"  # 2024-04-05 "Add llama2 configs for GPU A3"
C_A3_README = "efb6d9e4a2856198f8272dcbfb7d9c91eda0728e"  # 2024-04-09 "Add README for llama2-7B"
# H100 SXM bf16 dense, as trainer/hardware.py (https://www.nvidia.com/en-us/data-center/h100/)
GPU_PEAK_TFLOPS = {"h100": 989.0, "h200": 989.0}
# the config's remat_policy=minimal_flash at C_A3_README (MaxText/layers/models.py): save_from_both_policies(
# checkpoint_dots_with_no_batch_dims, save_only_these_names('context')): every projection's output and the
# attention context kept (later renamed minimal_with_context)
MINIMAL_FLASH = ("custom:query_proj=device,key_proj=device,value_proj=device,context=device,out_proj=device,"
                 "mlp1=device,mlp2=device")


@dataclass(frozen=True)
class GpuPublished:
    """One published MaxText GPU throughput figure (TFLOP/s per GPU) and the config it ran."""

    name: str
    preset: str
    target: str  # paxsearch target: one node, e.g. gpu:h100x8
    gpus: int
    ici: tuple[int, int, int]  # (data, fsdp, tensor)
    maxtext_per_device_batch: int
    remat: str  # ours (trainer/remat.py)
    tflops: float  # published TFLOP/s per GPU, MaxText's formula
    formula: str  # key of FORMULAS
    published_in: str
    config: str
    attention: str = "flash"  # ours: cuDNN flash attention on GPU (trainer/attention.py)
    gaps: tuple[str, ...] = ()

    @property
    def chip(self) -> str:
        return self.target.split(":")[1].split("x")[0]

    @property
    def global_batch(self) -> int:
        return self.maxtext_per_device_batch * self.gpus


GPU_ROWS = (
    GpuPublished(
        name="A3 1x H100x8 Llama2-7B", preset="llama2-7b", target="gpu:h100x8", gpus=8, ici=(1, 8, 1),
        maxtext_per_device_batch=4, remat=MINIMAL_FLASH, tflops=492, formula="6N+causal",
        published_in=f"{MX} MaxText/configs/a3/llama_2_7b/README.md@{C_A3_README} ('1x A3 (h100-80gb-8) | 492' "
                     "TFLOP/sec/chip); the formula: MaxText/maxtext_utils.py calculate_tflops_training_per_device at "
                     "the same commit, 6 x params x S + causal-halved attention, params = every parameter "
                     "(both embedding tables)",
        config=f"{MX} MaxText/configs/a3/llama_2_7b/1vm.sh@{C_A3_README} (= @{C_A3_CONFIGS}: ici_fsdp_parallelism=8, "
               "per_device_batch_size=4, max_target_length=4096, model_name=llama2-7b, attention=cudnn_flash_te, "
               "remat_policy=minimal_flash, scan_layers=false, XLA_PYTHON_CLIENT_MEM_FRACTION=0.85)",
        gaps=("scan_layers=false: ours scans the layers", "XLA_FLAGS (latency-hiding scheduler, pipelined "
              "collectives, combine thresholds, rematerialization pass off): ours compile with XLA's defaults",
              "attention=cudnn_flash_te (Transformer Engine): ours is jax.nn.dot_product_attention(cudnn)")),
)
GPU_BY_NAME = {r.name: r for r in GPU_ROWS}


def gpu_maxtext_flops_per_row(r: GpuPublished) -> float:
    """MaxText's training FLOPs of one sequence for the figure: 6 N S + 12 H L Dh S^2 / 2, N every parameter."""
    from paxsearch.trainer import flops
    m = _preset(r.preset)
    s = m.seq_len
    return 6 * flops.param_count(m) * s + 12 * m.n_heads * m.n_layers * m.head_dim * s * s / 2


def _preset(name: str):
    from paxsearch.trainer import presets
    return presets.get(name)


def gpu_conversion(r: GpuPublished) -> float:
    """ours / MaxText's FLOPs for the same step."""
    from paxsearch.trainer import flops
    return float(flops.model_flops_per_step(_preset(r.preset), 1)) / gpu_maxtext_flops_per_row(r)


def gpu_converted_mfu(r: GpuPublished) -> float:
    """The published TFLOP/s over the GPU's peak, converted to our MFU convention."""
    return r.tflops / GPU_PEAK_TFLOPS[r.chip] * gpu_conversion(r)


def gpu_step_time(r: GpuPublished) -> float:
    """Seconds per step the published figure implies: MaxText's FLOPs per GPU / its TFLOP/s."""
    return gpu_maxtext_flops_per_row(r) * r.maxtext_per_device_batch / (r.tflops * 1e12)


def gpu_config(r: GpuPublished):
    """The nearest TrainConfig paxsearch expresses for the row (plan it with target r.target)."""
    import dataclasses

    from paxsearch.trainer.config import EvalConfig, MeshConfig, TrainConfig

    model = dataclasses.replace(_preset(r.preset), attention=r.attention)
    return TrainConfig(model=model, mesh=MeshConfig(ici=r.ici, rules="default"), per_device_batch=None,
                       global_batch=r.global_batch, remat=r.remat, steps=1000, eval=EvalConfig(enabled=False))


# ----------------------------------------------------------------------------------------------------
# MaxText's published mixture-of-experts runs (issue 43): Mixtral 8x7B / 8x22B on v5p and v6e, DeepSeek V3 on
# v5p. Each figure is a TFLOP/s per chip from a README (a table entry or a quoted log line); each config is traced
# knob by knob, as the recipes above. MaxText counted them with calculate_tflops_training_per_device (read at
# each row's commit; MOE_FORMULA). The published MFU is TFLOP/s over the chip's bf16 peak (PEAK_TFLOPS), and the
# conversion keeps MaxText's step time and changes only the FLOPs, as for the dense rows.

C_MOE_V5P = "7534e5e21351665bd33d85eb6301e5d9c8f0972e"  # 2024-07-08 (authored 07-04) "Add moe perf number"
C_MOE_TP = "d37288ab4"  # 2024-07-17 "Add tp support for MoE": tensor parallelism of the MoE block came after
C_RECIPES_8X7B = "45418113bbe62f2a41191dfe91b2ee7bb0a214cc"  # tpu-recipes, 2025-04-16 (MaxText tag v0.1.2)
C_RECIPES_8X22B = "c78c38e16b0e1eae214a873a3b5fba953ad80a7a"  # tpu-recipes, 2025-02-12
C_MX_8X22B = "449b4fe52a781e8f9adfa43550bed36d2e9dbd99"  # MaxText 2025-02-11 "Add 8x22b config to benchmark"
C_RECIPES_V5P_MIXTRAL = "0dfb6a6e8467315d306babaac4cf6aef52d448a1"  # tpu-recipes 2024-10-28 "first commit"
C_RECIPES_DSV3 = "7e88b6d146a00901446f8a11244d49a471d8242b"  # tpu-recipes 2025-10-08
C_MX_DSV3 = "3eb77db3c94580f56f1b738f8d254b03bd205e35"  # MaxText 2025-10-07 "benchmarks: v5p-1024 model configurations"

MOE_FORMULA = (f"{MX} MaxText/maxtext_utils.py calculate_tflops_training_per_device (read @{C_MOE_V5P}, "
               f"@{C_MX_8X22B} and @{C_TAG_V012}): per token 3 x 2 x (q/k/v and out projections + the router "
               "d x n_experts + experts_per_token x the expert MLP's 3 matrices, per layer; the unembedding) + "
               "12 H L Dh S (attention in full: 'megatron tflops calculation does not account for causality'); "
               "only the activated experts, as ours, which halves the attention")
MOE_FORMULA_MLA = (f"{MX} src/MaxText/maxtext_utils.py calculate_tflops_training_per_device (read @{C_MX_DSV3}), "
                   "decoder_block deepseek, attention_type mla: per token 3 x (dense layers' 3-matrix MLP + "
                   "MoE layers' router d x n_experts and (shared + experts_per_token) experts + per layer "
                   "calculate_mla_tflops_per_device's q (down and up, or one projection), kv (down to kv_lora_rank + "
                   "qk_rope_head_dim, up to heads x (qk_nope + v)) and output projections + the unembedding) + "
                   "3 x layers x 2 S H (qk_nope + qk_rope + v) / 2 (attention halved for causality at that commit)")
_MOE_XLA = "MOE_VMEM_LIMIT_FLAG (scoped VMEM 81920 KiB) + CF_FOR_ALL_GATHER + DATA_PARALLEL_OVERLAP"
_MOE_FLAGS_GAP = ("gap: no flag set of ours is these groups; planned with flags=default (the compiler's own "
                  "collective scheduling, the default scoped VMEM); collective_fusion holds CF_FOR_ALL_GATHER + "
                  "DATA_PARALLEL_OVERLAP but its all-gather continuation fusion is refused on v5p and v6e")
_MOE_OFFLOAD = ("decoder_layer_input, out_proj, query_proj, key_proj, value_proj", "offload",
                "custom decoder_input/out_proj/query_proj/key_proj/value_proj=offload, the rest recomputed "
                "(MaxText's remat_policy custom: the named tensors offloaded, the rest recomputed)")
_MOE_COMMON = (
    ("attention, sa_block_q / _dkv / _dq", "flash, 2048",
     "gap: model.attention=flash (the Pallas splash kernel); its blocks are fixed (trainer/attention.py SPLASH_BLOCK "
     "512, the largest of 512/256/128 dividing seq_len), not 2048"),
    ("max_target_length", "4096", "model.seq_len=4096 (the preset)"),
    ("dataset_type / reuse_example_batch / enable_checkpointing / profiler", "synthetic / 1 / False / xplane",
     "no effect on the compiled step"),
)


@dataclass(frozen=True)
class MoePublished(_OnASlice):
    """One published MaxText mixture-of-experts run and the nearest config paxsearch expresses."""

    name: str
    preset: str | None  # trainer/presets.py name; None: the model is not expressible (DeepSeek V3's MLA)
    target: str  # paxsearch target: one slice, named as Google Cloud names it
    chips: int
    maxtext_per_device_batch: int  # rows per chip over all chips (global = this x chips)
    tflops: float  # published TFLOP/s per chip (MaxText's formula)
    published_in: str  # repository, file and commit of the figure
    config: str  # repository, file, commit and entry of the config
    knobs: tuple[tuple[str, str, str], ...]  # (MaxText knob, its value, our field = value, or "gap: ...")
    mesh: tuple[tuple[str, int], ...] = ()  # ours: axis sizes by name (trainer/config.py mesh_shape)
    remat: str = "full"  # ours: a trainer/remat.py policy
    expert_compute: str = "dropless"  # ours: "dropless" | "capacity"
    capacity_factor: float = 1.25
    model_fields: tuple[tuple[str, object], ...] = ()  # preset fields set to the run's (vocab, weight dtype)
    flags: str = "default"
    step_s: float | None = None  # published seconds per step, where a log line gives them
    mfu: float | None = None  # published MFU, where the figure states one
    seq_len: int = 4096
    planned: bool = True
    note: str = ""

    @property
    def gaps(self) -> list[str]:
        return [f"{k}={v}: {ours[len('gap: '):]}" for k, v, ours in self.knobs if ours.startswith("gap: ")]


MOE_ROWS = (
    MoePublished(
        name="v5p-128 Mixtral-8x7B", preset="mixtral-8x7b", target="tpu:v5p-128", chips=64,
        maxtext_per_device_batch=36, tflops=251.94, mfu=0.5489,
        published_in=f"{MX} end_to_end/tpu/mixtral/Run_Mixtral.md@{C_MOE_V5P} ('Mixtral 8X7B | v5p-128 | 251.94 | "
                     "54.89%'; now tests/end_to_end/tpu/mixtral/Run_Mixtral.md)",
        config=f"not published with the figure: Run_Mixtral.md@{C_MOE_V5P} names no config. Nearest: "
               f"{TPU_RECIPES} training/v5p/Mixtral-8X7B-Maxtext/scripts/run_mixtral-8x7b.sh@{C_RECIPES_V5P_MIXTRAL} "
               "(v5p-128, per_device_batch_size=36, max_target_length=4096, dtype/weight_dtype bfloat16, "
               "attention=flash; base.yml: megablox True, remat_policy full, ici_fsdp_parallelism -1), "
               "4 months later and without a figure",
        knobs=(
            ("per_device_batch_size", "36 (the later script's)",
             "gap: the figure's batch is not recorded; global_batch=2304 (36 x 64 chips) from the v5p recipe script"),
            ("ici_fsdp_parallelism (base.yml)", "-1", "mesh fsdp=64 (MoE tensor parallelism came after the figure: "
                                                      f"{C_MOE_TP}; no expert axis in base.yml@{C_MOE_V5P})"),
            ("megablox (base.yml)", "True", "expert_compute=dropless, model.grouped_matmul=megablox (the Pallas "
                                            "megablox kernel; no capacity_factor existed in base.yml then)"),
            ("remat_policy (base.yml)", "full", "remat=full"),
            ("dtype / weight_dtype", "bfloat16 / bfloat16", "model.param_dtype=bfloat16"),
            *_MOE_COMMON[:2],
            ("LIBTPU_INIT_ARGS", "v5p_collectives' 9 flags + ..._fuse_all_gather + scoped VMEM 81920 KiB",
             "gap: flags=v5p_collectives (the v5p compiler refuses the all-gather continuation fusion; default "
             "scoped VMEM)"),
        ),
        mesh=(("fsdp", 64),), remat="full", expert_compute="dropless",
        model_fields=(("param_dtype", "bfloat16"), ("grouped_matmul", "megablox")),
        flags="v5p_collectives",
        note="The figure's config is not published; planned with the one v5p Mixtral recipe of MaxText's team "
             "(its batch, weights and flags). The figure's formula is MaxText's at the commit that published it."),
    MoePublished(
        name="v6e-256 Mixtral-8x7B dropped", preset="mixtral-8x7b", target="tpu:v6e-256", chips=256,
        maxtext_per_device_batch=12, tflops=302.311, step_s=13.484,
        published_in=f"{TPU_RECIPES} training/trillium/Mixtral-8x7B-MaxText/README.md@{C_RECIPES_8X7B} (log line "
                     "'completed step: 11, seconds: 13.484, TFLOP/s/device: 302.311, Tokens/s/device: 3645.203, "
                     "total_weights: 12582912'; MaxText tag tpu-recipes-v0.1.2, JAX 0.5.2)",
        config=f"{MX} {TRILLIUM}@{C_TAG_V012} mixtral_8x7b_dropped (model mixtral-8x7b), quoted in the README",
        knobs=(
            ("per_device_batch_size", "12", "global_batch=3072 (12 x 256 chips)"),
            ("ici_fsdp_parallelism", "-1", "mesh fsdp=256"),
            ("megablox / sparse_matmul / capacity_factor", "False / False / 1.25",
             "expert_compute=capacity, capacity_factor=1.25 (tokens over capacity dropped)"),
            ("remat_policy", "custom", "remat='custom:...' (trainer/remat.py)"), _MOE_OFFLOAD,
            ("dtype / weight_dtype (base.yml)", "bfloat16 / float32",
             "the preset's dtype=bfloat16, param_dtype=float32"),
            *_MOE_COMMON,
            ("xla_flags", _MOE_XLA, _MOE_FLAGS_GAP),
        ),
        mesh=(("fsdp", 256),), remat=_offload_custom(*_LLAMA31_8B_OFFLOADED), expert_compute="capacity"),
    MoePublished(
        name="v6e-256 Mixtral-8x22B dropped", preset="mixtral-8x22b", target="tpu:v6e-256", chips=256,
        maxtext_per_device_batch=8, tflops=332.463, step_s=24.706,
        published_in=f"{TPU_RECIPES} training/trillium/Mixtral-8x22B-MaxText/README.md@{C_RECIPES_8X22B} (log line "
                     "'completed step: 9, seconds: 24.706, TFLOP/s/device: 332.463, Tokens/s/device: 1326.307, "
                     "total_weights: 8388608'; jaxlib 0.4.35, libtpu-nightly 20241119)",
        config=f"{MX} {TRILLIUM}@{C_MX_8X22B} mixtral_8x22b_dropped (model mixtral-8x22b). The README names "
               "maxtext@261a8be0fc5e909ef9da0521df62549e650ebb79 (2024-11-21), which has no 8x22b entry; the entry "
               "was added by this commit the day before the README and is unchanged at tag tpu-recipes-v0.1.2",
        knobs=(
            ("per_device_batch_size", "8", "global_batch=2048 (8 x 256 chips)"),
            ("ici_fsdp_parallelism, ici_expert_parallelism", "64, 4", "mesh fsdp=64, expert=4 (expert innermost)"),
            ("custom_mesh, allow_split_physical_axes", "hybrid_ring_64x4, True",
             "gap: our mesh is jax's create_device_mesh over the 16x16 torus (split axes allowed), not MaxText's "
             "hand-made ring of 4 along one dimension"),
            ("megablox / sparse_matmul / capacity_factor", "False / False / 1.25",
             "expert_compute=capacity, capacity_factor=1.25 (all-to-all over the expert axis)"),
            ("remat_policy", "custom", "remat='custom:...' (trainer/remat.py)"), _MOE_OFFLOAD,
            ("dtype / weight_dtype", "bfloat16 / bfloat16", "model.param_dtype=bfloat16"),
            ("tokenizer_path / model vocab_size", "tokenizer.mistral-v3 / 32768",
             "model.vocab_size=32768 (MaxText's configs/models/mixtral-8x22b.yml; the preset has the base "
             "checkpoint's 32000)"),
            *_MOE_COMMON,
            ("xla_flags", _MOE_XLA, _MOE_FLAGS_GAP),
        ),
        mesh=(("fsdp", 64), ("expert", 4)), remat=_offload_custom(*_LLAMA31_8B_OFFLOADED), expert_compute="capacity",
        model_fields=(("vocab_size", 32768), ("param_dtype", "bfloat16"))),
    MoePublished(
        name="v5p-1024 DeepSeek-V3-671B", preset="deepseek-v3", target="tpu:v5p-1024", chips=512,
        maxtext_per_device_batch=6, tflops=152.415, step_s=90.668, seq_len=8192,
        published_in=f"{TPU_RECIPES} training/v5p/DeepSeek3-671B-MaxText/README.md@{C_RECIPES_DSV3} (log line "
                     "'completed step: 11, seconds: 90.668, TFLOP/s/device: 152.415, Tokens/s/device: 542.108, "
                     "total_weights: 25165824'; JAX 0.7.0)",
        config=f"{MX} benchmarks/maxtext_v5p_model_configs.py@{C_MX_DSV3} deepseek3_671b_v5p_1024 (model "
               "deepseek3-671b: src/MaxText/configs/models/deepseek3-671b.yml there)",
        knobs=(
            ("model", "deepseek3-671b: attention_type mla (q_lora_rank 1536, kv_lora_rank 512, qk_nope_head_dim 128, "
                      "qk_rope_head_dim 64, v_head_dim 128), 256 experts top-8 + 1 shared, sigmoid router with "
                      "routed_bias, first_num_dense_layers 3",
             "the deepseek-v3 preset (trainer/mla.py; the dims of the yml, read at the commit)"),
            ("rope_type yarn (rope_factor 40, mscale 1.0, original_max_position_embeddings 4096), rope_interleave",
             "True",
             "gap: plain RoPE (no YaRN frequencies nor its softmax mscale^2 factor; rotate-half pairs): no parameter, "
             "no matmul, the same FLOPs and shapes"),
            ("routed_scaling_factor", "2.5", "gap: not modeled (a constant factor on the routed experts' output; no "
                                             "FLOPs)"),
            ("n_routing_groups / topk_routing_group", "not set (the yml's comment: set 8 / 4 for DeepSeek's "
                                                      "group-limited routing)",
             "top-8 over all 256 experts, as the run (no group-limited routing)"),
            ("per_device_batch_size, max_target_length", "6, 8192", "global_batch=3072 (6 x 512), model.seq_len=8192"),
            ("ici_fsdp_parallelism, ici_tensor_parallelism", "-1, 1", "mesh fsdp=512"),
            ("megablox / sparse_matmul / use_custom_sort_vjp", "True / True / True",
             "expert_compute=dropless, model.grouped_matmul=megablox (the Pallas megablox kernel; one sort of the "
             "routes, gathers both ways: no custom sort VJP)"),
            ("remat_policy: decoder_layer_input, out_proj", "custom: offload (the rest 'remat', base.yml)",
             "remat='custom:decoder_input=offload,out_proj=offload' (the rest recomputed)"),
            ("dtype / weight_dtype", "bfloat16 / float32", "the preset's dtype=bfloat16, param_dtype=float32"),
            ("attention, sa_block_* / sa_use_fused_bwd_kernel", "flash (autoselected), 2048 / False",
             "gap: model.attention=flash (splash, v at its own head dim 128); its blocks are fixed "
             "(trainer/attention.py SPLASH_BLOCK 512), not 2048"),
            ("tile_batch_seq / tile_embed_dim / tile_mlp_dim", "512 / 1024 / 1024",
             "megablox tiling 512 x 1024 x 1024 (trainer/moe.py MEGABLOX_TILING, not a knob)"),
            ("xla_flags", "ENABLE_SPARSECORE_OFFLOADING_FOR_RS_AG_AR + HOST_OFFLOAD_FLAGS + "
                          "LAYOUT_FOR_ALL_REDUCE_SCATTER + DATA_PARALLEL_OVERLAP + MOE_VMEM_LIMIT_FLAG + "
                          "DISABLE_MEGACORE_FUSION_ALLOW_AGS + ENABLE_ASYNC_COLLECTIVE_PERMUTE",
             "gap: no flag set of ours is these groups; planned with flags=default"),
            ("load_balance_loss_weight (base.yml) / routed_bias", "0.01 / True",
             "gap: load_balance_weight=0 (the preset: DeepSeek's aux-loss-free balancing); the loss is a few "
             "reductions, not a matmul"),
            *_MOE_COMMON[2:],
        ),
        mesh=(("fsdp", 512),), remat="custom:decoder_input=offload,out_proj=offload", expert_compute="dropless",
        model_fields=(("seq_len", 8192), ("grouped_matmul", "megablox")),
        note="Planned with the deepseek-v3 preset (multi-head latent attention, trainer/mla.py). MaxText's formula "
             f"at {C_MX_DSV3} counts MLA's projections and halves the attention for causality "
             "(calculate_mla_tflops_per_device), as ours: the conversion is 1.0 up to the routing bias."),
)
MOE_BY_NAME = {r.name: r for r in MOE_ROWS}


def moe_model(r: MoePublished):
    """The row's model: its preset with the run's fields (vocabulary, weight dtype) and expert compute."""
    if r.preset is None:
        raise ValueError(f"{r.name}: no preset ({r.note.split(':')[0]})")
    from paxsearch.trainer import presets
    return dataclasses.replace(presets.get(r.preset), expert_compute=r.expert_compute,
                               capacity_factor=r.capacity_factor, **dict(r.model_fields))


def moe_maxtext_flops_per_token(r: MoePublished) -> float:
    """Training FLOPs per token as MaxText counted the row's figure (MOE_FORMULA; MOE_FORMULA_MLA for
    multi-head latent attention, DeepSeek's row), on the run's dims."""
    m = moe_model(r)
    width = m.expert_d_ff or m.d_ff
    if m.attention_type == "mla":  # MaxText @C_MX_DSV3, decoder_block deepseek
        h, qk, dv, s = m.n_heads, m.qk_nope_head_dim + m.qk_rope_head_dim, m.v_head_dim, m.seq_len
        q = 2 * (m.d_model * m.q_lora_rank + m.q_lora_rank * h * qk) if m.q_lora_rank else 2 * m.d_model * h * qk
        kv = 2 * (m.d_model * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank * h * (m.qk_nope_head_dim + dv))
        projection = 2 * m.d_model * h * dv
        n_moe = m.n_layers - m.first_dense_layers
        ffn = (m.first_dense_layers * 3 * 2 * m.d_model * m.d_ff
               + n_moe * (2 * m.d_model * m.n_experts + (m.n_shared_experts + m.experts_per_token) * 3 * 2 * m.d_model
                          * width))
        weights = 3 * (ffn + (q + kv + projection) * m.n_layers + 2 * m.d_model * m.vocab_size)
        return weights + 3 * m.n_layers * (2 * s * h * (qk + dv)) / 2
    per_layer = (2 * m.d_model * (m.n_heads + 2 * m.kv_heads) * m.head_dim + 2 * m.d_model * m.n_heads * m.head_dim
                 + 2 * m.d_model * m.n_experts + m.experts_per_token * 3 * 2 * m.d_model * width)
    weights = 3 * (m.n_layers * per_layer + 2 * m.d_model * m.vocab_size)
    return weights + 12 * m.n_heads * m.head_dim * m.n_layers * m.seq_len


def moe_our_flops_per_token(r: MoePublished) -> float:
    """Training FLOPs per token in paxsearch's convention (trainer/flops.py: activated experts, causal half)."""
    from paxsearch.trainer import flops
    m = moe_model(r)
    return float(flops.model_flops_per_step(m, 1)) / m.seq_len


def moe_conversion(r: MoePublished) -> float:
    """ours / MaxText's FLOPs for the same step: multiply a published figure by it."""
    return moe_our_flops_per_token(r) / moe_maxtext_flops_per_token(r)


def moe_published_mfu(r: MoePublished) -> float:
    """The published MFU in MaxText's convention: the stated one, else TFLOP/s over the chip's bf16 peak."""
    return r.mfu if r.mfu is not None else r.tflops / PEAK_TFLOPS[r.chip]


def moe_converted_mfu(r: MoePublished) -> float:
    return moe_published_mfu(r) * moe_conversion(r)


def moe_step_time(r: MoePublished) -> float:
    """Seconds per step: the log line's, else MaxText's FLOPs per chip over the published TFLOP/s."""
    if r.step_s is not None:
        return r.step_s
    return moe_maxtext_flops_per_token(r) * r.maxtext_per_device_batch * r.seq_len / (r.tflops * 1e12)


def moe_config(r: MoePublished):
    """The nearest TrainConfig paxsearch expresses for the row (plan it with target r.target)."""
    from paxsearch.trainer.config import EvalConfig, MeshConfig, TrainConfig, mesh_shape

    return TrainConfig(model=dataclasses.replace(moe_model(r), attention="flash"),
                       mesh=MeshConfig(ici=mesh_shape(**dict(r.mesh))), per_device_batch=None,
                       global_batch=r.global_batch, remat=r.remat, flags=r.flags, steps=1000,
                       eval=EvalConfig(enabled=False))


def moe_table() -> str:
    """The MoE rows, their published and converted MFU, as Markdown."""
    lines = ["| run | preset | mesh | global batch | experts | published TFLOP/s/chip, MFU | ours / MaxText FLOPs "
             "| MFU, our convention | step s | planned |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in MOE_ROWS:
        mesh = " x ".join(f"{k} {v}" for k, v in r.mesh) or "-"
        experts = r.expert_compute + (f" {r.capacity_factor:g}" if r.expert_compute == "capacity" else "")
        if r.preset is None:
            lines.append(f"| {r.name} | - | - | {r.global_batch} | - | {r.tflops:g}, {moe_published_mfu(r):.2%} "
                         f"| - | - | {moe_step_time(r):.2f} | no: {r.note.split(':')[1].split('(')[0].strip()} |")
            continue
        lines.append(f"| {r.name} | {r.preset} | {mesh} | {r.global_batch} | {experts} | {r.tflops:g}, "
                     f"{moe_published_mfu(r):.2%} | {moe_conversion(r):.4f} | {moe_converted_mfu(r):.2%} "
                     f"| {moe_step_time(r):.2f} | yes |")
    return "\n".join(lines)

"""onchip_v5e: 113 fixed points on one TPU v5e chip, planned here and trained there (issue 41).

The same space file gives the planner's side and the chip's side of benchmarks/bench_onchip.py:

    # here (CPU, libtpu from the `tpu` extra): every point planned for the chip, nothing run
    paxsearch run spaces/onchip_v5e.py --tuner grid --run-dir runs/onchip-plan
    # on a machine with one v5e chip: the same points compiled there and trained for 10 steps,
    # in halves that each fit one 10-minute command
    paxsearch run spaces/onchip_v5e.py --tuner grid --set half=a --run-dir runs/onchip-a
    paxsearch run spaces/onchip_v5e.py --tuner grid --set half=b --run-dir runs/onchip-b
    paxsearch run spaces/onchip_v5e.py --tuner grid --set half=c --run-dir runs/onchip-c
    paxsearch run spaces/onchip_v5e.py --tuner grid --set half=d --run-dir runs/onchip-d
    paxsearch run spaces/onchip_v5e.py --tuner grid --set half=e --run-dir runs/onchip-e
    paxsearch run spaces/onchip_v5e.py --tuner grid --set half=f --run-dir runs/onchip-f
    paxsearch run spaces/onchip_v5e.py --tuner grid --set half=g --run-dir runs/onchip-g
    paxsearch run spaces/onchip_v5e.py --tuner grid --set half=h --run-dir runs/onchip-h
    paxsearch run spaces/onchip_v5e.py --tuner grid --set half=i --run-dir runs/onchip-i
    paxsearch run spaces/onchip_v5e.py --tuner grid --set half=j --run-dir runs/onchip-j
    paxsearch run spaces/onchip_v5e.py --tuner grid --set half=k --run-dir runs/onchip-k
    paxsearch run spaces/onchip_v5e.py --tuner grid --set half=d --set kind=moe --run-dir runs/onchip-d-moe
    python benchmarks/bench_onchip.py --plan runs/onchip-plan --chip runs/onchip-a --chip runs/onchip-b

Decisions: `point`, a name from POINTS (each a whole trainer config: the model, sequence length,
attention, remat, batch, accumulation, vocab tiling, offload and flag set), `half` ("a" to "k") and `kind`
("dense" or "moe"), which the constraint ties to each point. The first 44 points alternate between a and b
(so both hold every kind of point); "b" was the held-out half of run 1, when one splash figure was fit
to half a. Since then no hardware figure is set from any point: the v5e entry comes from the chip's
own kernel and matmul measurements (benchmarks/chip_figures.py, chip_profile.py). Half c, 21 points
added in the second session after that entry was set, were never seen by any figure: int8 beside its
bfloat16 twin at four sizes, 1B with bfloat16 parameters, plain attention at head dim 64, two MoE points.
Half d, 14 points added in the third session after the chip's row gathers, scatters and ragged dots were
measured and priced, and before any of them was trained: MoE at new shapes (16 experts, capacity and dropless,
batch, sequence, remat), head dims 64 and 128 at new batches and sequences, int8 at two new shapes.
Half e, 18 points added in the fifth session after the chip's run 4 (grouped matmuls, splash group 3 at head
dim 128 by batch, rows of 128-256 B) was priced in and planned before any of them was trained: dense at new
batch / sequence / remat combinations of every size, head dim 64 at new batches, int8 at three new shapes, MoE
at new batches, sequences and expert counts, and two with the Pallas megablox kernel as the grouped matmul.
Half f, 16 points added in the sixth session after the chip's profiles of four head-dim-64 steps priced the DMAs
between HBM and VMEM and the lanes a matmul leaves empty, planned before any was trained. Half g, 16 points added
in the seventh session after the VPU time of sine and cosine was priced, planned before any was trained. Half h,
16 points added in the eighth session, the first held out from the op-level pricing (VPU time of every kind, the
splash kernels in the step, the DMAs by the schedule) adopted after half g trained; planned before any was trained.
Half i, 16 points added in the eighth session after the splash kernels' rates in the steps and the transposes were
priced (from half h's profiles), planned before any was trained. Half j, 16 points added in the ninth session after
run 8's profiles put the splash kernels' in-step rates at seq 1k-8k for every head dim and group, planned before any
was trained.
Half k, 10 points added in the ninth session after run 8's MoE profiles priced small tiles, re-tiling reshapes and
the chip compiler's unnamed ragged-dot kernels, planned before any was trained.

Llama-style models (GQA, gated SiLU MLP, RoPE, vocabulary 32000, bfloat16 activations,
float32 parameters and AdamW moments), sizes 0.11B-1.45B; sequences 1k-8k; dot-product and
splash ("flash") attention; remat none / full / minimal / dots / custom with host offload;
gradient accumulation; vocab tiling; AdamW moments or parameters offloaded to host memory;
the flag sets that apply to v5e. Some points do not fit the chip's 15.75 GiB on purpose: the
fit verdicts are half of what is checked.
"""
import fiddle as fdl
import pyglove as pg

from paxsearch.trainer.config import EvalConfig, LogConfig, MeshConfig, ModelConfig, OptimizerConfig, TrainConfig
from paxsearch.trainer.remat import custom

# name -> (d_model, n_layers, n_heads, n_kv_heads, d_ff); head_dim 128 except m100 (64)
MODELS = {
    "m100": (768, 12, 12, 4, 2048),  # 0.11B
    "m350": (1024, 24, 8, 4, 2816),  # 0.35B
    "m500": (1536, 16, 12, 4, 4096),  # 0.50B
    "m900": (2048, 16, 16, 8, 5632),  # 0.89B
    "m1500": (2048, 28, 16, 8, 5632),  # 1.45B
    "moe8": (1024, 8, 8, 4, 2816),  # 8 experts of width 1408, top-2: 0.48B total, 0.18B active
    "moe16": (1024, 8, 8, 4, 2816),  # 16 experts of width 704, top-2: the same total, half the active MLP
}

OFFLOAD_ALL = custom(decoder_input="offload", query_proj="offload", key_proj="offload", value_proj="offload")
DEVICE_QKV = custom(query_proj="device", key_proj="device", value_proj="device", mlp1="device")
OFFLOAD_INPUT = custom(decoder_input="offload")

# name -> fields; defaults: seq 2048, flash, remat "none", batch 4, accum 1, tiles 1, no offload, flags default
_BASE = dict(seq=2048, attention="flash", remat="none", batch=4, accum=1, tiles=1, offload_state=False,
             offload_params=False, flags="default", param_dtype="float32", quantization="none", moe="",
             grouped_matmul="auto")
_POINTS = [
    # m100: small matmuls, the per-step overhead shows
    ("m100-s1k-dp-b8", dict(model="m100", seq=1024, attention="dot_product", batch=8)),
    ("m100-s2k-fl-b8", dict(model="m100", batch=8)),
    ("m100-s4k-fl-b4", dict(model="m100", seq=4096)),
    ("m100-s8k-fl-b2", dict(model="m100", seq=8192, batch=2)),
    ("m100-s2k-dp-b16-full", dict(model="m100", attention="dot_product", batch=16, remat="full")),
    ("m100-s2k-fl-b8-tiles4", dict(model="m100", batch=8, tiles=4)),
    ("m100-s2k-fl-b8-lhs", dict(model="m100", batch=8, flags="latency_hiding")),
    ("m100-s1k-fl-b16-acc2", dict(model="m100", seq=1024, batch=16, accum=2)),
    # m350
    ("m350-s2k-fl-b4", dict(model="m350")),
    ("m350-s2k-dp-b4", dict(model="m350", attention="dot_product")),
    ("m350-s2k-fl-b8-full", dict(model="m350", batch=8, remat="full")),
    ("m350-s4k-fl-b2", dict(model="m350", seq=4096, batch=2)),
    ("m350-s8k-fl-b1", dict(model="m350", seq=8192, batch=1)),
    ("m350-s2k-fl-b8-minimal", dict(model="m350", batch=8, remat="minimal")),
    ("m350-s2k-fl-b4-offstate", dict(model="m350", offload_state=True)),
    ("m350-s1k-dp-b8-dots", dict(model="m350", seq=1024, attention="dot_product", batch=8, remat="dots")),
    ("m350-s2k-fl-b8-cfusion", dict(model="m350", batch=8, remat="full", flags="collective_fusion")),
    ("m350-s2k-fl-b8-acc4", dict(model="m350", batch=8, accum=4)),
    # m500
    ("m500-s2k-fl-b4", dict(model="m500")),
    ("m500-s2k-dp-b4", dict(model="m500", attention="dot_product")),
    ("m500-s2k-fl-b8", dict(model="m500", batch=8)),
    ("m500-s2k-fl-b8-full", dict(model="m500", batch=8, remat="full")),
    ("m500-s2k-fl-b16-full", dict(model="m500", batch=16, remat="full")),
    ("m500-s4k-fl-b2-minimal", dict(model="m500", seq=4096, batch=2, remat="minimal")),
    ("m500-s2k-fl-b8-offqkv", dict(model="m500", batch=8, remat=OFFLOAD_ALL)),
    ("m500-s2k-fl-b8-devqkv", dict(model="m500", batch=8, remat=DEVICE_QKV)),
    ("m500-s2k-fl-b4-offstate", dict(model="m500", offload_state=True)),
    ("m500-s2k-fl-b4-tiles4", dict(model="m500", tiles=4)),
    ("m500-s2k-fl-b16-acc4", dict(model="m500", batch=16, accum=4, remat="full")),
    ("m500-s8k-fl-b1-full", dict(model="m500", seq=8192, batch=1, remat="full")),
    # m900
    ("m900-s2k-fl-b4", dict(model="m900")),
    ("m900-s2k-fl-b4-full", dict(model="m900", remat="full")),
    ("m900-s2k-fl-b8-full", dict(model="m900", batch=8, remat="full")),
    ("m900-s2k-dp-b4-full", dict(model="m900", attention="dot_product", remat="full")),
    ("m900-s2k-fl-b8", dict(model="m900", batch=8)),
    ("m900-s4k-fl-b2-full", dict(model="m900", seq=4096, batch=2, remat="full")),
    ("m900-s2k-fl-b8-offinput", dict(model="m900", batch=8, remat=OFFLOAD_INPUT)),
    ("m900-s2k-fl-b4-offstate", dict(model="m900", offload_state=True, remat="full")),
    ("m900-s2k-fl-b8-acc2-tiles4", dict(model="m900", batch=8, accum=2, tiles=4, remat="full")),
    # m1500: the state alone is near the chip's memory: offload decides
    ("m1500-s2k-fl-b4-full", dict(model="m1500", remat="full")),
    ("m1500-s2k-fl-b4-offstate", dict(model="m1500", offload_state=True, remat="full")),
    ("m1500-s2k-fl-b2-offboth", dict(model="m1500", batch=2, offload_state=True, offload_params=True,
                                     remat="full")),
    ("m1500-s1k-fl-b8-offstate-acc2", dict(model="m1500", seq=1024, batch=8, accum=2, offload_state=True,
                                           remat="full")),
    ("m1500-s2k-fl-b8-offstate", dict(model="m1500", batch=8, offload_state=True, remat="full")),
]
# Half c (second session): 21 new points, all held out, chosen to fit the chip so that each trains
# (plan <= ~13.5 GiB here): int8 beside its bfloat16 twin at four sizes (issue 44's threshold), 1B with
# bfloat16 parameters (issue 41's 60% MFU), plain attention at head dim 64, two MoE points (issue 43).
_POINTS_C = [
    ("m900-s2k-fl-b4-bf16p-full", dict(model="m900", remat="full", param_dtype="bfloat16")),
    ("m900-s2k-fl-b4-bf16p-full-int8", dict(model="m900", remat="full", param_dtype="bfloat16",
                                            quantization="int8")),
    ("m100-s2k-fl-b16-full", dict(model="m100", batch=16, remat="full")),
    ("m100-s2k-fl-b16-full-int8", dict(model="m100", batch=16, remat="full", quantization="int8")),
    ("m350-s2k-fl-b16-full", dict(model="m350", batch=16, remat="full")),
    ("m350-s2k-fl-b16-full-int8", dict(model="m350", batch=16, remat="full", quantization="int8")),
    ("m500-s2k-fl-b12-full", dict(model="m500", batch=12, remat="full")),
    ("m500-s2k-fl-b12-full-int8", dict(model="m500", batch=12, remat="full", quantization="int8")),
    ("moe8-s2k-b8-cap", dict(model="moe8", batch=8, remat="full", moe="capacity")),
    ("moe8-s2k-b8-dropless", dict(model="moe8", batch=8, remat="full", moe="dropless")),
    ("m100-s2k-dp-b8-full", dict(model="m100", attention="dot_product", batch=8, remat="full")),
    ("m900-s2k-fl-b8-bf16p-full", dict(model="m900", batch=8, remat="full", param_dtype="bfloat16")),
    ("m900-s2k-fl-b2-bf16p-minimal", dict(model="m900", batch=2, remat="minimal", param_dtype="bfloat16")),
    ("m350-s4k-fl-b4-full", dict(model="m350", seq=4096, remat="full")),
    ("m350-s1k-dp-b16-full", dict(model="m350", seq=1024, attention="dot_product", batch=16, remat="full")),
    ("m500-s2k-fl-b8-dots", dict(model="m500", batch=8, remat="dots")),
    ("m500-s4k-fl-b4-full", dict(model="m500", seq=4096, remat="full")),
    ("m500-s2k-fl-b8-full-int8fwd", dict(model="m500", batch=8, remat="full", quantization="int8_fwd")),
    ("m900-s8k-fl-b1-bf16p-full", dict(model="m900", seq=8192, batch=1, remat="full", param_dtype="bfloat16")),
    ("m100-s4k-fl-b8-full-tiles4", dict(model="m100", seq=4096, batch=8, remat="full", tiles=4)),
    ("m1500-s2k-fl-b4-bf16p-full", dict(model="m1500", remat="full", param_dtype="bfloat16")),
]
# Half d (third session): 14 new points, all held out, added after the chip's row gathers / scatters and ragged
# dots were measured and priced (roofline/indexed.py) and before any was trained: MoE at new batches, sequences,
# expert counts and remat, head dims 64 and 128 at new batches and sequences, int8 at two new shapes.
_POINTS_D = [
    ("moe8-s2k-b4-cap", dict(model="moe8", batch=4, remat="full", moe="capacity")),
    ("moe8-s4k-b2-dropless", dict(model="moe8", seq=4096, batch=2, remat="full", moe="dropless")),
    ("moe8-s1k-b16-dropless", dict(model="moe8", seq=1024, batch=16, remat="full", moe="dropless")),
    ("moe16-s2k-b8-dropless", dict(model="moe16", batch=8, remat="full", moe="dropless")),
    ("moe16-s2k-b8-cap", dict(model="moe16", batch=8, remat="full", moe="capacity")),
    ("moe8-s2k-b4-cap-minimal", dict(model="moe8", batch=4, remat="minimal", moe="capacity")),
    ("m100-s2k-fl-b4-full", dict(model="m100", remat="full")),
    ("m100-s4k-fl-b8-full", dict(model="m100", seq=4096, batch=8, remat="full")),
    ("m100-s1k-fl-b32-full", dict(model="m100", seq=1024, batch=32, remat="full")),
    ("m350-s4k-fl-b8-full", dict(model="m350", seq=4096, batch=8, remat="full")),
    ("m500-s8k-fl-b2-full", dict(model="m500", seq=8192, batch=2, remat="full")),
    ("m900-s4k-fl-b4-bf16p-full", dict(model="m900", seq=4096, remat="full", param_dtype="bfloat16")),
    ("m500-s4k-fl-b4-full-int8", dict(model="m500", seq=4096, remat="full", quantization="int8")),
    ("m350-s1k-fl-b32-full-int8", dict(model="m350", seq=1024, batch=32, remat="full", quantization="int8")),
]
# Half e (fifth session): 18 new points, all held out, added after the chip's run 4 figures were priced in and
# planned before any was trained.
_POINTS_E = [
    ("m500-s8k-fl-b1-dots", dict(model="m500", seq=8192, batch=1, remat="dots")),
    ("m350-s2k-fl-b12-full", dict(model="m350", batch=12, remat="full")),
    ("m900-s2k-fl-b6-bf16p-full", dict(model="m900", batch=6, remat="full", param_dtype="bfloat16")),
    ("m100-s2k-fl-b12-full", dict(model="m100", batch=12, remat="full")),
    ("m100-s4k-fl-b4-full", dict(model="m100", seq=4096, remat="full")),
    ("m100-s2k-dp-b4-full", dict(model="m100", attention="dot_product", remat="full")),
    ("m1500-s4k-fl-b2-bf16p-full", dict(model="m1500", seq=4096, batch=2, remat="full", param_dtype="bfloat16")),
    ("m350-s8k-fl-b2-full", dict(model="m350", seq=8192, batch=2, remat="full")),
    ("m500-s2k-fl-b6-minimal", dict(model="m500", batch=6, remat="minimal")),
    ("m900-s2k-fl-b8-bf16p-full-int8", dict(model="m900", batch=8, remat="full", param_dtype="bfloat16",
                                            quantization="int8")),
    ("m100-s4k-fl-b8-full-int8", dict(model="m100", seq=4096, batch=8, remat="full", quantization="int8")),
    ("m500-s8k-fl-b2-full-int8", dict(model="m500", seq=8192, batch=2, remat="full", quantization="int8")),
    ("moe8-s2k-b6-cap", dict(model="moe8", batch=6, remat="full", moe="capacity")),
    ("moe16-s4k-b2-dropless", dict(model="moe16", seq=4096, batch=2, remat="full", moe="dropless")),
    ("moe16-s1k-b16-cap", dict(model="moe16", seq=1024, batch=16, remat="full", moe="capacity")),
    ("moe8-s2k-b12-dropless", dict(model="moe8", batch=12, remat="full", moe="dropless")),
    ("moe8-s2k-b8-dropless-megablox", dict(model="moe8", batch=8, remat="full", moe="dropless",
                                           grouped_matmul="megablox")),
    ("moe8-s4k-b4-dropless-megablox", dict(model="moe8", seq=4096, batch=4, remat="full", moe="dropless",
                                           grouped_matmul="megablox")),
]
# Half f (sixth session): 16 new points, all held out, added after the chip's profiles of four head-dim-64 steps
# priced the DMAs between HBM and VMEM and the lanes a matmul leaves empty, and planned before any was trained:
# head dim 64 at new batches, sequences and attention, every dense size at a new shape, int8 at two, MoE at three.
_POINTS_F = [
    ("m100-s2k-fl-b6-full", dict(model="m100", batch=6, remat="full")),
    ("m100-s1k-fl-b8", dict(model="m100", seq=1024, batch=8)),
    ("m100-s4k-dp-b2-full", dict(model="m100", seq=4096, attention="dot_product", batch=2, remat="full")),
    ("m100-s2k-dp-b12-full", dict(model="m100", attention="dot_product", batch=12, remat="full")),
    ("m100-s8k-fl-b4-full", dict(model="m100", seq=8192, batch=4, remat="full")),
    ("m100-s2k-fl-b8-full-int8", dict(model="m100", batch=8, remat="full", quantization="int8")),
    ("m350-s2k-dp-b8-full", dict(model="m350", attention="dot_product", batch=8, remat="full")),
    ("m350-s4k-fl-b6-full", dict(model="m350", seq=4096, batch=6, remat="full")),
    ("m350-s2k-fl-b8-full-int8", dict(model="m350", batch=8, remat="full", quantization="int8")),
    ("m500-s2k-fl-b10-full", dict(model="m500", batch=10, remat="full")),
    ("m500-s1k-dp-b8-full", dict(model="m500", seq=1024, attention="dot_product", batch=8, remat="full")),
    ("m900-s2k-fl-b6-full", dict(model="m900", batch=6, remat="full")),
    ("m900-s1k-fl-b8-bf16p-full", dict(model="m900", seq=1024, batch=8, remat="full", param_dtype="bfloat16")),
    ("moe8-s1k-b8-cap", dict(model="moe8", seq=1024, batch=8, remat="full", moe="capacity")),
    ("moe16-s2k-b4-dropless", dict(model="moe16", batch=4, remat="full", moe="dropless")),
    ("moe8-s2k-b6-dropless-megablox", dict(model="moe8", batch=6, remat="full", moe="dropless",
                                           grouped_matmul="megablox")),
]
# Half g (seventh session): 16 new points, all held out, planned and their predictions committed before any was
# trained, after the VPU time of sine and cosine was priced (roofline/vpu.py): head dim 64 at new batches and
# sequences, every dense size at a new shape, dot-product attention at 0.35B and 0.5B, int8 at three, MoE at two.
_POINTS_G = [
    ("m100-s1k-dp-b16-full", dict(model="m100", seq=1024, attention="dot_product", batch=16, remat="full")),
    ("m100-s4k-fl-b6-full", dict(model="m100", seq=4096, batch=6, remat="full")),
    ("m100-s2k-fl-b10-full-int8", dict(model="m100", batch=10, remat="full", quantization="int8")),
    ("m100-s8k-fl-b1", dict(model="m100", seq=8192, batch=1)),
    ("m350-s2k-fl-b6-full", dict(model="m350", batch=6, remat="full")),
    ("m350-s4k-dp-b2-full", dict(model="m350", seq=4096, attention="dot_product", batch=2, remat="full")),
    ("m350-s1k-fl-b16-full", dict(model="m350", seq=1024, batch=16, remat="full")),
    ("m350-s4k-fl-b4-full-int8", dict(model="m350", seq=4096, batch=4, remat="full", quantization="int8")),
    ("m500-s2k-fl-b6-full", dict(model="m500", batch=6, remat="full")),
    ("m500-s1k-fl-b16-full", dict(model="m500", seq=1024, batch=16, remat="full")),
    ("m500-s2k-dp-b6-full", dict(model="m500", attention="dot_product", batch=6, remat="full")),
    ("m900-s2k-fl-b2-bf16p-full", dict(model="m900", batch=2, remat="full", param_dtype="bfloat16")),
    ("m900-s4k-fl-b2-bf16p-full-int8", dict(model="m900", seq=4096, batch=2, remat="full", param_dtype="bfloat16",
                                            quantization="int8")),
    ("m1500-s2k-fl-b3-bf16p-full", dict(model="m1500", batch=3, remat="full", param_dtype="bfloat16")),
    ("moe16-s2k-b6-cap", dict(model="moe16", batch=6, remat="full", moe="capacity")),
    ("moe8-s2k-b10-dropless", dict(model="moe8", batch=10, remat="full", moe="dropless")),
]
# Half h (eighth session): 16 new points, all held out, planned and their predictions committed before any was
# trained, the first the op-level pricing adopted after half g never saw: head dim 64 at new batches, sequences and
# remat, every dense size at a new shape, knobs the later halves left out (accumulation, offloaded AdamW state, vocab
# tiling, int8 forward only), int8 at two new shapes, MoE at two.
_POINTS_H = [
    ("m100-s2k-fl-b2-full", dict(model="m100", batch=2, remat="full")),
    ("m100-s1k-fl-b24-full", dict(model="m100", seq=1024, batch=24, remat="full")),
    ("m100-s4k-dp-b4-full", dict(model="m100", seq=4096, attention="dot_product", batch=4, remat="full")),
    ("m100-s2k-fl-b8-minimal", dict(model="m100", batch=8, remat="minimal")),
    ("m350-s2k-fl-b10-full", dict(model="m350", batch=10, remat="full")),
    ("m350-s8k-fl-b1-full", dict(model="m350", seq=8192, batch=1, remat="full")),
    ("m350-s2k-fl-b6-full-int8fwd", dict(model="m350", batch=6, remat="full", quantization="int8_fwd")),
    ("m500-s2k-fl-b4-full-acc2", dict(model="m500", batch=4, accum=2, remat="full")),
    ("m500-s4k-fl-b2-full", dict(model="m500", seq=4096, batch=2, remat="full")),
    ("m500-s2k-fl-b6-full-offstate", dict(model="m500", batch=6, remat="full", offload_state=True)),
    ("m900-s1k-fl-b4-bf16p-full", dict(model="m900", seq=1024, batch=4, remat="full", param_dtype="bfloat16")),
    ("m900-s2k-fl-b3-bf16p-full-tiles4", dict(model="m900", batch=3, remat="full", param_dtype="bfloat16", tiles=4)),
    ("m1500-s1k-fl-b4-bf16p-full", dict(model="m1500", seq=1024, batch=4, remat="full", param_dtype="bfloat16")),
    ("m1500-s2k-fl-b2-bf16p-full-int8", dict(model="m1500", batch=2, remat="full", param_dtype="bfloat16",
                                             quantization="int8")),
    ("moe8-s1k-b12-cap", dict(model="moe8", seq=1024, batch=12, remat="full", moe="capacity")),
    ("moe16-s2k-b10-dropless", dict(model="moe16", batch=10, remat="full", moe="dropless")),
]
# Half i (eighth session): 16 new points, all held out, planned and their predictions committed before any was
# trained, after the splash kernels' rates in the steps and the transposes were priced: shapes inside and outside
# the steps' measured splash shapes, head dim 64 at new batches and sequences, int8 at two, MoE at two.
_POINTS_I = [
    ("m100-s1k-fl-b12-full", dict(model="m100", seq=1024, batch=12, remat="full")),
    ("m100-s2k-fl-b3-full", dict(model="m100", batch=3, remat="full")),
    ("m100-s4k-fl-b2-full", dict(model="m100", seq=4096, batch=2, remat="full")),
    ("m100-s2k-dp-b6-full", dict(model="m100", attention="dot_product", batch=6, remat="full")),
    ("m350-s2k-fl-b4-full", dict(model="m350", remat="full")),
    ("m350-s1k-fl-b8-full", dict(model="m350", seq=1024, batch=8, remat="full")),
    ("m350-s4k-fl-b2-full", dict(model="m350", seq=4096, batch=2, remat="full")),
    ("m500-s2k-fl-b2-full", dict(model="m500", batch=2, remat="full")),
    ("m500-s1k-fl-b8-full", dict(model="m500", seq=1024, batch=8, remat="full")),
    ("m500-s2k-fl-b8-full-int8", dict(model="m500", batch=8, remat="full", quantization="int8")),
    ("m900-s2k-fl-b5-bf16p-full", dict(model="m900", batch=5, remat="full", param_dtype="bfloat16")),
    ("m900-s4k-fl-b1-bf16p-full", dict(model="m900", seq=4096, batch=1, remat="full", param_dtype="bfloat16")),
    ("m1500-s2k-fl-b1-bf16p-full", dict(model="m1500", batch=1, remat="full", param_dtype="bfloat16")),
    ("m900-s1k-fl-b6-bf16p-full-int8", dict(model="m900", seq=1024, batch=6, remat="full", param_dtype="bfloat16",
                                            quantization="int8")),
    ("moe8-s2k-b6-dropless", dict(model="moe8", batch=6, remat="full", moe="dropless")),
    ("moe16-s1k-b8-dropless", dict(model="moe16", seq=1024, batch=8, remat="full", moe="dropless")),
]
# Half j (ninth session): 16 new points, all held out, planned and their predictions committed before any was
# trained, after run 8's fourteen steps put the splash kernels' in-step rates at seq 1k-8k for every head dim and
# group: shapes among those measured and beyond them (head dim 64 at seq 8k and batch 2, 1B at seq 8k and batch 2),
# batches none ran, accumulation, dot-product attention, int8 at a new batch, MoE at two.
_POINTS_J = [
    ("m100-s8k-fl-b2-full", dict(model="m100", seq=8192, batch=2, remat="full")),
    ("m100-s4k-fl-b3-full", dict(model="m100", seq=4096, batch=3, remat="full")),
    ("m100-s1k-fl-b16-full", dict(model="m100", seq=1024, batch=16, remat="full")),
    ("m100-s2k-fl-b5-full", dict(model="m100", batch=5, remat="full")),
    ("m350-s4k-fl-b3-full", dict(model="m350", seq=4096, batch=3, remat="full")),
    ("m350-s1k-fl-b12-full", dict(model="m350", seq=1024, batch=12, remat="full")),
    ("m350-s2k-fl-b6-full-acc2", dict(model="m350", batch=6, accum=2, remat="full")),
    ("m500-s1k-fl-b12-full", dict(model="m500", seq=1024, batch=12, remat="full")),
    ("m500-s4k-fl-b3-full", dict(model="m500", seq=4096, batch=3, remat="full")),
    ("m500-s1k-dp-b4-full", dict(model="m500", seq=1024, attention="dot_product", batch=4, remat="full")),
    ("m500-s2k-fl-b10-full-int8", dict(model="m500", batch=10, remat="full", quantization="int8")),
    ("m900-s4k-fl-b3-bf16p-full", dict(model="m900", seq=4096, batch=3, remat="full", param_dtype="bfloat16")),
    ("m900-s8k-fl-b2-bf16p-full", dict(model="m900", seq=8192, batch=2, remat="full", param_dtype="bfloat16")),
    ("m1500-s4k-fl-b1-bf16p-full", dict(model="m1500", seq=4096, batch=1, remat="full", param_dtype="bfloat16")),
    ("moe8-s1k-b10-dropless", dict(model="moe8", seq=1024, batch=10, remat="full", moe="dropless")),
    ("moe16-s2k-b6-dropless", dict(model="moe16", batch=6, remat="full", moe="dropless")),
]
# Half k (ninth session): 10 new points, all held out, planned and their predictions committed before any was
# trained, after small tiles were counted a register each, re-tiling reshapes priced as transposes and the chip
# compiler's unnamed ragged-dot kernels recognized (from run 8's MoE profiles): MoE at five new shapes (dropless and
# capacity, 8 and 16 experts, seq 1k-4k), every dense size at a new batch.
_POINTS_K = [
    ("moe8-s2k-b5-dropless", dict(model="moe8", batch=5, remat="full", moe="dropless")),
    ("moe16-s1k-b12-dropless", dict(model="moe16", seq=1024, batch=12, remat="full", moe="dropless")),
    ("moe8-s1k-b6-cap", dict(model="moe8", seq=1024, batch=6, remat="full", moe="capacity")),
    ("moe16-s2k-b4-cap", dict(model="moe16", batch=4, remat="full", moe="capacity")),
    ("moe8-s4k-b3-dropless", dict(model="moe8", seq=4096, batch=3, remat="full", moe="dropless")),
    ("m100-s2k-fl-b7-full", dict(model="m100", batch=7, remat="full")),
    ("m350-s2k-fl-b5-full", dict(model="m350", batch=5, remat="full")),
    ("m500-s2k-fl-b5-full", dict(model="m500", batch=5, remat="full")),
    ("m900-s2k-fl-b3-bf16p-full", dict(model="m900", batch=3, remat="full", param_dtype="bfloat16")),
    ("m1500-s1k-fl-b2-bf16p-full", dict(model="m1500", seq=1024, batch=2, remat="full", param_dtype="bfloat16")),
]
_ALL = (_POINTS + _POINTS_C + _POINTS_D + _POINTS_E + _POINTS_F + _POINTS_G + _POINTS_H + _POINTS_I + _POINTS_J
        + _POINTS_K)
POINTS = {name: {**_BASE, **fields} for name, fields in _ALL}
assert len(POINTS) == len(_ALL), "a point name is used twice in spaces/onchip_v5e.py"
HALF = {**{name: "ab"[i % 2] for i, (name, _) in enumerate(_POINTS)}, **{name: "c" for name, _ in _POINTS_C},
        **{name: "d" for name, _ in _POINTS_D}, **{name: "e" for name, _ in _POINTS_E},
        **{name: "f" for name, _ in _POINTS_F}, **{name: "g" for name, _ in _POINTS_G},
        **{name: "h" for name, _ in _POINTS_H}, **{name: "i" for name, _ in _POINTS_I},
        **{name: "j" for name, _ in _POINTS_J}, **{name: "k" for name, _ in _POINTS_K}}

STUDY = dict(objectives=["mfu", "memory"], tuner="grid", trials=len(POINTS), target="tpu:v5e-1",
             count_flops=False, timeout=600)


def kind(name: str) -> str:
    """"moe" for a mixture-of-experts point, else "dense": `--set kind=moe` with a half retrains its MoE points
    alone (after a change to the trainer's MoE layer)."""
    return "moe" if POINTS[name]["moe"] else "dense"


def constraint(d: dict) -> bool:
    return HALF[d["point"]] == d["half"] and kind(d["point"]) == d["kind"]


def model_config(p: dict):
    d, layers, heads, kv, d_ff = MODELS[p["model"]]
    return fdl.Config(ModelConfig, vocab_size=32000, d_model=d, n_layers=layers, n_heads=heads,
                      head_dim=64 if p["model"] == "m100" else 128, n_kv_heads=kv, d_ff=d_ff,
                      seq_len=p["seq"], dtype="bfloat16", scan_layers=True,
                      activation="silu", mlp="gated", position="rope", attention=p["attention"],
                      vocab_tiles=p["tiles"], param_dtype=p["param_dtype"], quantization=p["quantization"],
                      **_moe_fields(p["moe"], p["model"], p["grouped_matmul"]))


def _moe_fields(compute: str, model: str, grouped_matmul: str = "auto") -> dict:
    """The MoE fields of a point: none for a dense one."""
    if not compute:
        return {}
    experts = 16 if model == "moe16" else 8
    return dict(n_experts=experts, experts_per_token=2, expert_d_ff=1408 * 8 // experts, expert_compute=compute,
                capacity_factor=1.25, grouped_matmul=grouped_matmul)


def space():
    p = POINTS[pg.oneof(list(POINTS), name="point")]
    pg.oneof(["a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k"], name="half")
    pg.oneof(["dense", "moe"], name="kind")
    return fdl.Config(
        TrainConfig,
        model=model_config(p),
        mesh=fdl.Config(MeshConfig, ici=(1, 1, 1)),
        per_device_batch=p["batch"],
        grad_accum_steps=p["accum"],
        remat=p["remat"],
        offload_params=p["offload_params"],
        optimizer=fdl.Config(OptimizerConfig, peak_lr=3e-4, warmup_steps=5, offload_state=p["offload_state"]),
        flags=p["flags"],
        steps=10,
        warmup_steps_for_timing=3,
        log=fdl.Config(LogConfig, every_steps=10),
        eval=fdl.Config(EvalConfig, enabled=False),
    )

"""One table of accelerator figures, keyed by device kind, each figure with its source.

`spec_for_device_kind("TPU v5 lite")` -> the v5e entry; `spec("h200")` by table name. Every
number is a `Figure(value, source)`: the source (a URL or a document, and how the number
follows from it) is data next to the number, so a report can cite it and a test can check
that nothing is unsourced. flops.peak_flops_per_device, topology.CHIPS and the planner's
roofline hardware (search/targets.hardware_for) all read this table; nothing else holds a
hardware figure.

Units: FLOP/s, bytes, bytes/s, seconds. Bandwidths between chips are per chip:
  ici_bandwidth  TPU: ICI, all ports together, both directions. GPU: NVLink total per GPU,
                 both directions (through NVSwitch).
  ici_ports      TPU: ICI ports of the chip. GPU: 2, the GPU modelled as one bidirectional
                 ring through NVSwitch, so one direction of one "link" is NVLink / 4.
  dcn_bandwidth  the chip's share of the data-center network (GPU: its NIC), one direction.
  host_bandwidth the device's PCIe link to its host, one direction (offloaded activations,
                 parameters and optimizer state move over it).
Device kinds: TPUs match `device_kinds` exactly (case aside; "TPU v5" is v5p, "TPU v5 lite"
is v5e). GPUs match their table name as a word of CUDA's device name ("NVIDIA H100 80GB
HBM3"), except the variants in `kind_excludes` (PCIe / NVL / 40 GB parts have other figures).
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from .errors import TrainerError

GiB = 1024 ** 3


class UnknownDeviceKind(TrainerError, ValueError):
    """No entry of the hardware table is this device kind (one line, with the known kinds)."""


@dataclass(frozen=True)
class Figure:
    """One number and where it comes from."""

    value: float
    source: str


@dataclass(frozen=True)
class KernelRate:
    """The measured share of peak_bf16_flops one attention kernel ran at, for one block and sequence
    (its FLOPs as the roofline counts them, over its device time)."""

    kernel: str  # a name its custom call carries: "splash_mha_fwd", "splash_mha_dkv", "splash_mha_dq"
    block: int  # the kernel's q / kv block
    seq: int
    share: Figure


def attention_table(rates) -> tuple[tuple[str, int, tuple[tuple[int, float], ...]], ...]:
    """KernelRates as the roofline reads them (Hardware.attention_rates): per kernel and block,
    ((seq, share), ...) by seq."""
    keys = dict.fromkeys((r.kernel, r.block) for r in rates)
    return tuple((k, b, tuple(sorted((r.seq, r.share.value) for r in rates if (r.kernel, r.block) == (k, b))))
                 for k, b in keys)


@dataclass(frozen=True)
class SplashRate:
    """The measured share of peak_bf16_flops of one splash kernel for one block, head dim, query heads per
    K/V head (`group`), seq and batch x K/V heads (`kv_rows`)."""

    kernel: str
    block: int
    head_dim: int
    group: int
    seq: int
    kv_rows: int
    share: Figure


def splash_grid_table(rates) -> tuple[tuple[str, int, int, int, tuple[tuple[int, tuple[tuple[int, float], ...]], ...]],
                                       ...]:
    """SplashRates as the roofline reads them (Hardware.attention_grid): per kernel, block, head dim and
    group, ((seq, ((kv_rows, share), ...)), ...) sorted."""
    out: dict[tuple, dict[int, list]] = {}
    for r in rates:
        out.setdefault((r.kernel, r.block, r.head_dim, r.group), {}).setdefault(r.seq, []).append(
            (r.kv_rows, r.share.value))
    return tuple((*key, tuple((s, tuple(sorted(p))) for s, p in sorted(by_seq.items()))) for key, by_seq in out.items())


@dataclass(frozen=True)
class IndexRate:
    """The measured seconds per row of a row gather or scatter (kind "gather", "scatter" or
    "scatter_add"), for `rows` rows of `row_bytes` each, sorted indices."""

    kind: str
    rows: int
    row_bytes: int
    seconds: Figure


@dataclass(frozen=True)
class RaggedRate:
    """The measured share of peak of jax.lax.ragged_dot (every row once) with feature dims k x n:
    its forward, and its backward (the lhs gradient and the weight gradient together)."""

    k: int
    n: int
    forward: Figure
    backward: Figure


@dataclass(frozen=True)
class DeviceSpec:
    """One device kind: one JAX device (a TPU chip in megacore mode, one GPU)."""

    name: str  # table key: "v5e", "h200"
    platform: str  # "tpu" | "gpu"
    device_kinds: tuple[str, ...]  # jax Device.device_kind spellings (TPU: matched exactly)
    peak_bf16_flops: Figure  # dense, without sparsity
    hbm_bytes: Figure  # the product page's capacity
    hbm_usable_bytes: Figure  # what a program may use (TPU: the compiler's limit)
    hbm_bandwidth: Figure
    ici_bandwidth: Figure  # see the module docstring
    ici_ports: Figure
    dcn_bandwidth: Figure
    ici_latency_s: Figure  # per collective hop (ring step)
    dcn_latency_s: Figure
    torus_dims: Figure  # 2 (v5e, v6e), 3 (v4, v5p); 1 for an NVSwitch GPU node
    cores_per_chip: Figure  # TensorCores per JAX device (v4 / v5p slice names count these)
    matmul_efficiency: Figure  # share of peak_bf16_flops a large bf16 matmul was measured to sustain
    # share of hbm_bandwidth an XLA elementwise op was measured to sustain (the bytes it must move / its time)
    hbm_efficiency: Figure
    kind_excludes: tuple[str, ...] = ()  # GPU: words of a device name that make it another part
    # the device's PCIe link to its host, one direction (host offload moves over it); None where
    # no figure is sourced (the roofline then leaves host transfers unpriced)
    host_bandwidth: Figure | None = None
    # TPU: the TensorCore clock, which the compiler's per-op cycle estimates count; None on GPUs
    clock_hz: Figure | None = None
    # share of peak_bf16_flops the attention kernels' matmul FLOPs were measured to run at (their S x S
    # matmuls share the kernel with the softmax): TPU the Pallas splash kernels, GPU cuDNN's flash attention
    attention_efficiency: Figure | None = None
    # share of the links' bandwidth (ici_link_bandwidth, the ring model above) a collective between the
    # devices of one slice / node sustains: GPU, NCCL's bus bandwidth over the ring model's
    ici_efficiency: Figure | None = None
    # per attention kernel, block and sequence, the share of peak it was measured to run at (TPU v5e: the
    # splash kernels, head dim 128); the roofline interpolates these (Hardware.attention_share) and keeps
    # attention_efficiency for kernels without a row; None: none
    attention_rates: tuple[KernelRate, ...] | None = None
    # dense int8 x int8 -> int32 matmul peak (TPU v5e / v6e / v5p: twice the bf16 rate); None: int8 matmuls
    # are priced at the bf16 rate (no figure sourced)
    peak_int8_ops: Figure | None = None
    # splash kernels by block, head dim, query heads per K/V head, seq and batch x K/V heads; where given,
    # preferred over attention_rates (roofline/chip.py Hardware.grid_share)
    attention_grid: tuple[SplashRate, ...] | None = None
    # row gathers and scatters (a MoE layer's dispatch and combine) by kind, rows and row bytes, and what
    # unsorted indices cost over sorted ones, by kind; None: priced by their bytes alone
    index_rates: tuple[IndexRate, ...] | None = None
    unsorted_index: tuple[tuple[str, Figure], ...] | None = None
    # jax.lax.ragged_dot (a dropless MoE layer's grouped matmuls) by shape; None: at the matmul rate
    ragged_rates: tuple[RaggedRate, ...] | None = None
    # the Pallas megablox grouped-matmul kernels (gmm / tgmm, MaxText's megablox=True) at the trainer's tiling by
    # shape; None: at the matmul rate
    megablox_rates: tuple[RaggedRate, ...] | None = None
    # shares of hbm_bandwidth HBM reads and HBM writes sustain, measured apart on the chip (a reduction's reads, a
    # copy's reads and writes); None: every byte at hbm_efficiency
    hbm_read_efficiency: Figure | None = None
    hbm_write_efficiency: Figure | None = None
    # cycles per 32-bit vector register of each kind of VPU work (search/planning/roofline/vpu.py), measured in the
    # chip's own steps; None: ops without a matmul are priced by their bytes alone
    vpu_cycles: tuple[tuple[str, Figure], ...] | None = None
    # ((a part of a splash kernel's name, times its attention_grid price it took in a training step), ...); None: 1
    attention_in_step: tuple[tuple[str, Figure], ...] | None = None
    # the splash kernels' shares measured inside training steps: where a kernel's shape lies inside their measured
    # points they price it (search/planning/roofline/chip.py Hardware.step_grid_share); None: none
    attention_step_grid: tuple[SplashRate, ...] | None = None
    # the DMAs between HBM and VMEM hidden in the HBM time the ops scheduled between their start and -done leave
    # idle (search/planning/roofline/dma_overlap.py), where the chip's profiled steps showed it; False: each on the
    # compute stream at its bytes' price
    dma_overlap: bool = False

    def index_table(self) -> tuple[tuple[str, int, tuple[tuple[int, float], ...]], ...]:
        """index_rates as the roofline reads them (Hardware.index_rows): per kind and rows,
        ((row bytes, seconds per row), ...) by row bytes."""
        rates = self.index_rates or ()
        keys = dict.fromkeys((r.kind, r.rows) for r in rates)
        return tuple((k, n, tuple(sorted((r.row_bytes, r.seconds.value) for r in rates
                                         if (r.kind, r.rows) == (k, n)))) for k, n in keys)

    def attention_table(self) -> tuple[tuple[str, int, tuple[tuple[int, float], ...]], ...]:
        """attention_rates as the roofline reads them (Hardware.attention_rates)."""
        return attention_table(self.attention_rates or ())

    @property
    def ici_link_bandwidth(self) -> float:
        """One direction of one ICI link (GPU: of one direction of the NVLink ring)."""
        return self.ici_bandwidth.value / self.ici_ports.value / 2

    def figures(self) -> dict[str, Figure]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if isinstance(getattr(self, f.name), Figure)}

    def sources(self) -> tuple[str, ...]:
        """The distinct sources of this entry's figures, in field order."""
        return tuple(dict.fromkeys(f.source for f in self.figures().values()))

    def matches(self, device_kind: str) -> bool:
        kind = device_kind.strip().lower()
        if any(kind == k.lower() for k in self.device_kinds):
            return True
        if self.platform != "gpu" or not re.search(rf"\b{re.escape(self.name)}\b", kind):
            return False
        return not any(re.search(rf"\b{re.escape(x)}\b", kind) for x in self.kind_excludes)


# ----------------------------------------------------------------------------- sources

_CLOUD = "https://cloud.google.com/tpu/docs/"
_SCALING = "https://jax-ml.github.io/scaling-book/tpus/"
_OOM = ("measured: XLA's TPU compiler (libtpu 0.0.52) message CompileTimeHbmOom 'exceeds available "
        "HBM ({})' for an oversized program compiled for this chip's topology")
_ICI_LAT = ("estimate: ICI neighbour latency is sub-microsecond; a ring step adds DMA issue and a "
            "sync flag, ~1 us (" + _SCALING + ", 'All About TPUs'; Jouppi et al., TPU v4, ISCA 2023)")
_DCN_LAT = ("estimate: one message between hosts over the data-center network (NIC, switches, host "
            "round trip), tens of us; order of magnitude, not measured")
_NVLINK_LAT = ("estimate: NVLink/NVSwitch hop ~1 us, as ICI (NCCL ring step: kernel flag + copy); "
               "order of magnitude, not measured")
_IB_LAT = ("estimate: one message between nodes over InfiniBand/RoCE through NCCL's proxy, tens of us; "
           "order of magnitude, not measured")
_ONE_RING = "model: one bidirectional ring through NVSwitch (NVLink/4 per direction of a ring link)"
_NVSWITCH = "model: an NVSwitch node has no torus; collectives are modelled as rings over 1 dimension"
_MEGACORE = "one TensorCore per chip: {}"
_TWO_CORES = "2 TensorCores per chip, one JAX device in megacore mode: {}"
_PALLAS_MATMUL = ("https://docs.jax.dev/en/latest/pallas/tpu/matmul.html (jax-ml/jax "
                  "docs/pallas/tpu/matmul.ipynb, the 'XLA matmul' cell's output: jnp.matmul of bf16 "
                  "8192x8192x8192 on one TPU v5e, 6.047 ms = 181.8 TFLOP/s = 92.30% of 197 TFLOP/s; 4096^3: "
                  "84.33%; timed with Python dispatch included)")
_SCALE_HBM = ("measured: XLA's bf16 x * 2 over 16384x16384 on one TPU v5e (device timing, 2026-05-04) at "
              "80.3% of 819 GB/s (its 1,073,741,824 bytes read and written / its time): github.com/AMLeng/"
              "tpu-kernels src/tpu_kernels/ops/scale/PERF.md@078449150061f876e1dd285f9fe48969d725204a; the same "
              "chip's XLA RMSNorm and softmax of (32768, 8192) bf16 (rmsnorm/PERF.md, softmax/PERF.md there) then "
              "come out 4.6% and 4.4% slower than measured (tests/roofline/test_hbm_efficiency.py)")
_V6E_HBM = ("measured: XLA's copy of a 16,777,216-element bf16 array (33,554,432 bytes read and written) on one "
            "TPU v6e, device time of the jitted copy from the profiler trace (median of 200): 0.049359 ms = "
            "1,359.6 GB/s = 82.9% of 1,640 GB/s: github.com/AI-Hypercomputer/tpu-recipes microbenchmarks/"
            "README.md and benchmark_hbm.py@2a958e8bbea3b77983c8592bd92478636ca7170b ('HBM Bandwidth Benchmark', "
            "its example output; v6e-1)")
# HBM reads and writes on the project's v5e chip, apart (benchmarks/chip_figures.py --sections hbm, run 1): a
# reduction of bf16 to f32 (reads, a write 1/2048 of them) at 0.901 and 0.921 of 819 GB/s (32 and 256 MiB); a scale
# (reads = writes) at 0.802 and 0.803. Reads at their mean, 0.911; writes at what leaves the scale's time: 2 / 0.8025 =
# 1 / 0.911 + 1 / w, w = 0.717. The chip's other ops of that record come out within 4% (an add, r = 2w, 0.835 against
# 0.807-0.810; a bf16 -> f32 convert, w = 2r, 0.771 against 0.758-0.763; tests/roofline/test_hbm_efficiency.py),
# where one share of 0.803 for every byte puts the reductions 11-13% slow
V5E_HBM_READ = 0.911
V5E_HBM_WRITE = 0.717
_V5E_HBM_SPLIT = ("measured: the project's v5e chip, XLA's reduction (reads) and scale (reads and writes) of 32 and "
                  "256 MiB bf16, device time (benchmarks/chip_figures.py --sections hbm; benchmarks/data/"
                  "chip_figures_v5e_2026-12-07.json): reads at 0.911 of 819 GB/s, writes at 0.717")
_V5E_HBM = ("assumption: no published measurement of an XLA elementwise op traced for this chip; TPU v5e's "
            "measured 80.3% is used (" + _SCALE_HBM + ")")
_GPU_HBM = ("assumption: no measurement traced; bytes are priced at the product page's bandwidth (1), as "
            "before this figure existed")
_V5E_MATMUL = ("assumption: no published XLA matmul measurement traced for this chip; TPU v5e's measured "
               "92.3% is used (" + _PALLAS_MATMUL + ")")
_MXUS = (_SCALING + " (4 MXUs per TensorCore, each a 128x128 systolic array, 256x256 on v6e, doing "
          "one multiply-add per cell and cycle: '5e13 bf16 FLOPs/s per MXU at 1.5GHz on TPU v5e')")


def _clock(peak: float, cores: int, mxu: int) -> Figure:
    """The TensorCore clock that gives the chip's peak: peak / (cores x 4 MXUs x mxu^2 cells x 2 FLOPs)."""
    hz = peak / (cores * 4 * mxu * mxu * 2)
    return Figure(hz, f"derived: {peak / 1e12:.0f} TFLOP/s / ({cores} TensorCore(s) x 4 MXUs x {mxu}x{mxu} x 2) "
                      f"= {hz / 1e9:.3f} GHz; " + _MXUS)


_V6E_MATMUL = ("measured: XLA's bf16 8192x8192x8192 matmul (lax.dot_general, bf16 out) on one TPU v6e, device time "
               "from the profiler trace (device_duration_ps), median of 100: 1510.94 us = 727.7 TFLOP/s = 79.27% of "
               "918 TFLOP/s: github.com/yangwhale/gpu-tpu-pedia tpu/v7_perf/chay_gemm_benchmark_simple/"
               "results_trace_test.csv@6744feed05af6f4e7e9dd63ed198ed8c484fafae (2026-02-11). The TPU compiler's own "
               "estimate of the same matmul for one v6e chip (jax 0.10.2, libtpu 0.0.52) is 70.4% "
               "(estimated_cycles 2,977,840 at the derived 1.751 GHz; tests/roofline/test_compiler_cycles.py)")
_V6E_SPLASH = ("derived from MaxText's own XProf profile on TPU v6e-8 (Qwen3 8B, MaxText 532c8b3d8, batch 3 "
               "per chip, S 8192, 32 query heads x 128, attention=flash sa_block_* 2048 with the fused backward, "
               "remat custom with q/k/v/out_proj offloaded): splash bucket 1,177 ms per step and chip, 3 kernel "
               "calls per layer (the forward, the forward again with residuals, the fused dK/dV/dQ kernel) over "
               "36 layers: https://github.com/vlasenkoalexey/tpu_performance_autoresearch_wiki wiki/analyses/"
               "2026-06-12-maxtext-vs-jax-bucket-diff.md@5fbac99e. The kernels' FLOPs per layer and step, 2 + 2 + 5 "
               "S x S matmuls over 10 of 16 causal blocks: 9.277e12 -> 283.7 TFLOP/s = 30.9% of 918 TFLOP/s. Two "
               "other trainers running tokamax's faster splash variant at the same shape measured 25.5 ms per layer "
               "and step (39.6%; tests/roofline/test_attention_efficiency.py). The profile names the calls '1 fwd + 1 "
               "residuals-reusing fwd-dq + 1 dkv'; were the middle one a 3-matmul dq kernel, the figure would be 34.3%")
_V5E_SPLASH_RUN = ("measured on the project's TPU v5e (jax 0.10.2, libtpu 0.0.42.1), 2026-12-07: benchmarks/data/"
                   "chip_figures_v5e_2026-12-07.json, section 'splash' (benchmarks/RESULTS.md, 'The v5e chip's own "
                   "figures, run 1': `python3 benchmarks/chip_figures.py --out $OUT/figures --budget-s 115` on the "
                   "chip), jax's splash kernels, causal, head dim 128, batch x seq = 8192 tokens, each kernel's device "
                   "time from a jax.profiler trace, its FLOPs the roofline's own count "
                   "(search/planning/roofline/cost.py SPLASH_MATMULS)")
_V5E_SPLASH = ("measured: fit to the half-a points of the on-chip benchmark, 2026-12-07, benchmarks/RESULTS.md "
               "('The v5e chip's own steps: what the roofline missed'): spaces/onchip_v5e.py trained on the project's "
               "TPU v5e (libtpu 0.0.42.1, 10 steps, the last 7 timed), the 8 half-a points planned here (libtpu "
               "0.0.52) and re-priced with the splash kernels' share of peak varied on a 0.005 grid; 0.510 gives them "
               "the least mean |error| (benchmarks/calibrate_onchip.py). Rule with it: the figure holds at head dim "
               "128 (5 of the 6 half-a splash points), a kernel of head dim d < 128 runs at d / 128 of it (m100's 64: "
               "0.255; search/planning/roofline/cost.py flop_rate). Half b (held out) was never used to set it. The "
               "chip's own "
               "per-kernel rates (V5E_SPLASH_RATES: by kernel, block and seq) were tried in its place "
               "(benchmarks/RESULTS.md, 'The v5e splash kernels at the chip's measured rates'): 5.2% mean |error| over "
               "all 19 trained points, none of them used (half b 5.7%), against the fit's 3.7% (half b 4.0%); all of "
               "the loss is on the head-dim-64 points, whose rate is not measured (d / 128 of the head-dim-128 rates, "
               "an assumption); at head dim 128 the measured rates did better (11 points: 3.0% / 8.8% against 3.2% / "
               "12.4%). Run 2 measured the kernels at head dim 64 (benchmarks/data/"
               "chip_figures_v5e_2026-12-07_run2.json): block 512 runs at 0.46-0.56 of the head-dim-128 rates, mean "
               "0.52, so the d / 128 rule holds within 4% on average and the head-dim-64 points' miss is not the "
               "kernels' rate. With HBM bytes counted as the chip's tiles lay them out (roofline/hlo.py tiled_dims) "
               "and the matmul fusions at their in-step rate, the measured rates price the 19 trained points at 2.7% "
               "mean / 8.3% max, all held out, so the v5e entry then priced the splash kernels at V5E_SPLASH_RATES; "
               "since the chip's run 3 it prices them at V5E_SPLASH_GRID (also by head dim, query heads per K/V head "
               "and batch x K/V heads) and keeps this fit only for a kernel without a measured row")
# v5e splash kernels' share of peak by kernel, block and seq (heads 8 and 16 averaged; the forward kernel
# also over its forward-only and forward + backward runs): tests/roofline/test_attention_efficiency.py checks these
# against the JSON record. A kernel of head dim d < 128 runs at d / 128 of these (Hardware.attention_head_dim;
# measured at head dim 64 in run 2: 0.46-0.56 of them, mean 0.52, at block 512). The v5e entry's
# attention_rates since the chip's run 2 (benchmarks/RESULTS.md, 'The v5e entry from the chip's own figures'); since
# run 3 the entry's attention_grid (V5E_SPLASH_GRID) prices every kernel it has rows for, which is all three at
# blocks 128-512, so these serve only a Hardware without the grid (benchmarks/calibrate_onchip.py --figures measured)
_V5E_SPLASH_SHARES = {
    ("splash_mha_fwd", 512): (0.448, 0.464, 0.477, 0.530),
    ("splash_mha_dkv", 512): (0.662, 0.684, 0.697, 0.745),
    ("splash_mha_dq", 512): (0.646, 0.637, 0.633, 0.701),
    ("splash_mha_fwd", 128): (0.052, 0.051, 0.051, 0.060),
    ("splash_mha_dkv", 128): (0.124, 0.123, 0.122, 0.143),
    ("splash_mha_dq", 128): (0.091, 0.088, 0.088, 0.114),
}
V5E_SPLASH_RATES = tuple(
    KernelRate(kernel, block, seq, Figure(share, f"{_V5E_SPLASH_RUN}; {kernel}, block {block}, seq {seq}"))
    for (kernel, block), shares in _V5E_SPLASH_SHARES.items()
    for seq, share in zip((1024, 2048, 4096, 8192), shares, strict=True))
_V5E_INDEX_RUN = ("measured on the project's TPU v5e (jax 0.10.2, libtpu 0.0.42.1), 2026-12-07: benchmarks/data/"
                  "chip_figures_v5e_2026-12-07_run3_index.json (rows of 512 B-16 KiB) and _run4_index_narrow.json "
                  "(rows of 128 and 256 B, bf16), section 'index' (benchmarks/RESULTS.md, 'MoE dispatch and ragged "
                  "dots on the chip' and run 4: `python3 benchmarks/chip_figures.py --out $OUT/index --sections index "
                  "[--index-widths 64,128 --index-no-ragged]` on the chip), each program's device time from a "
                  "jax.profiler trace")
# v5e row gathers / scatters / scatter-adds, seconds per row by rows moved and row bytes (sorted indices, the table
# 1.25 x the rows): tests/roofline/test_indexed.py checks these against the JSON records. Rows of 128 and 256 B are
# bf16 rows (run 4; f32 rows of the same bytes ran 5-40% faster, bf16 is what a MoE layer moves)
_V5E_INDEX_NS = {
    ("gather", 8192): (2.57, 1.99, 3.28, 2.93, 3.94, 6.39, 12.67, 72.28),
    ("scatter", 8192): (4.76, 5.74, 10.35, 14.38, 26.97, 42.96, 150.29, 192.47),
    ("scatter_add", 8192): (7.72, 7.62, 12.56, 16.59, 32.6, 48.63, 134.2, 178.72),
    ("gather", 32768): (2.34, 1.88, 3.12, 2.84, 3.85, 21.78, 60.91, 72.23),
    ("scatter", 32768): (4.62, 5.8, 10.48, 13.71, 26.82, 37.38, 138.63, 191.79),
    ("scatter_add", 32768): (7.57, 7.51, 10.25, 12.1, 22.67, 24.59, 81.28, 103.39),
}
INDEX_ROW_BYTES = (128, 256, 512, 1024, 2048, 4096, 8192, 16384)
V5E_INDEX_RATES = tuple(
    IndexRate(kind, rows, b, Figure(ns * 1e-9, f"{_V5E_INDEX_RUN}; {kind}, {rows} rows of {b} bytes"))
    for (kind, rows), per_row in _V5E_INDEX_NS.items() for b, ns in zip(INDEX_ROW_BYTES, per_row, strict=True))
# random against sorted indices, rows of 2048 bytes, mean of 8192 and 32768 rows
V5E_UNSORTED_INDEX = tuple(
    (kind, Figure(f, f"{_V5E_INDEX_RUN}; {kind} of rows of 2048 bytes, random / sorted indices, mean of 8192 and "
                     "32768 rows"))
    for kind, f in (("gather", 1.0), ("scatter", 1.357), ("scatter_add", 1.338)))
# ragged_dot's share of peak by (k, n): forward, and backward = 2 x its FLOPs over (forward + backward) - forward
V5E_RAGGED_RATES = tuple(
    RaggedRate(k, n, Figure(f, f"{_V5E_INDEX_RUN}; ragged_dot forward, {rows} rows x {k} against {g} groups' "
                               f"[{k}, {n}]"),
               Figure(b, f"{_V5E_INDEX_RUN}; ragged_dot backward (forward + backward less the forward), {rows} "
                         f"rows x {k} against {g} groups' [{k}, {n}]"))
    for k, n, rows, g, f, b in ((1024, 1408, 32768, 8, 0.476, 0.700), (2048, 1408, 16384, 8, 0.607, 0.655),
                                (1024, 2816, 32768, 16, 0.606, 0.613)))
_V5E_GMM_RUN = ("measured on the project's TPU v5e (jax 0.10.2, libtpu 0.0.42.1), 2026-12-07, run 4: benchmarks/data/"
                "chip_figures_v5e_2026-12-07_run4_gmm.json, section 'gmm' (`python3 benchmarks/chip_figures.py --out "
                "$OUT/gmm --sections gmm` on the chip), each program's device time from a jax.profiler trace")
# the megablox kernels (jax.experimental.pallas.ops.tpu.megablox.ops.gmm, tiling 512 x 1024 x 1024, MaxText's
# default and the trainer's) by (k, n): forward, and backward = 2 x its FLOPs over (forward + backward) - forward.
# At tiling 128^3 (megablox's own default) the same shapes ran at 0.05-0.06 of peak; jax.lax.ragged_dot at
# 0.44-0.67 forward (V5E_RAGGED_RATES: 1024 x 1408 measured again in run 4, the same 0.476 / 0.700)
V5E_MEGABLOX_RATES = tuple(
    RaggedRate(k, n, Figure(f, f"{_V5E_GMM_RUN}; megablox forward, {rows} rows x {k} against {g} groups' [{k}, {n}]"),
               Figure(b, f"{_V5E_GMM_RUN}; megablox backward (forward + backward less the forward), {rows} rows x {k} "
                         f"against {g} groups' [{k}, {n}]"))
    for k, n, rows, g, f, b in ((1024, 1408, 32768, 8, 0.633, 0.590), (4096, 14336, 16384, 8, 0.923, 0.909),
                                (7168, 2048, 49152, 32, 0.925, 0.867)))
_V5E_SPLASH_GRID_RUN = (
    "measured on the project's TPU v5e (jax 0.10.2, libtpu 0.0.42.1), 2026-12-07, runs 1-4 of "
    "benchmarks/chip_figures.py (benchmarks/RESULTS.md, 'Splash kernels by batch x K/V heads and head group'): "
    "benchmarks/data/chip_figures_v5e_2026-12-07*.json (benchmarks/chip_figures.py SPLASH_GRID_RECORDS), jax's "
    "splash kernels, causal, each kernel's device time from a jax.profiler trace, its FLOPs the roofline's count; "
    "averaged as chip_figures.splash_grid does")
# v5e splash kernels' share of peak by (kernel, block, head dim, query heads per K/V head) and, per row, (seq, batch x
# K/V heads, share): the kernels slow down as batch x K/V heads grows (at head dim 128, seq 2048: dK/dV 0.717 at 32,
# 0.615-0.665 at 64) and with 3 query heads per K/V head (dQ 0.53 against 0.62 for 1 or 2 at the same 64); groups 1
# and 2 ran alike and are filed together as 2 (chip_figures.splash_group). tests/roofline/test_attention_efficiency.py
# checks these against the records.
_V5E_SPLASH_GRID = {
    ('splash_mha_dkv', 128, 128, 2): (
        (1024, 64, 0.135), (1024, 128, 0.113), (2048, 32, 0.133), (2048, 64, 0.112), (4096, 16, 0.132),
        (4096, 32, 0.112), (8192, 8, 0.156), (8192, 16, 0.13),
    ),
    ('splash_mha_dkv', 256, 64, 2): (
        (1024, 64, 0.187), (1024, 128, 0.172), (2048, 32, 0.187), (2048, 64, 0.172), (4096, 16, 0.187),
        (4096, 32, 0.172), (8192, 8, 0.153), (8192, 16, 0.157),
    ),
    ('splash_mha_dkv', 512, 64, 2): (
        (1024, 64, 0.37), (1024, 128, 0.347), (2048, 32, 0.378), (2048, 64, 0.359), (4096, 16, 0.382),
        (4096, 32, 0.365), (8192, 8, 0.344), (8192, 16, 0.343),
    ),
    ('splash_mha_dkv', 512, 64, 3): (
        (1024, 32, 0.393), (1024, 128, 0.32), (2048, 16, 0.39), (2048, 64, 0.315), (4096, 8, 0.386), (4096, 32, 0.31),
        (8192, 4, 0.329), (8192, 16, 0.308),
    ),
    ('splash_mha_dkv', 512, 128, 2): (
        (1024, 64, 0.697), (1024, 128, 0.65), (2048, 32, 0.717), (2048, 64, 0.66), (4096, 16, 0.728),
        (4096, 32, 0.667), (8192, 8, 0.774), (8192, 16, 0.685),
    ),
    ('splash_mha_dkv', 512, 128, 3): (
        (1024, 32, 0.646), (1024, 128, 0.632), (2048, 16, 0.639), (2048, 64, 0.615), (4096, 8, 0.642),
        (4096, 32, 0.604), (8192, 4, 0.752), (8192, 16, 0.597),
    ),
    ('splash_mha_dq', 128, 128, 2): (
        (1024, 64, 0.094), (1024, 128, 0.087), (2048, 32, 0.091), (2048, 64, 0.086), (4096, 16, 0.09),
        (4096, 32, 0.085), (8192, 8, 0.134), (8192, 16, 0.094),
    ),
    ('splash_mha_dq', 256, 64, 2): (
        (1024, 64, 0.19), (1024, 128, 0.143), (2048, 32, 0.191), (2048, 64, 0.131), (4096, 16, 0.19),
        (4096, 32, 0.135), (8192, 8, 0.165), (8192, 16, 0.158),
    ),
    ('splash_mha_dq', 512, 64, 2): (
        (1024, 64, 0.367), (1024, 128, 0.297), (2048, 32, 0.369), (2048, 64, 0.277), (4096, 16, 0.372),
        (4096, 32, 0.29), (8192, 8, 0.334), (8192, 16, 0.334),
    ),
    ('splash_mha_dq', 512, 64, 3): (
        (1024, 32, 0.366), (1024, 128, 0.277), (2048, 16, 0.367), (2048, 64, 0.278), (4096, 8, 0.37),
        (4096, 32, 0.287), (8192, 4, 0.33), (8192, 16, 0.296),
    ),
    ('splash_mha_dq', 512, 128, 2): (
        (1024, 64, 0.665), (1024, 128, 0.626), (2048, 32, 0.655), (2048, 64, 0.619), (4096, 16, 0.648),
        (4096, 32, 0.619), (8192, 8, 0.752), (8192, 16, 0.63),
    ),
    ('splash_mha_dq', 512, 128, 3): (
        (1024, 32, 0.578), (1024, 128, 0.539), (2048, 16, 0.578), (2048, 64, 0.529), (4096, 8, 0.59),
        (4096, 32, 0.544), (8192, 4, 0.672), (8192, 16, 0.557),
    ),
    ('splash_mha_fwd', 128, 128, 2): (
        (1024, 64, 0.053), (1024, 128, 0.051), (2048, 32, 0.052), (2048, 64, 0.051), (4096, 16, 0.052),
        (4096, 32, 0.05), (8192, 8, 0.06), (8192, 16, 0.06),
    ),
    ('splash_mha_fwd', 256, 64, 2): (
        (1024, 64, 0.11), (1024, 128, 0.101), (2048, 32, 0.114), (2048, 64, 0.103), (4096, 16, 0.115),
        (4096, 32, 0.106), (8192, 8, 0.127), (8192, 16, 0.11),
    ),
    ('splash_mha_fwd', 512, 64, 2): (
        (1024, 64, 0.246), (1024, 128, 0.234), (2048, 32, 0.262), (2048, 64, 0.248), (4096, 16, 0.276),
        (4096, 32, 0.262), (8192, 8, 0.296), (8192, 16, 0.273),
    ),
    ('splash_mha_fwd', 512, 64, 3): (
        (1024, 32, 0.245), (1024, 128, 0.206), (2048, 16, 0.261), (2048, 64, 0.215), (4096, 8, 0.272),
        (4096, 32, 0.217), (8192, 4, 0.308), (8192, 16, 0.22),
    ),
    ('splash_mha_fwd', 512, 128, 2): (
        (1024, 64, 0.449), (1024, 128, 0.447), (2048, 32, 0.467), (2048, 64, 0.463), (4096, 16, 0.481),
        (4096, 32, 0.475), (8192, 8, 0.53), (8192, 16, 0.499),
    ),
    ('splash_mha_fwd', 512, 128, 3): (
        (1024, 32, 0.452), (1024, 128, 0.424), (2048, 16, 0.47), (2048, 64, 0.442), (4096, 8, 0.482),
        (4096, 32, 0.448), (8192, 4, 0.543), (8192, 16, 0.459),
    ),
}


def splash_rates(table: dict, source: str) -> tuple[SplashRate, ...]:
    """SplashRates from {(kernel, block, head dim, group): ((seq, batch x K/V heads, share), ...)}, each share
    measured as `source` says."""
    return tuple(SplashRate(kernel, block, d, group, seq, bkv,
                            Figure(share, f"{source}; {kernel}, block {block}, head dim {d}, {group} query heads per "
                                          f"K/V head, seq {seq}, batch x K/V heads {bkv}"))
                 for (kernel, block, d, group), pts in table.items() for seq, bkv, share in pts)


V5E_SPLASH_GRID = splash_rates(_V5E_SPLASH_GRID, _V5E_SPLASH_GRID_RUN)
_V5E_MATMUL_IN_STEP = (
    "measured: the project's TPU v5e (jax 0.10.2, libtpu 0.0.42.1), 2026-12-07, the matmul fusions of four training "
    "steps (0.31B Llama-style, seq 2048: plain and splash attention at batch 1, remat full at batch 8, remat offload "
    "at batch 4; benchmarks/chip_profile.py, benchmarks/data/chip_profile_v5e_2026-12-07.json), device time from "
    "jax.profiler traces bucketed the roofline's way: the roofline's matmul bucket at 0.923 of peak came out 3-7% "
    "short of the measured one, i.e. the step's matmul fusions ran at 0.86-0.90 of peak, 0.88 on average. Isolated "
    "bf16 matmuls of the same shapes run faster on the chip (0.87-0.985, squares of 2048-8192 0.95-0.97: "
    "benchmarks/data/chip_figures_v5e_2026-12-07_run2.json) and the published figure was 0.923 (" + _PALLAS_MATMUL
    + "); the in-step rate wins because it is what a step's matmul fusions (their operands' layout changes and "
    "elementwise epilogues included) sustain. None of the on-chip benchmark's points was used to set it: with it and "
    "the splash kernels at their measured rates (V5E_SPLASH_RATES) all 19 trained points are held out "
    "(benchmarks/RESULTS.md, 'The v5e entry from the chip's own figures')")
_SPLASH_ASSUMED = ("assumption: no published measurement of the splash-attention kernels traced for this chip; its "
                   "matmul efficiency is used")
_PCIE = (_SCALING + " ('PCIe bandwidth is typically around 1.5e10 bytes / second per chip'; "
         "taken as each direction of the full-duplex link)")
_MAMF = ("https://github.com/stas00/ml-engineering/blob/master/compute/accelerator/README.md "
         "('Maximum Achievable Matmul FLOPS comparison table', BF16, mean of 100 iterations: {})")
_CUDNN_FMHA = ("measured: cuDNN 9.19's flash attention (SDPA) on one NVIDIA H200, BF16, causal (top-left), "
               "batch 1, S 4096, 64 query / 8 KV heads of 128: forward 0.465 ms (591 TFLOP/s), backward 1.450 ms "
               "(474 TFLOP/s), median kernel device time (torch profiler); FLOPs as cuDNN's benchmark counts "
               "them, 2 x (d_qk + d_v) per computed score forward and 2 x (3 d_qk + 2 d_v) backward over the "
               "S (S + 1) / 2 causal scores, so forward + backward = 9.621e11 / 1.915 ms = 502.5 TFLOP/s = 50.8% "
               "of 989: github.com/NVIDIA/cudnn-frontend benchmark/sdpa_benchmark_training/results/"
               "h200_919_only_cudnn/llama3.1_20260227_034703.csv@df73764adb98b7445b77662ce07b1ea434c8f3ee "
               "(the same table: 40.1% at S 2048, 57.3% at S 8192; the kernel is compute-bound, and H100 SXM "
               "shares H200's compute die and clocks)")
_NCCL_BUSBW = ("measured: nccl-tests all_gather_perf and all_reduce_perf on 8 x H100 SXM over NVLink (128 MB-16 GB) "
               "saturate at ~360 GB/s bus bandwidth, which NCCL's maintainer answered is 'exactly what we'd expect on "
               "H100' (https://github.com/NVIDIA/nccl-tests/issues/326, 2025-06-23/24); the ring model prices a ring "
               "collective at 2 x NVLink / 4 = 450 GB/s, so 360 / 450 = 0.80 of it")
_NCCL_SAME_NVLINK = "H200 SXM has H100 SXM's NVLink 4 (900 GB/s) through the same NVSwitch generation: " + _NCCL_BUSBW
_NCCL_ASSUMED = "assumption: no NCCL measurement traced for this GPU; H100's share is used (" + _NCCL_BUSBW + ")"
_V5E_STEP_OPS = (
    "measured: the project's TPU v5e (jax 0.10.2, libtpu 0.0.42.1), 2026-12-07/08, every op of 44 training steps "
    "profiled with jax.profiler and kept with the chip compiler's HLO (benchmarks/data/chip_steps_v5e_run5, eight "
    "planned slow, _run6, six planned fast, _run6b and _run7, eleven more, _run8, fourteen at the splash shapes the "
    "others left out, _run8b, three MoE and two half-j steps; `python -m paxsearch.benchmarks.fit_vpu`)")
# cycles per 32-bit vector register by kind of VPU work (roofline/vpu.py KINDS): the fit of max(an op's roofline,
# its VPU time) to the measured times of the 44 steps' 6,742 ops without a matmul, each register a tile at least (a
# T(2,128) tile leaves 6 of a register's 8 sublanes empty: vpu.vregs) and a reshape that re-tiles its operand a
# transpose (vpu.relayout). Counted so, the "other on-chip" bucket of the five MoE steps came within 0.3-0.9% of
# their step (2.1-7.8% short before: their top-k combine, [tokens, 2, d] in T(2,128) tiles, ran 4-7x its count),
# all 44 within 0.52% on average, 2.0% at most (0.93% / 7.8%). Run 5 and 6's fourteen steps alone give the same
# sine / cosine (20.15); the entry of run 7 (25 steps, registers by elements): 20.18, 0.703, 0.215, 1.029, 0.212,
# 3.127. RoPE's tables: the two fusions of
# m350-s2k-fl-b8-full, results in VMEM, ran 55.6 us an execution, priced 56.0 at 20.2 cycles and 6 ns at their bytes.
# Transposes (a copy that lays another dimension along the lanes, in VMEM: the attention's [B, S, H, D] <-> [B, H, S,
# D] relayouts) ran 10-95 us where the movement figure priced them at 0.9-4.8; fit on the fourteen steps, the "other
# on-chip" bucket of the eleven steps of runs 6b and 7 came within 0.82% of the step on average (1.16% without)
V5E_VPU_CYCLES = tuple((kind, Figure(cycles, _V5E_STEP_OPS + f"; {kind}, fit over the steps' ops without a matmul"))
                       for kind, cycles in (("trigonometric", 20.176), ("transcendental", 0.285),
                                            ("arithmetic", 0.227), ("reduction", 1.264), ("movement", 0.218),
                                            ("transpose", 2.480)))
# the splash kernels' measured time in the steps over their V5E_SPLASH_GRID price (measured alone), by kind, summed
# over the 41 steps with splash attention (per step 0.85-1.10 forward, 0.78-1.45 dQ, 0.82-1.22 dK/dV; runs 5 and 6's
# eleven alone gave 1.005, 1.124, 1.102): what prices a kernel whose shape the steps' own rates
# (V5E_SPLASH_STEP_GRID) do not cover
V5E_SPLASH_IN_STEP = tuple((part, Figure(t, _V5E_STEP_OPS + f"; the 41 with splash attention, splash "
                                            f"{part.strip('_')} kernels in the step over their grid price"))
                           for part, t in (("_fwd", 0.989), ("_dq", 1.044), ("_dkv", 1.070)))
# the splash kernels' share of peak inside the chip's profiled training steps, by (kernel, block, head dim, query
# heads per K/V head): ((seq, batch x K/V heads, share), ...), pooled over the 41 steps with splash attention of
# runs 5-8 (163 kernels, 99 shapes; run 8's fourteen steps profiled for the shapes runs 5-7 left out: head dim 64 at
# seq 1k, 4k and 8k, batch 1-2 of the larger models at 2k-8k, 3 query heads per K/V head at 1k, 4k and 8k). In the
# steps the kernels ran 0.78-1.45x their price measured alone (V5E_SPLASH_GRID), and not by one factor per kind: dQ
# at head dim 64 slower the smaller the batch (1.45x at batch 2, 0.92x at 12), at head dim 128 faster per FLOP the
# fewer batch x K/V heads at every seq (at 2k and 2 query heads per K/V head 0.81 of peak at 8, 0.65 at 32). Each
# step priced from the other steps' kernels: splash within 1.38% of the step on average, 5.4% at most, inside the
# shapes (1.79% / 6.2% at the grid measured alone, 1.81% / 5.4% at that times one factor per kind); each run from
# the other runs' (run 8 of shapes none of the others ran): 1.54% / 6.0% (`python -m paxsearch.benchmarks.fit_splash`,
# benchmarks/RESULTS.md 'On-chip run 8'). Read beyond their measured points they mislead (a seq the steps never ran:
# 8k at 3 query heads per K/V head priced 6-8% fast in run 7), so they price a kernel only inside them
# (Hardware.step_grid_share); the grid measured alone times V5E_SPLASH_IN_STEP prices the rest.
_V5E_SPLASH_STEP_GRID = {
    ('splash_mha_dkv', 512, 64, 3): ((1024, 48, 0.329), (1024, 128, 0.319), (2048, 8, 0.335), (2048, 16, 0.327),
                                     (2048, 24, 0.325), (2048, 32, 0.327), (2048, 48, 0.319), (4096, 8, 0.328),
                                     (4096, 32, 0.309), (8192, 8, 0.319), (8192, 16, 0.308)),
    ('splash_mha_dkv', 512, 128, 2): ((1024, 32, 0.734), (1024, 40, 0.747), (1024, 48, 0.643), (1024, 64, 0.664),
                                      (2048, 8, 0.807), (2048, 16, 0.711), (2048, 24, 0.681), (2048, 32, 0.647),
                                      (4096, 8, 0.67), (4096, 16, 0.649), (4096, 32, 0.605), (8192, 4, 0.705),
                                      (8192, 8, 0.648), (8192, 16, 0.562)),
    ('splash_mha_dkv', 512, 128, 3): ((1024, 32, 0.76), (1024, 64, 0.673), (2048, 8, 0.783), (2048, 24, 0.644),
                                      (2048, 48, 0.624), (4096, 8, 0.701), (4096, 16, 0.592), (8192, 8, 0.585)),
    ('splash_mha_dq', 512, 64, 3): ((1024, 48, 0.294), (1024, 128, 0.304), (2048, 8, 0.253), (2048, 16, 0.291),
                                    (2048, 24, 0.296), (2048, 32, 0.285), (2048, 48, 0.322), (4096, 8, 0.289),
                                    (4096, 32, 0.322), (8192, 8, 0.315), (8192, 16, 0.335)),
    ('splash_mha_dq', 512, 128, 2): ((1024, 32, 0.641), (1024, 40, 0.608), (1024, 48, 0.68), (1024, 64, 0.574),
                                     (2048, 8, 0.764), (2048, 16, 0.657), (2048, 24, 0.611), (2048, 32, 0.6),
                                     (4096, 8, 0.698), (4096, 16, 0.589), (4096, 32, 0.54), (8192, 4, 0.75),
                                     (8192, 8, 0.609), (8192, 16, 0.558)),
    ('splash_mha_dq', 512, 128, 3): ((1024, 32, 0.582), (1024, 64, 0.537), (2048, 8, 0.74), (2048, 24, 0.588),
                                     (2048, 48, 0.53), (4096, 8, 0.649), (4096, 16, 0.563), (8192, 8, 0.551)),
    ('splash_mha_fwd', 512, 64, 3): ((1024, 48, 0.222), (1024, 128, 0.191), (2048, 8, 0.26), (2048, 16, 0.254),
                                     (2048, 24, 0.234), (2048, 32, 0.216), (2048, 48, 0.218), (4096, 8, 0.268),
                                     (4096, 32, 0.215), (8192, 8, 0.242), (8192, 16, 0.226)),
    ('splash_mha_fwd', 512, 128, 2): ((1024, 32, 0.478), (1024, 40, 0.474), (1024, 48, 0.477), (1024, 64, 0.464),
                                      (2048, 8, 0.549), (2048, 16, 0.51), (2048, 24, 0.493), (2048, 32, 0.5),
                                      (4096, 8, 0.53), (4096, 16, 0.514), (4096, 32, 0.466), (8192, 4, 0.604),
                                      (8192, 8, 0.526), (8192, 16, 0.499)),
    ('splash_mha_fwd', 512, 128, 3): ((1024, 32, 0.475), (1024, 64, 0.457), (2048, 8, 0.506), (2048, 24, 0.507),
                                      (2048, 48, 0.471), (4096, 8, 0.537), (4096, 16, 0.473), (8192, 8, 0.482)),
}
_V5E_STEP_KERNELS = (
    "measured: the project's TPU v5e (jax 0.10.2, libtpu 0.0.42.1), 2026-12-07/08, the splash kernels of 41 "
    "training steps profiled with jax.profiler and kept with the chip compiler's HLO (benchmarks/data/chip_steps_v5e_"
    "run5, _run6, _run6b, _run7, _run8, _run8b; `python -m paxsearch.benchmarks.fit_splash`): each kernel's FLOPs "
    "(the roofline's count) over its measured time in the step")
V5E_SPLASH_STEP_GRID = splash_rates(_V5E_SPLASH_STEP_GRID, _V5E_STEP_KERNELS)
# Priced with these, the VPU time of every kind and the DMAs hidden in their schedule's HBM idle time (the v5e
# entry's dma_overlap), the 150 trained points of the on-chip benchmark came out 1.75% mean / 5.9% max, 65%
# predicted faster (run 7's entry: 2.04% / 6.8% on 134); half j, 16 points planned with run 8's splash table and
# committed before they trained, 1.6% / 5.3%, 9 of 16 faster (benchmarks/RESULTS.md, 'On-chip run 8';
# `benchmarks/reprice_onchip.py`)
_V5E_ICI_SHARE = 0.855  # v5e's measured share of a link, also assumed where a chip has none (_ICI_ASSUMED)
_SCALING_AG = ("measured: XLA's AllGather on a TPU v5e 8x16 slice along its 16-chip axis (a full bidirectional "
               "ring), the unidirectional link bandwidth worked out from the collective's cost reaching 'about 95% "
               "of the peak claimed bandwidth (4.5e10)' from about 10 MB on: 42.75 GB/s of this table's 50 GB/s "
               "link = 0.855: " + _SCALING.replace("tpus/", "sharding/") + " ('empirical bandwidth and estimated "
               "link bandwidth for TPU v5e during an AllGather'; read from the figure, so about +-2%)")
_PPERMUTE = ("measured: a barriered lax.ppermute in a fori_loop on {chip}, the repeat-count slope (device "
             "time, no dispatch) fitted over 1 KiB-64 MiB per device to 'time = {fixed} us + bytes / {gbs} GB/s', "
             "64 MiB in {t64} us; priced as one link one way ({link} GB/s here): {gbs} / {link} = {share}. The "
             "thread does not give the shift's route: github.com/marin-community/marin issue 6736, comment of "
             "2026-06-28 ('TPU ppermute payload sweep update')")
_V5P_ICI = _PPERMUTE.format(chip="TPU v5p-8", fixed="4.55", gbs="86.3", t64="781.98", link="100", share="0.863")
_V6E_ICI = (_PPERMUTE.format(chip="TPU v6e-8", fixed="2.29", gbs="86.8", t64="776.34", link="100", share="0.868")
            + ". A psum of a replicated bf16 17408x17408 over all 256 chips of a v6e-256, host-timed, ran at "
              "235.76 GB/s of bus bandwidth (github.com/AI-Hypercomputer/tpu-recipes microbenchmarks/trillium/"
              "collectives README), 0.60 of the two rings' 400 GB/s: the planner prices it 31% faster "
              "(tests/roofline/test_ici_efficiency.py)")
_ICI_ASSUMED = ("assumption: no measurement of XLA's collectives traced for this chip; TPU v5e's measured "
                "share is used (" + _SCALING_AG + ")")
_CUDNN_FMHA_ASSUMED = ("assumption: no measurement of cuDNN's flash attention traced for this GPU; its matmul "
                       "efficiency is used")
_JAX_GPU_MEM = ("https://docs.jax.dev/en/latest/gpu_memory_allocation.html: JAX preallocates 75% of "
                "the GPU's memory (XLA_PYTHON_CLIENT_MEM_FRACTION=.75)")


def _tpu(name, kinds, peak, hbm_gib, usable_gib, hbm_bw, ici, ports, dcn, dims, cores, sources) -> DeviceSpec:
    s = sources
    matmul = Figure(*s.get("matmul", (0.923, _V5E_MATMUL)))
    return DeviceSpec(
        name, "tpu", kinds, Figure(peak, s["peak"]), Figure(hbm_gib * GiB, s["hbm"]),
        Figure(usable_gib * GiB, _OOM.format(f"{usable_gib}G")), Figure(hbm_bw, s["hbm_bw"]),
        Figure(ici, s["ici"]), Figure(ports, s["ports"]), Figure(dcn, s["dcn"]),
        Figure(1e-6, _ICI_LAT), Figure(20e-6, _DCN_LAT), Figure(dims, s["ports"]),
        Figure(cores, (_TWO_CORES if cores == 2 else _MEGACORE).format(s["peak"].split(" ")[0])),
        matmul, Figure(*s.get("hbm_eff", (0.803, _V5E_HBM))),
        host_bandwidth=Figure(*s.get("host", (1.5e10, _PCIE))),
        clock_hz=_clock(peak, cores, 256 if name == "v6e" else 128),
        attention_efficiency=Figure(*s.get("attention", (matmul.value, _SPLASH_ASSUMED))),
        ici_efficiency=Figure(*s.get("collectives", (_V5E_ICI_SHARE, _ICI_ASSUMED))),
        attention_rates=s.get("attention_rates"),
        peak_int8_ops=Figure(*s["int8"]) if "int8" in s else None,
        attention_grid=s.get("attention_grid"), index_rates=s.get("index_rates"),
        unsorted_index=s.get("unsorted_index"), ragged_rates=s.get("ragged_rates"),
        megablox_rates=s.get("megablox_rates"),
        hbm_read_efficiency=Figure(*s["hbm_read"]) if "hbm_read" in s else None,
        hbm_write_efficiency=Figure(*s["hbm_write"]) if "hbm_write" in s else None,
        vpu_cycles=s.get("vpu_cycles"), attention_in_step=s.get("attention_in_step"),
        attention_step_grid=s.get("attention_step_grid"),
        dma_overlap=bool(s.get("dma_overlap", False)))


def _gpu(name, kinds, peak, hbm, hbm_bw, nvlink, nic, matmul, sources, excludes) -> DeviceSpec:
    s = sources
    return DeviceSpec(
        name, "gpu", kinds, Figure(peak, s["peak"]), Figure(hbm, s["peak"]),
        Figure(0.75 * hbm, _JAX_GPU_MEM), Figure(hbm_bw, s["peak"]), Figure(nvlink, s["peak"]),
        Figure(2, _ONE_RING), Figure(nic, s["nic"]), Figure(1e-6, _NVLINK_LAT), Figure(20e-6, _IB_LAT),
        Figure(1, _NVSWITCH), Figure(1, "a GPU is one JAX device"), Figure(matmul, s["matmul"]),
        Figure(1.0, _GPU_HBM), excludes,
        host_bandwidth=Figure(*s["host"]),
        attention_efficiency=Figure(*s.get("attention", (matmul, _CUDNN_FMHA_ASSUMED))),
        ici_efficiency=Figure(*s.get("collectives", (0.8, _NCCL_ASSUMED))))


TABLE: dict[str, DeviceSpec] = {s.name: s for s in (
    _tpu("v4", ("TPU v4",), 275e12, 32, 30.75, 1200e9, 6 * 2 * 45e9, 6, 50e9 / 8, 3, 2, {
        "peak": _CLOUD + "v4 (275 TFLOP/s bf16 per chip)",
        "hbm": _CLOUD + "v4 (32 GiB HBM2 per chip)",
        "hbm_bw": _CLOUD + "v4 (1,200 GB/s HBM bandwidth)",
        "ici": _SCALING + " (TPU v4: 45 GB/s per ICI port and direction, 6 ports; Jouppi et al., ISCA 2023)",
        "ports": _CLOUD + "v4 (3D torus, 6 ICI ports per chip)",
        "dcn": "assumption: the v4 page gives no DCN figure; taken equal to v5p's 50 Gbps per chip ("
               + _CLOUD + "v5p)"}),
    _tpu("v5e", ("TPU v5 lite", "TPU v5e"), 197e12, 16, 15.75, 819e9, 400e9, 4, 25e9 / 8, 2, 1, {
        "peak": _CLOUD + "v5e (197 TFLOP/s bf16 per chip)",
        "hbm": _CLOUD + "v5e (16 GB HBM2 per chip, counted here as 16 GiB)",
        "hbm_bw": _CLOUD + "v5e (819 GB/s HBM bandwidth)",
        "ici": _CLOUD + "v5e (ICI 1,600 Gbps per chip one way = 400 GB/s both ways)",
        "ports": _CLOUD + "v5e (2D torus, 4 ICI ports per chip)",
        "dcn": _CLOUD + "v5e (DCN 6.4 Tbps per 256-chip Pod = 25 Gbps per chip)",
        "matmul": (0.88, _V5E_MATMUL_IN_STEP), "hbm_eff": (0.803, _SCALE_HBM), "attention": (0.510, _V5E_SPLASH),
        "attention_rates": V5E_SPLASH_RATES, "int8": (393e12, _CLOUD + "v5e (393 TOPs int8 per chip)"),
        "attention_grid": V5E_SPLASH_GRID, "index_rates": V5E_INDEX_RATES, "unsorted_index": V5E_UNSORTED_INDEX,
        "ragged_rates": V5E_RAGGED_RATES, "megablox_rates": V5E_MEGABLOX_RATES,
        "hbm_read": (V5E_HBM_READ, _V5E_HBM_SPLIT), "hbm_write": (V5E_HBM_WRITE, _V5E_HBM_SPLIT),
        "collectives": (_V5E_ICI_SHARE, _SCALING_AG), "vpu_cycles": V5E_VPU_CYCLES,
        "attention_in_step": V5E_SPLASH_IN_STEP, "attention_step_grid": V5E_SPLASH_STEP_GRID, "dma_overlap": True}),
    _tpu("v5p", ("TPU v5", "TPU v5p"), 459e12, 95, 95.73, 2765e9, 1200e9, 6, 50e9 / 8, 3, 2, {
        "peak": _CLOUD + "v5p (459 TFLOP/s bf16 per chip)",
        "hbm": _CLOUD + "v5p (95 GiB HBM2e per chip)",
        "hbm_bw": _CLOUD + "v5p (2,765 GB/s HBM bandwidth)",
        "ici": _CLOUD + "v5p (ICI 4,800 Gbps per chip = 1,200 GB/s both ways)",
        "ports": _CLOUD + "v5p (3D torus, 6 ICI ports per chip)",
        "dcn": _CLOUD + "v5p (DCN 50 Gbps per chip)", "collectives": (0.863, _V5P_ICI),
        "int8": (918e12, _CLOUD + "v5p (918 TOPS int8 per chip)")}),
    _tpu("v6e", ("TPU v6 lite", "TPU v6e"), 918e12, 32, 31.24, 1640e9, 800e9, 4, 100e9 / 8, 2, 1, {
        "peak": _CLOUD + "v6e (918 TFLOP/s bf16 per chip)",
        "hbm": _CLOUD + "v6e (32 GB HBM per chip, counted here as 32 GiB)",
        "hbm_bw": _CLOUD + "v6e (1,640 GB/s HBM bandwidth)",
        "ici": _CLOUD + "v6e (ICI 800 GB/s both ways per chip, the page's current table; an older version "
                        "said 3,584 Gbps)",
        "ports": _CLOUD + "v6e (2D torus, 4 ICI ports per chip)",
        "dcn": _CLOUD + "v6e (DCN 25.6 Tbps per 256-chip Pod = 100 Gbps per chip)",
        "host": (3.2e10, _SCALING + " ('Trillium (TPU v6e) has 32GB/s, about 2x higher than v5' of PCIe "
                                    "per chip; taken as each direction of the full-duplex link)"),
        "matmul": (0.793, _V6E_MATMUL), "attention": (0.309, _V6E_SPLASH), "hbm_eff": (0.829, _V6E_HBM),
        "collectives": (0.868, _V6E_ICI), "int8": (1836e12, _CLOUD + "v6e (1,836 TOPS int8 per chip)")}),
    _gpu("a100", ("NVIDIA A100-SXM4-80GB",), 312e12, 80e9, 2039e9, 600e9, 200e9 / 8, 0.869, {
        "peak": "https://www.nvidia.com/en-us/data-center/a100/ (A100 80GB SXM: 312 TFLOP/s bf16 dense, "
                "80 GB HBM2e at 2,039 GB/s, NVLink 600 GB/s)",
        "nic": "https://docs.nvidia.com/dgx/dgxa100-user-guide/introduction-to-dgxa100.html (DGX A100: "
               "8 x 200 Gb/s ConnectX-6 for 8 GPUs, one per GPU)",
        "matmul": _MAMF.format("A100 SXM 271.2 of 312 TFLOP/s = 86.9%, 1024x10240x5120, torch 2.6.0+cu126"),
        "host": (32e9, "https://www.nvidia.com/en-us/data-center/a100/ (A100 80GB SXM: PCIe Gen4 64 GB/s, "
                       "both directions: 32 GB/s each)")},
         ("pcie", "40gb")),
    _gpu("h100", ("NVIDIA H100 80GB HBM3",), 989e12, 80e9, 3.35e12, 900e9, 400e9 / 8, 0.803, {
        "peak": "https://www.nvidia.com/en-us/data-center/h100/ (H100 SXM: 989 TFLOP/s bf16 dense, 80 GB "
                "HBM3 at 3.35 TB/s, NVLink 900 GB/s)",
        "nic": "https://docs.nvidia.com/dgx/dgxh100-user-guide/introduction-to-dgxh100.html (DGX H100: "
               "8 x 400 Gb/s ConnectX-7 for 8 GPUs, one per GPU)",
        "matmul": _MAMF.format("H100 SXM 794.5 of 989 TFLOP/s = 80.3%, 2048x2048x13312, torch 2.7.0+cu126"),
        "collectives": (0.8, _NCCL_BUSBW),
        "host": (64e9, "https://www.nvidia.com/en-us/data-center/h100/ (H100 SXM: PCIe Gen5 128 GB/s, both "
                       "directions: 64 GB/s each)"),
        "attention": (0.508, _CUDNN_FMHA)},
         ("pcie", "nvl")),
    _gpu("h200", ("NVIDIA H200",), 989e12, 141e9, 4.8e12, 900e9, 400e9 / 8, 0.803, {
        "peak": "https://www.nvidia.com/en-us/data-center/h200/ (H200 SXM: 989 TFLOP/s bf16 dense, 141 GB "
                "HBM3e at 4.8 TB/s, NVLink 900 GB/s)",
        "nic": "https://docs.nvidia.com/dgx/dgxh100-user-guide/introduction-to-dgxh100.html (DGX H200 "
               "shares DGX H100's 8 x 400 Gb/s ConnectX-7, one per GPU)",
        "matmul": _MAMF.format("H100 SXM 794.5 of 989 TFLOP/s = 80.3%, noted 'H200 is the same'; H200 and "
                               "H100 SXM share the compute die and clocks"),
        "host": (64e9, "https://www.nvidia.com/en-us/data-center/h200/ (H200 SXM: PCIe Gen5 128 GB/s, both "
                       "directions: 64 GB/s each)"),
        "attention": (0.508, _CUDNN_FMHA), "collectives": (0.8, _NCCL_SAME_NVLINK)}, ("nvl",)),
)}


def find_device_kind(device_kind: str) -> DeviceSpec | None:
    """The entry whose device kind `device_kind` is (a JAX Device.device_kind), or None."""
    for entry in TABLE.values():
        if entry.matches(device_kind):
            return entry
    return None


def spec_for_device_kind(device_kind: str) -> DeviceSpec:
    """The entry of `device_kind`; UnknownDeviceKind when the table has none."""
    entry = find_device_kind(device_kind)
    if entry is None:
        raise unknown_kind(device_kind)
    return entry


def unknown_kind(device_kind: str) -> UnknownDeviceKind:
    known = ", ".join(k for e in TABLE.values() for k in e.device_kinds)
    return UnknownDeviceKind(f"no hardware figures for device kind {device_kind!r}; known: {known} "
                             "(add it to trainer/hardware.py)")


def spec(name: str) -> DeviceSpec:
    """The entry named `name` ("v5e", "h200"); UnknownDeviceKind when there is none."""
    try:
        return TABLE[name]
    except (KeyError, TypeError):
        raise UnknownDeviceKind(f"no hardware entry {name!r}; entries: {', '.join(TABLE)}") from None

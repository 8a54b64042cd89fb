"""The figures of one chip that the roofline prices FLOPs, HBM bytes and transfers with
(Hardware), and the default latency per collective hop (see search/planning/roofline/__init__.py)."""
from __future__ import annotations

import math
from dataclasses import dataclass

ICI_STEP_LATENCY_S = 1e-6  # per ring step over ICI
DCN_STEP_LATENCY_S = 20e-6  # per ring step over the data-center network


@dataclass
class Hardware:
    """Figures of one device, all in bytes/s, FLOP/s and seconds."""

    name: str
    peak_flops: float
    hbm_bandwidth: float
    ici_link_bandwidth: float  # one direction of one link
    dcn_bandwidth: float  # per chip
    physical_dims: int = 1  # torus dimensions (2 for v5e/v6e, 3 for v4/v5p)
    ici_latency_s: float = ICI_STEP_LATENCY_S  # per collective hop (ring step) over ICI
    dcn_latency_s: float = DCN_STEP_LATENCY_S  # per collective hop over the data-center network
    matmul_efficiency: float = 1.0  # share of peak_flops a large bf16 matmul sustains (measured, sourced)
    # share of peak_flops the splash-attention kernels' matmul FLOPs run at (measured on v6e, sourced);
    # None: the matmul efficiency
    attention_efficiency: float | None = None
    # the head dim attention_efficiency holds for: a splash kernel with a smaller head dim d runs at
    # d / attention_head_dim of it (cost.flop_rate); None: the same rate at every head dim
    attention_head_dim: int | None = 128
    # per attention kernel the share of peak_flops it was measured to run at, by block and sequence:
    # ((kernel name, block, ((seq, share), ...)), ...) (TPU v5e: the splash kernels at head dim 128,
    # trainer/hardware.py); a kernel with a row here is priced by it (attention_share), any other at
    # attention_efficiency. predict.hardware_for fills it from the chip's entry in trainer/hardware.py
    attention_rates: tuple[tuple[str, int, tuple[tuple[int, float], ...]], ...] = ()
    # per splash kernel, block, head dim and query heads per K/V head, ((seq, ((batch x K/V heads, share), ...)),
    # ...) (TPU v5e: trainer/hardware.py V5E_SPLASH_GRID); where a kernel has rows here, grid_share prices it
    attention_grid: tuple = ()
    hbm_efficiency: float = 1.0  # share of hbm_bandwidth an elementwise op sustains (measured, sourced)
    # shares of hbm_bandwidth HBM reads and HBM writes sustain, where the chip measured them apart (TPU v5e: a
    # reduction reads at 0.91, a copy-like op moves its bytes at 0.80): an op's bytes are then priced as its reads
    # and its writes (hbm_seconds); None: every byte at hbm_efficiency
    hbm_read_efficiency: float | None = None
    hbm_write_efficiency: float | None = None
    # the int8 x int8 -> int32 matmul peak over the bf16 peak (TPU v5e, v5p, v6e: 2); an int8 matmul runs at
    # sustained_flops x this (the chip's int8 8192^3 ran at 0.966 of its int8 peak, bf16 at 0.949 of its own)
    int8_speedup: float = 1.0
    # seconds per row of row gathers and scatters: ((kind, rows, ((row bytes, seconds), ...)), ...), and random
    # over sorted indices by kind ((kind, factor), ...) (TPU v5e: measured; roofline/indexed.py); () none
    index_rows: tuple[tuple[str, int, tuple[tuple[int, float], ...]], ...] = ()
    unsorted_index: tuple[tuple[str, float], ...] = ()
    # jax.lax.ragged_dot's share of peak by shape: ((k, n, forward, backward), ...); () at the matmul rate
    ragged_shares: tuple[tuple[int, int, float, float], ...] = ()
    # the same for the Pallas megablox kernels (gmm / tgmm; roofline/cost.py is_megablox_kernel); () at the
    # matmul rate
    megablox_shares: tuple[tuple[int, int, float, float], ...] = ()
    # share of the links' bandwidth a collective between devices of one slice / node sustains (GPU: NCCL's
    # bus bandwidth over the ring model's, sourced); DCN transfers are priced at dcn_bandwidth as given
    ici_efficiency: float = 1.0
    # per physical torus dim of the slice: True where it has wraparound links (a ring collective
    # along it drives both directions of 2 links), False where it is an open line (one way on each
    # of them: the devices at the ends have one link along it). None: every dim wraps
    torus_wrap: tuple[bool, ...] | None = None
    host_bandwidth: float | None = None  # one direction of the chip's link to host memory; None: not priced
    # the clock the TPU compiler's per-op cycle estimates count (`estimated_cycles` of a fully
    # compiled module); None: those estimates are not read
    clock_hz: float | None = None
    # what prices an op without a matmul: "roofline" (its FLOPs and bytes; the default: ops measured
    # on a real v5e land within 5% of it, at 0.41-0.51x the compiler's estimates) or "compiler" (at
    # least the compiler's estimate, where there is one)
    on_chip: str = "roofline"
    # cycles per 32-bit vector register of each kind of VPU work (roofline/vpu.py KINDS): an op that does not
    # multiply matrices takes at least its VPU time at clock_hz (TPU v5e: trainer/hardware.py V5E_VPU_CYCLES);
    # () none: such an op is priced by its bytes alone
    vpu_cycles: tuple[tuple[str, float], ...] = ()
    # the share of its HBM bytes' price an async DMA between HBM and VMEM (roofline/dma.py) costs the compute
    # stream (a what-if: benchmarks/reprice_onchip.py; the chip's steps waited 0.226 of it, 0.08-0.46 by step); 1: all
    dma_share: float = 1.0
    # True: an HBM <-> VMEM DMA costs the stream nothing at its start and, at its -done, what its bytes take beyond
    # the HBM time the ops scheduled between leave idle (roofline/dma_overlap.py); False: dma_share of its price
    dma_overlap: bool = False
    # ((a part of a splash kernel's name, times), ...): a training step's kernels whose name holds the part take
    # `times` what attention_grid prices them at (a what-if: benchmarks/reprice_onchip.py, fit_splash.py); () none
    attention_in_step: tuple[tuple[str, float], ...] = ()
    # the splash kernels' shares of peak measured inside training steps, as attention_grid's rows (TPU v5e:
    # trainer/hardware.py V5E_SPLASH_STEP_GRID); a kernel inside their measured points (step_grid_share) is priced
    # at them, any other by attention_grid and attention_in_step; () none
    attention_step_grid: tuple = ()  # the form of attention_grid

    def attention_share(self, kernel: str, seq: int, block: int | None = None) -> float | None:
        """The measured share of peak of the attention kernel named `kernel` (a custom call's name
        containing a row's kernel name) over `seq` tokens with q / kv blocks of `block`: the row of the
        largest measured block not above `block` (the smallest where all are above it; the largest where
        the block is unknown), interpolated linearly in log2(seq) between its measured sequences and
        held at the ends. None where no row names the kernel."""
        rows = [(b, pts) for k, b, pts in self.attention_rates if k in kernel and pts]
        if not rows:
            return None
        below = [r for r in rows if block is None or r[0] <= block]
        _, pts = max(below, key=lambda r: r[0]) if below else min(rows, key=lambda r: r[0])
        return log_interp(pts, seq)

    def grid_share(self, kernel: str, seq: int, block: int | None, head_dim: int, group: int,
                   kv_rows: int) -> tuple[float, int] | None:
        """(share of peak, the head dim it was measured at) of the splash kernel named `kernel` (a custom
        call's name containing a row's kernel name) from attention_grid: the rows of `head_dim` if measured,
        else of head dim 128 (the caller scales those by head_dim / 128 below 128, not above); of the
        largest measured block not above `block` (the smallest where all are above it, the largest where it
        is unknown); of `group`
        query heads per K/V head (1 filed as 2) if measured, else the nearest measured group. At each
        measured seq, linear in log2(batch x K/V heads) between its measured points, held outside them;
        then linear in log2(seq) between the seqs, held outside. None: no row names the kernel."""
        rows = [r for r in self.attention_grid if r[0] in kernel and r[4]]
        if not rows:
            return None
        dims = {r[2] for r in rows}
        d = head_dim if head_dim in dims else (128 if 128 in dims else max(dims))
        rows = [r for r in rows if r[2] == d]
        blocks = sorted({r[1] for r in rows})
        below = [b for b in blocks if block is None or b <= block]
        blk = max(below) if below else min(blocks)
        rows = [r for r in rows if r[1] == blk]
        g = max(2, group)
        grp = min({r[3] for r in rows}, key=lambda x: (abs(x - g), x))
        by_seq = next(r[4] for r in rows if r[3] == grp)
        pooled = dict(next((r[4] for r in rows if r[3] == 2), ()))
        per_seq = [(sq, log_interp(pts, kv_rows) * _trend(pooled.get(sq), pts, kv_rows)) for sq, pts in by_seq]
        return log_interp(tuple(per_seq), seq), d

    def step_grid_share(self, kernel: str, seq: int, block: int | None, head_dim: int, group: int,
                        kv_rows: int) -> float | None:
        """The share of peak of the splash kernel named `kernel` from attention_step_grid where the steps measured
        its block, head dim and group (1 filed as 2) at its seq, with kv_rows inside the measured batch x K/V heads
        there (linear in log2 between them); None outside: no extrapolation from a training step's few shapes."""
        g = max(2, group)
        for k, blk, d, grp, by_seq in self.attention_step_grid:
            if k in kernel and blk == block and d == head_dim and grp == g:
                pts = dict(by_seq).get(seq)
                if pts and pts[0][0] <= kv_rows <= pts[-1][0]:
                    return log_interp(pts, kv_rows)
        return None

    def grid_in_step(self, kernel: str) -> float:
        """How many times its attention_grid price a step's splash kernel named `kernel` takes (attention_in_step:
        the first part its name holds; 1 where none)."""
        return next((t for part, t in self.attention_in_step if part in kernel), 1.0)

    @property
    def sustained_flops(self) -> float:
        """FLOP/s the per-op roofline prices FLOPs at: peak x matmul efficiency."""
        return self.peak_flops * self.matmul_efficiency

    @property
    def sustained_attention_flops(self) -> float:
        """FLOP/s a splash-attention kernel's FLOPs are priced at: peak x attention efficiency."""
        eff = self.attention_efficiency if self.attention_efficiency is not None else self.matmul_efficiency
        return self.peak_flops * eff

    @property
    def sustained_hbm_bandwidth(self) -> float:
        """Bytes/s the per-op roofline prices HBM traffic at: bandwidth x HBM efficiency."""
        return self.hbm_bandwidth * self.hbm_efficiency

    def hbm_seconds(self, read: float, written: float) -> float:
        """Seconds an op's HBM traffic takes: its reads and writes at their own measured shares of the bandwidth
        where the chip has them, else all its bytes at sustained_hbm_bandwidth."""
        if self.hbm_read_efficiency and self.hbm_write_efficiency:
            return (read / self.hbm_read_efficiency + written / self.hbm_write_efficiency) / self.hbm_bandwidth
        return (read + written) / self.sustained_hbm_bandwidth


def log_interp(pts, x: float) -> float:
    """pts ((x, y), ...) sorted by x: y at x, linear in log2(x) between points, held outside them."""
    if x <= pts[0][0]:
        return pts[0][1]
    if x >= pts[-1][0]:
        return pts[-1][1]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:], strict=False):
        if x0 <= x <= x1:
            return y0 + (math.log2(x) - math.log2(x0)) / (math.log2(x1) - math.log2(x0)) * (y1 - y0)
    return pts[-1][1]


def _trend(pooled, pts, x: float) -> float:
    """Where `x` lies outside a group's measured points `pts` at one seq, the pooled group's (2) change
    from the group's nearest measured point to `x` (the groups share the trend in batch x K/V heads: at head
    dim 64 group 3 and MHA slow down alike); 1 inside them or without pooled points covering both."""
    if not pooled or pts[0][0] <= x <= pts[-1][0]:
        return 1.0
    edge = pts[0][0] if x < pts[0][0] else pts[-1][0]
    at_edge = log_interp(pooled, edge)
    return log_interp(pooled, x) / at_edge if at_edge > 0 else 1.0

"""A roofline model of one train step, read from the compiled, optimized HLO.

Everything here is PREDICTED: no step runs. The inputs are the optimized HLO text of the
compiled step (`plan(..., keep_hlo=True).hlo_text`), the jax Mesh it was compiled for, and
the hardware figures of one chip (Hardware).

Modules: hlo.py (HLO text, call graph, trip counts, which opcodes are collectives), chip.py
(Hardware: the figures of one chip, and the default hop latencies), cost.py (FLOPs and HBM bytes
per instruction), indexed.py (row gathers / scatters and ragged dots at the chip's measured rates),
dma.py (which ops are the DMAs between HBM and VMEM of TPU's memory-space assignment), collectives.py
(replica groups, device layout, the cost of each transfer),
schedule.py (overlap read from the schedule), model.py (the combination, analyze).

What is counted, per device and per step
  * Loops. Every computation gets a multiplier: ENTRY is 1; a while body and condition get
    their caller's multiplier times the loop's trip count; fusions, calls and async wrappers
    inherit their caller's. Trip counts come from `known_trip_count` in the while's
    backend_config when XLA wrote one (CPU does), otherwise from the loop itself: the
    condition's `compare(get-tuple-element(param, k), constant(N))`, the initial value of
    tuple element k and the step of its `add` in the body (TPU loops). A loop whose count
    cannot be read counts once and is listed in `unknown_trip_counts`. This matters because
    the layers run under `scan`: whatever is in the body runs n_layers times, while XLA's
    cost_analysis() counts it once.
  * FLOPs. dot: 2 x output elements x contracted size; convolution: XLA's own rule (2 x
    input features per group x output features x batch x valid window positions, the way
    HloCostAnalysis counts it, so padded and dilated TPU "convolutions" are exact);
    elementwise arithmetic and reductions: one FLOP per element. Transcendentals are not
    FLOPs (as in XLA). The Pallas splash-attention custom calls (flash attention on TPU),
    which XLA cannot see into, are counted from their operand shapes (`splash_flops`); so are
    cuDNN's flash-attention calls on GPU (`__cudnn$fmha...`: the score shape and mask from their
    backend_config, the head dims from q, k and v; `cudnn_fmha_flops`), as cuDNN's own
    benchmark counts them.
  * HBM bytes. For every instruction that runs on its own (a fusion, a copy, a custom call,
    a dot outside a fusion ...): bytes of its operands plus bytes of its result. An operand
    that is only read through dynamic-slice counts the slice (also when the slice is taken
    inside a nested fusion, as TPU fuses the per-layer read of a scan's stacked buffer one
    fusion deeper), and an in-place dynamic-update-slice counts the update, not the whole
    buffer (the stacked per-layer weights and saved activations of a scan would otherwise
    be counted whole each layer: maxtext-v5e-16b on v5e-256 counted 1.93e12 B per step, 2.36
    s of memory time, with the nested slices read whole; 1.18e12 B, 1.44 s, read as slices).
    The update is written and nothing of the buffer is read (in a fusion, the update's own
    operands are its reads; counting a read of the slice too added 3-48 ms a step on the v5e
    chip's points, benchmarks/calibrate_onchip.py), and TPU's AllocateBuffer custom call (the
    buffer those updates fill, given and not written) moves nothing.
    Fusion-aware: a fusion counts its own operands and results only, each parameter once
    however many fused ops read it; what is computed inside it (on TPU, plain attention's
    f32 converts, masks, exp of the S x S scores: XLA fuses the softmax into the QK^T, the
    reduce and the normalize fusions) is not HBM traffic. Buffers in another memory space
    (`S(1)`: VMEM, placed by memory-space assignment; S(2)/S(4) sync flags and SMEM) are not
    HBM. An operand read by several fusions is read by each (it is not kept on chip unless
    its layout says S(1)). Async copies: copy-start (destination, source, context) counts
    the source read and the destination write where each lives in HBM; a TPU slice-start
    ((source), slice, context) reads the slice, not the whole source its tuple aliases (read
    whole, a plain-attention v5e step counted 4.58e9 B instead of 4.19e9). Checked on a
    plain-attention step compiled for v5e (d 512, 8 heads, S 2048, batch 2 per chip): the
    S x S scores are materialized in HBM in bf16 by the QK^T fusion and read back by the
    exp-sum, normalize and PV fusions, 87% of the step's HBM bytes, each counted once per
    executed fusion; no fusion there lists one operand twice.
  * Collectives: all-gather, reduce-scatter, all-reduce, all-to-all, collective-permute
    (and collective-broadcast), in plain or async (-start / -done, async-start, TPU
    async-collective fusions) form. Each one is counted once per execution (the -done
    half and the copies of one channel inside TPU async-collective fusions are the same
    transfer). Its replica groups are read in any of XLA's three spellings (explicit
    `{{0,1},{2,3}}`, iota `[2,4]<=[4,2]T(1,0)`, mesh-axes `mesh['a'=2,'b'=4] {'b'}`),
    mapped onto the jax Mesh (logical device i is mesh.devices.flat[i]) to name the mesh
    axes it spans, and onto the devices to decide the link: DCN when a group holds devices
    of more than one slice, ICI otherwise.
  * Host transfers (roofline/host.py): host offload's async dynamic-update-slice into, and
    dynamic-slice out of, a buffer in host memory (`S(5)`), and copies to or from it. Each
    moves its bytes over one direction of the chip's PCIe link (Hardware.host_bandwidth;
    None: not priced) and is listed with the collectives (kind host-d2h / host-h2d, link
    "host"); the schedule replay exposes what the step does not hide.

On-chip time beyond FLOPs and bytes: the TPU compiler's own estimate, reported beside.
  The per-op roofline prices an op by its FLOPs at the measured matmul rate and its HBM
  bytes. That misses what runs on the vector unit (VPU: the exp, max and sums of a softmax,
  norms, casts) and the transpose unit (XLU: relayout copies). Code generation writes
  `estimated_cycles` into the backend_config of every op it emits (the cost model it chose
  each op's tiling with), so a fully compiled TPU module carries the compiler's expectation
  per op (cost.compiler_cycles; seconds = cycles / Hardware.clock_hz, the clock derived from
  the chip's peak and MXUs in trainer/hardware.py and checked as the estimates' time base: a
  large matmul comes out at 88-93% of peak on v4, v5e and v5p, a copy near the HBM
  bandwidth). For the ops without a matmul (cost.uses_mxu) analyze reports how many carry an
  estimate and what the estimates add over the roofline's price of them
  (Roofline.compiler_excess_s). Hardware.on_chip "compiler" prices them in: such an op takes
  max(roofline, estimate); matmuls keep the measured rate (the compiler puts v5e's 8192^3
  bf16 matmul at 87.8% of peak where it was measured at 92.3%). It is not the default: ops
  measured on a real v5e contradict it (tests/roofline/test_hbm_efficiency.py): XLA's bf16
  x * 2, RMSNorm and softmax ran in 0.41-0.51x the time the compiler estimates for them,
  within 5% of the roofline at the measured HBM efficiency (below). On the published rows
  (benchmarks/RESULTS.md, "The TPU compiler's own per-op estimates") it also brought the
  held-out ones from a mean error of 3.3% to 8.0%. The HLO passes' module is written before
  code generation and carries none.

Cost of one collective over a group of n devices, per device (ring algorithms):
    all-gather          input x (n - 1)          (= output x (n-1)/n)
    reduce-scatter      input x (n - 1) / n
    all-reduce          2 x input x (n - 1) / n  (reduce-scatter + all-gather)
    all-to-all          input x (n - 1) / n
    collective-permute  input                    (one hop)
  time = bytes / bandwidth + hops x latency per hop (below).
  ICI bandwidth: a group that spans k physical torus dimensions (from the devices'
  coordinates; 1 when they are unknown) runs k bidirectional rings, so it drives 2k links:
  bandwidth = 2 k x one-way link bandwidth (a collective-permute uses one link, one way). A
  dimension without wraparound links (Hardware.torus_wrap, read from the slice's shape:
  search/planning/topology.py torus_wrap; a v5e-32's both, a v5e-128's 8) is an open line, whose end
  devices have one link along it: it counts one link, not two (scaling-book, "Sharded
  Matrices": an AllGather over 4 v5e chips without wraparound profiled at 680 us, 377 us
  as a ring, 560 us as a line at the full link rate). Times
  Hardware.ici_efficiency, the share of it collectives sustain (trainer/hardware.py: on H100 / H200
  NCCL's measured bus bandwidth, 360 of the 450 GB/s the ring gives, 0.8; on TPUs the share of one
  link XLA's transfers were measured to sustain: v5e 0.855, an AllGather around a ring of 16; v5p
  0.863 and v6e 0.868, a ppermute's slope; v4 v5e's, assumed. A 2-D psum over a whole v6e-256 ran at
  0.60 of its two rings, host-timed: tests/roofline/test_ici_efficiency.py).
  DCN bandwidth: the chip's share of its host's data-center NICs. Torus wrap-around links
  are where the hardware has them (the compile-only slice has them there too); without
  devices whose coordinates say which slice they are, every dimension is taken to wrap.

Latency per hop (Hardware.ici_latency_s, dcn_latency_s; defaults ICI_STEP_LATENCY_S,
DCN_STEP_LATENCY_S in chip.py). A ring collective is a chain of dependent steps, each
waiting for its neighbour's chunk, so each pays one hop's latency on top of its bytes: over a
group laid out on the torus, one ring per physical dimension it spans, one after the other,
sum over those dimensions of (devices along it - 1) steps (16 devices of a 4 x 4 v5e: 6; 256
of a 16 x 16: 30), at most n - 1, and n - 1 when the devices' coordinates are unknown (CPU,
DCN); an all-reduce twice that (its reduce-scatter, then its all-gather); a
collective-permute one hop.
  ICI_STEP_LATENCY_S = 1 us: an order-of-magnitude estimate, not measured here. ICI links
    join torus neighbours directly and their latency is sub-microsecond; a ring step adds
    the DMA issue and the synchronisation flag the receiver waits on. (Collectives of small
    arrays are latency-bound, not bandwidth-bound: "How to Scale Your Model",
    jax-ml.github.io/scaling-book, "Sharded Matrices".) trainer/hardware.py carries the
    per-chip figure with its source and passes it in.
  DCN_STEP_LATENCY_S = 20 us: one message between hosts over the data-center network (host
    NIC, switch fabric, the megascale transfer's host round trip): tens of microseconds, an
    order-of-magnitude estimate, not measured here.
  Small collectives are latency-bound with these figures: a 16-device all-gather on a 4 x 4
  v5e pays 6 us however small, a 256-device one on a 16 x 16 30 us.
  A hardware table can set both per chip (Hardware(..., ici_latency_s=, dcn_latency_s=)).

Combination: overlap read from the compiled schedule.
  A scheduled module (`HloModule ..., is_scheduled=true`, what compiled.as_text() prints after
  XLA's latency-hiding scheduler ran: xla/service/latency_hiding_scheduler.cc) lists each
  computation's instructions in the order they execute. Every computation that runs on its
  own (ENTRY, loop bodies and conditions, branches) is replayed in that order once:
    * a compute stream: each instruction that runs on its own takes
        max(flops / (peak x matmul efficiency), hbm bytes / (HBM bandwidth x HBM efficiency))
      (the per-op roofline; with on_chip "compiler", at least the compiler's estimate for an
      op without a matmul, above), a while loop trip count x its body's replayed duration (+ the
      condition's), a call / conditional its callee's (branches averaged);
    * transfers beside it: an async collective is issued where it starts and must be
      complete where it is done: `*-start` / `*-done` pairs, `async-start` [/ async-update]
      / `async-done` around a wrapped collective, a megascale `send` / `send-done`, and
      TPU async-collective fusions (the fusions that carry one channel's collective: the
      first of them in the computation starts it, the last is its done, the ones between
      compute while it moves). At its done the stream waits until the transfer ends.
      A synchronous collective (plain all-gather, ..., or a channel carried by one fusion
      only) is issued and waited for at once: fully exposed.
    * Chains that reach into a loop (collectives.chain_homes). With tensor parallelism XLA
      writes a windowed-einsum loop (`windowed_dot_general_body_ag` / `_rs`) inside the
      layer body, and a TPU async-collective chain (one channel) is started by a fusion of
      the layer body before the loop, carried by the loop body's compute fusions (copies of
      the same channel, each holding the whole collective) and done by a fusion after the
      loop. That is one transfer per execution of the layer body, with the loop inside its
      window: it opens and closes in the outer computation only, its copies in the loop body
      are compute, and it counts the outer computation's executions, not the loop's trip
      count times (the rule: of the computations holding a channel's fusions, those run by
      another holder are not its homes). Checked on the 128B's widths, 2 layers, compiled
      for v5e-64 (fsdp 4 x tensor 16, sequence_parallel, full remat, flash,
      collective_fusion): 6 chains, each with 2 fusions in the layer body and the loop(s)
      between them. Read per iteration, each chain was re-issued in every iteration (trip
      count 4), and the loop body's plain collective-permutes queued behind it on the
      links: tensor all-gather 15.1 GB -> 5.7 GB per step, exposed comm 0.539 s -> 0.437 s,
      step 1.060 s -> 0.958 s (the 128B on v5e-256, fsdp 16 x tensor 16: 0.40 -> 0.49 of its
      published MFU, benchmarks/RESULTS.md).
      The permutes in those loop bodies were plain `collective-permute` there (synchronous in
      the schedule: the two directions one after the other, between the shard's dots), and
      such permutes stay fully exposed. That was the compiler planning an open mesh: on a
      slice compiled with its wraparound links (search/planning/topology.py TpuSlice.wrap) the same
      permutes are start/done pairs around the shard's matmul (the 128B on v5e-256: 0.75 ->
      1.00 of its published MFU).
    * Sharing the window. Each transfer occupies link resources while in flight, and
      transfers queue on them in issue (start) order, each taking its full time
      (bytes / bandwidth + hops x latency) once it begins:
        - a ring collective (all-gather, reduce-scatter, all-reduce, all-to-all) over ICI
          occupies every ICI link of the chip (its 2k links are all the links of the
          dimensions it spans): it begins when every ICI transfer issued before it ended;
        - a collective-permute over ICI occupies one direction of one ring: it begins when
          the ring collectives issued before it and the permutes with the same
          source-target pairs ended; permutes with different pairs (the two directions of
          a bidirectional collective matmul) run side by side;
        - DCN transfers queue on the chip's share of the host NICs, independently of ICI.
      So a single async collective of time T whose window holds work W is exposed
      max(0, T - W); two that overlap share the window one after the other; a transfer
      never delays the compute stream except at its done.
  exposed comm = the stream's waits, per computation, times its executions per step
  step time    = per-op roofline + exposed comm
  Each collective's share is CollectiveCost.exposed_s ("exposed_seconds" in the summary):
  the stalls at its done, which include waiting for the links earlier transfers still hold
  (so one collective's share can exceed its own time; their sum cannot exceed comm_s: some
  transfer is in flight during every stall).
  Checked on maxtext-v5e-16b compiled for v5e-256 (fsdp 256, batch 6 per chip, full remat,
  flash attention): the fsdp all-gathers are TPU async-collective chains, 87% hidden by the
  layer's matmuls (0.045 s of 0.334 s exposed); the per-layer weight-gradient all-reduces
  are synchronous in the schedule, 0.338 s fully exposed. The fixed fraction had hidden all
  0.81 s: predicted step 8.38 s -> 8.74 s, MFU 75.1% -> 72.0% (published: 61.1%), with the
  bytes and hop counts above.
  What this leaves out: HBM contention between a transfer and the compute it hides
  behind; a transfer issued before a loop and done after it overlaps the loop's duration
  but not its link use (nested computations are replayed with their own link queues: a
  windowed-einsum loop's permutes do not queue behind the chain that spans the loop);
  bidirectional rings sharing links with permutes on other torus dimensions.
  Fallback, HLO that is not scheduled (no `is_scheduled=true`: its instruction order is a
  topological order, not the execution order): the former fixed rule
      exposed comm = max(0, comm - OVERLAP_FRACTION x per-op roofline),  OVERLAP_FRACTION = 0.5
  and Roofline.overlap says "fixed_fraction".
  compute_s (= flops / sustained FLOP/s) and memory_s (= bytes / sustained bandwidth) are reported
  beside it.
Matmul efficiency (Hardware.matmul_efficiency, default 1). A chip's dense bf16 peak is not
  what its matmuls sustain: the FLOPs are priced at peak x the share of peak that a large,
  well-shaped bf16 matmul was measured to reach on that chip (trainer/hardware.py carries
  the figure and its source per chip: TPU v5e 92.3%, XLA's own 8192^3 matmul in the JAX
  Pallas matmul guide; TPU v6e 79.3%, the same matmul device-timed on one v6e; NVIDIA A100
  86.9%, H100/H200 80.3%, the "maximum achievable matmul FLOPS" measurements of
  stas00/ml-engineering). One figure per chip, the best measured
  shape, not fitted to any training run: smaller or oddly shaped matmuls run lower still, so
  the prediction stays a lower bound on step time and an upper bound on MFU. Simulated CPU
  devices keep 1: their peak is itself a measured matmul rate.
Attention efficiency (Hardware.attention_efficiency, default: the matmul efficiency). The Pallas
  splash-attention kernels run their S x S matmuls beside the softmax in one kernel, so their FLOPs
  are priced at the share of peak those kernels were measured to run at: TPU v6e 30.9%, from
  MaxText's own XProf profile on v6e-8 (jax's splash kernel, blocks 2048, fused backward, at batch
  3 x S 8192 x 32 heads of 128; two trainers running tokamax's faster variant at the same shape
  measured 39.6%), under half what XLA's large matmul sustains there (79.3%). TPU v5e: the chip's own
  per-kernel shares as the kernels ran inside the chip's profiled training steps (Hardware.attention_step_grid,
  trainer/hardware.py V5E_SPLASH_STEP_GRID; Hardware.step_grid_share) where a kernel's shape lies inside the steps'
  measured ones, else as measured alone (Hardware.attention_grid, V5E_SPLASH_GRID: by kernel, block, head dim 64 or
  128, query heads per K/V head, seq and batch x K/V heads; Hardware.grid_share; in the steps the same kernels took
  0.78-1.45x that) times the kind's in-step factor (Hardware.attention_in_step), else by kernel,
  block and seq (attention_rates), else 51.0% (fit to the half-a points of the project's chip). A kernel of
  a head dim d < 128 with no rows of its own runs at d / 128 of the head-dim-128 figure: its QK^T
  contracts over d and its PV writes d columns of a 128-wide MXU. cuDNN's flash
  attention on H100 / H200: 50.8%, cuDNN 9.19's own benchmark on H200 (BF16, causal, S 4096, head
  dim 128, the forward and backward kernels' device time). Chips with no measurement keep their
  matmul efficiency (trainer/hardware.py says so per chip).
HBM efficiency (Hardware.hbm_efficiency, default 1), the same for bytes: an op's HBM bytes are
  priced at the bandwidth x the share an XLA elementwise op was measured to sustain (TPU v5e
  80.3%: XLA's bf16 x * 2 over 16384^2 on one chip; TPU v6e 82.9%: XLA's copy of 32 MiB on one
  chip, Google's tpu-recipes microbenchmark; assumed for v4 and v5p, which have no measurement
  of their own; GPUs and simulated CPU devices keep 1). Checked on two other ops measured on the
  v5e: XLA's RMSNorm and softmax of (32768, 8192) bf16 come out 4.6%
  and 4.4% slower than measured.
Row gathers, scatters and ragged dots (indexed.py; TPU v5e only, the chip's own measurements): an op
  holding gathers or scatters takes at least rows x the measured seconds per row for its kind, row bytes
  and row count (a TPU scatter moves its rows one at a time: 27 ns a 2 KiB row, 5-9x its bytes' price in a
  MoE step); rows narrower than the narrowest measured (128 B) take its time, a row's floor. A ragged
  dot (the TPU's kernel, or its convolution over groups) runs at the measured share of peak of the
  nearest measured shape, forward or backward (0.48-0.70); the Pallas megablox kernels at theirs
  (0.59-0.93). Other chips: no figures, the roofline. What the rows add over
  their ops' roofline is in the step and its own line of the breakdown (Roofline.index_excess_s).
Lanes a matmul leaves empty (cost.lane_padding): a TPU layout lays an array's minor-most dimension along
  the 128 lanes of its tiles; a matmul whose contracting dimension, or whose output's feature dimension,
  lies there at a size under 128 (a head dim of 64 in a [.., heads, 64] operand laid out with 64 minor)
  runs at size / padded size of the matmul rate. On the v5e chip those projections ran 1.86-2.06x their
  unpadded roofline, the same projections with another minor dimension 0.91-1.02x.
DMAs between HBM and VMEM (dma.py, dma_overlap.py): with Hardware.dma_overlap (TPU v5e) a DMA costs the stream
  nothing at its start and, at its -done, what its bytes take beyond the HBM time the ops scheduled between leave
  idle (Roofline.dma_exposed_s; the chip's steps waited 0.23-1.09x of that); elsewhere each at its HBM bytes.
VPU time (vpu.py, Hardware.vpu_cycles): an op without a matmul takes at least the cycles of its vector work (per
  32-bit register its fused instructions fill, by kind; a tile smaller than a register, T(2,128), a register of
  its own) at the chip's clock. TPU v5e: fit over 44 profiled steps' 6,742 ops (sine / cosine 20.2 cycles a
  register: RoPE's tables, computed into VMEM, 55.6 us an execution on the chip, 6 ns by their bytes; a copy that
  lays another dimension along the lanes, or a reshape that re-tiles its operand, the transpose unit's work, 2.5
  cycles a register against 0.22 for other movement). What it adds over the bytes is its own line
  (Roofline.vpu_excess_s).
Splash kernels in the step (Hardware.attention_in_step): times its grid price a step's kernel of each kind takes
  where the steps' own rates do not reach (TPU v5e: dQ 1.044x, dK/dV 1.070x, forward 0.989x over the 41 profiled
  steps with splash attention; benchmarks/fit_vpu.py, fit_splash.py).
HBM reads and writes apart (Hardware.hbm_read_efficiency / hbm_write_efficiency, Hardware.hbm_seconds): where
  a chip measured them apart, an op's bytes read and written (cost.instr_read_write) are priced each at its
  own share of the bandwidth (TPU v5e: reads 0.911, writes 0.717, from the chip's reduction and scale; one
  share of 0.803 for every byte put its reductions 11-13% slow).
MFU stays against the nominal peak (the MFU convention):
    predicted MFU = model FLOPs per step / devices / predicted step time / peak
  (model FLOPs as in trainer/flops.py).
"""
from __future__ import annotations

from .chip import DCN_STEP_LATENCY_S, ICI_STEP_LATENCY_S, Hardware
from .collectives import CollectiveCost, DeviceLayout, collectives, device_coords, replica_groups, transfer_key
from .cost import (
    SPLASH_MATMULS,
    compiler_cycles,
    compiler_estimate,
    conv_flops,
    cudnn_fmha_flops,
    instr_bytes,
    instr_flops,
    op_seconds,
    op_work,
    splash_flops,
    uses_mxu,
)
from .hlo import (
    COLLECTIVES,
    DTYPE_BYTES,
    CallGraph,
    Computation,
    HloModule,
    Instr,
    call_graph,
    hbm_shape_bytes,
    parse_module,
    shape_bytes,
    shape_dims,
    trip_count,
)
from .model import OVERLAP_FRACTION, Roofline, StepWork, analyze, step_work
from .schedule import ScheduleReplay, events, exposed_by_schedule

__all__ = [
    "analyze", "Hardware", "Roofline", "CollectiveCost", "DeviceLayout", "parse_module", "call_graph",
    "collectives", "device_coords", "replica_groups", "instr_flops", "instr_bytes", "conv_flops", "splash_flops",
    "cudnn_fmha_flops",
    "shape_bytes", "hbm_shape_bytes", "shape_dims", "trip_count", "exposed_by_schedule", "events", "ScheduleReplay",
    "OVERLAP_FRACTION", "ICI_STEP_LATENCY_S", "DCN_STEP_LATENCY_S", "COLLECTIVES", "DTYPE_BYTES",
    "HloModule", "Computation", "Instr", "CallGraph", "op_seconds", "op_work", "transfer_key", "SPLASH_MATMULS",
    "compiler_cycles", "compiler_estimate", "uses_mxu",
    "StepWork", "step_work",
]

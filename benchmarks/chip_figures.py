"""The chip's own figures, measured (issue 41, section 2): what trainer/hardware.py assumes for a
chip, each measured on the chip by this one command.

Question: what are a chip's figures (matmul and splash rates, HBM efficiency, ...), measured on it?
Peer: the figures trainer/hardware.py assumes for that chip.

    python3 benchmarks/chip_figures.py --out $OUT/figures        # on the chip (~2.5 min, one process)
    python benchmarks/chip_figures.py --tiny --out /tmp/figures  # CPU: a reduced set, to test it

Sections (--sections, in this order; each stops starting cases past its own cap, counted from when its
cases are compiled, and the overall --budget-s; what it did not run is listed under "skipped"):
  matmul    bf16 matmuls [M, K] x [K, N] -> bf16: large squares, then the shapes of real steps: the MLP's
            up / down projections and their weight gradients (contracted over the tokens) for d 1024-4096
            and M = B x S 2048-16384, the attention projections (d x d, and d x d/4 for GQA's K/V), the
            unembedding [M, d] x [d, 32000] and its input gradient, and the per-head score matmuls of plain
            attention. Efficiency = 2 M K N / time / the chip's peak (trainer/hardware.py).
  splash    the Pallas splash-attention kernels (jax.experimental.pallas.ops.tpu.splash_attention, built as
            trainer/attention.py builds them, with a given block size), causal, forward and forward +
            backward, by sequence (1024-8192), heads (8, 16) of 128 and block (128, 512), batch 8192 / S
            rows. Two FLOP counts: the model's (causal at half, training = 3 x forward), and the kernels'
            as the roofline counts them (cost.SPLASH_MATMULS: 2 + 4 + 3 S x S matmuls over the causal
            blocks, (n + 1) / 2n of them for n = S / block), whose share of peak is what
            Hardware.attention_efficiency means; with each kernel's own device time where the trace has it.
  hbm       HBM efficiency by op kind: scale, add, a reduction (bf16 -> f32 sums), a transpose, a copy,
            converts bf16 <-> f32, an RMSNorm, a softmax; bytes = the op's operands + result, efficiency =
            bytes / time / the chip's HBM bandwidth (what Hardware.hbm_efficiency means).
  index     row gathers, scatters and scatter-adds (a MoE layer's token dispatch and combine: N rows of
            W elements moved by index into or out of a table), by N (8192-32768), W (256-4096), dtype
            (bf16, f32) and sorted or random indices; bytes = the rows moved twice (read and write) plus
            the indices. And jax.lax.ragged_dot (a dropless MoE layer's grouped matmul) forward and
            forward + backward at a MoE layer's shapes, FLOPs = the groups' work (every row once).
  host      host <-> device bandwidth: numpy -> device (device_put) and device -> numpy (device_get),
            device -> pinned_host and back (device_put to a memory-kind sharding, and a jitted copy with
            out_shardings in pinned_host: how host offload moves), 256 MiB and 1 GiB.
  overhead  the fixed cost of one step: a trivially small jitted step dispatched back to back (without and
            with donation, one array and a 64-leaf tree), and blocked each time; from the trace, the
            device time of such a program and the device's idle gap between two back-to-back programs.

Timing: "device_s" is the program's device time, read from a jax.profiler trace of the section (the
median of its executions on the device's "XLA Modules" line, search/planning/roofline/trace.py; on CPU the sum
of its ops' times per call); "wall_s" is host time over `reps` calls dispatched back to back with one
block_until_ready at the end, divided by reps. Efficiencies are computed from both where both exist
("efficiency" from device time, "efficiency_wall" from wall time).

Writes ONE file, <out>/chip_figures.json (rewritten after each section).
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

OUT_FILE = "chip_figures.json"
SECTIONS = ("matmul", "proj", "splash", "hbm", "index", "gmm", "host", "overhead")
# each section's cap in seconds (chip); the whole run also stops at --budget-s
CAPS = {"matmul": 35.0, "proj": 30.0, "splash": 50.0, "hbm": 15.0, "index": 30.0,
        "gmm": 40.0, "host": 20.0, "overhead": 10.0}
MiB = 2 ** 20


# ----------------------------------------------------------------------------- FLOPs and bytes (pure)

def matmul_flops(m: int, k: int, n: int, batch: int = 1) -> float:
    """FLOPs of a [batch] x [m, k] x [k, n] matmul: 2 m k n per batch."""
    return 2.0 * batch * m * k * n


def attention_model_flops(b: int, h: int, s: int, d: int, *, backward: bool, causal: bool = True) -> float:
    """Attention FLOPs by the project's MFU convention: QK^T and PV, 4 b h s^2 d, causal counted at
    half, training (forward + backward) = 3 x forward."""
    fwd = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
    return 3.0 * fwd if backward else fwd


def splash_kernel_matmuls(backward: bool) -> int:
    """S x S matmuls per head the splash kernels run, as the roofline counts them
    (cost.SPLASH_MATMULS: forward 2; the backward's dK/dV 4 and dQ 3)."""
    from paxsearch.search.planning.roofline.cost import SPLASH_MATMULS

    counts = dict(SPLASH_MATMULS)
    return counts["splash_mha_fwd"] + (counts["splash_mha_dkv"] + counts["splash_mha_dq"] if backward else 0)


def splash_kernel_flops(b: int, h: int, s: int, d: int, block: int, *, backward: bool | None = None,
                        matmuls: int | None = None) -> float:
    """The splash kernels' FLOPs as the roofline counts them (cost.splash_flops): `matmuls` S x S
    matmuls of 2 s^2 d per head, over the causal blocks the kernel computes, (n + 1) / 2n for
    n = s / block."""
    k = matmuls if matmuls is not None else splash_kernel_matmuls(bool(backward))
    n = s // block
    return k * 2.0 * s * s * d * b * h * (n + 1) / (2 * n)


def efficiency(work: float, seconds: float | None, peak: float) -> float | None:
    """work / seconds / peak (None without a time)."""
    return work / seconds / peak if seconds else None


# ----------------------------------------------------------------------------- timing

@dataclass
class Case:
    """One microbenchmark: a function of device arrays, compiled ahead of time under the name `id`
    (its module is jit_<id>), its arguments made on the device by `make` (a function of no arguments)."""

    id: str
    section: str
    fn: Callable
    shapes: tuple  # jax.ShapeDtypeStructs of fn's arguments
    params: dict
    flops: float = 0.0
    bytes: float = 0.0
    extra: dict = field(default_factory=dict)
    compiled: Any = None
    maker: Any = None
    module: str | None = None
    error: str | None = None


def _named(fn: Callable, name: str) -> Callable:
    def wrapped(*args):
        return fn(*args)
    wrapped.__name__ = wrapped.__qualname__ = name
    return wrapped


def _random_args(shapes: tuple, name: str) -> Callable:
    import jax

    def make():
        keys = jax.random.split(jax.random.key(0), max(len(shapes), 1))
        return tuple(jax.random.normal(keys[i], s.shape, s.dtype) for i, s in enumerate(shapes))
    return _named(make, f"make_{name}")


def compile_cases(cases: list[Case], log, threads: int = 8) -> None:
    """Compile every case (and its argument maker) ahead of time, in threads."""
    import jax

    from paxsearch.search.planning.roofline import trace as trace_lib

    def one(c: Case) -> None:
        try:
            c.compiled = jax.jit(_named(c.fn, c.id)).lower(*c.shapes).compile()
            c.maker = jax.jit(_random_args(c.shapes, c.id)).lower().compile()
            try:
                text = c.compiled.as_text()
                c.module = trace_lib.module_name(text) if text else None
                c.extra["entry_ops"] = _entry_ops(text) if text else None
            except Exception:  # noqa: BLE001 - the name is only for the trace
                c.module = None
            c.module = c.module or f"jit_{c.id}"
        except Exception as e:  # noqa: BLE001 - one case's failure must not stop the others
            c.error = f"compile: {type(e).__name__}: {str(e)[:400]}"

    t = time.perf_counter()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(one, cases))
    failed = [c for c in cases if c.compiled is None]
    if failed:
        log(f"  {len(failed)} failed to compile in threads ({failed[0].error}); once more, one at a time")
        for c in failed:
            c.error = None
            one(c)
    log(f"  compiled {sum(c.compiled is not None for c in cases)} of {len(cases)} in {time.perf_counter() - t:.1f} s")


def _entry_ops(text: str) -> list[str]:
    """The opcodes of what runs in the ENTRY computation (what the case measured)."""
    from paxsearch.search.planning.roofline.hlo import parse_module

    m = parse_module(text)
    skip = {"parameter", "tuple", "get-tuple-element", "bitcast", "constant"}
    return [i.opcode for i in m.computations[m.entry].instrs if i.opcode not in skip][:12]


class Tracer:
    """One jax.profiler trace around a section; rows of it once stopped (empty when tracing failed)."""

    def __init__(self, log):
        self.log, self.folder, self.rows, self.on = log, None, [], False

    def __enter__(self):
        import jax

        self.folder = tempfile.mkdtemp(prefix="chip-figures-")
        try:
            jax.profiler.start_trace(self.folder)
            self.on = True
        except Exception as e:  # noqa: BLE001 - wall times still come back
            self.log(f"  trace not started: {type(e).__name__}: {e}")
        return self

    def __exit__(self, *exc):
        import shutil

        import jax

        from paxsearch.search.planning.roofline import trace as trace_lib

        if self.on:
            try:
                jax.profiler.stop_trace()
                self.rows = trace_lib.read_xplane(trace_lib.newest_xplane(self.folder))
            except Exception as e:  # noqa: BLE001
                self.log(f"  trace not read: {type(e).__name__}: {e}")
        shutil.rmtree(self.folder, ignore_errors=True)
        return False


def device_seconds(rows: list, module: str | None, calls: int) -> dict:
    """The device time of one program's executions in a trace: the median (and min) of its XLA Modules
    events (TPU), else the sum of its ops' self times / `calls` (CPU)."""
    from paxsearch.search.planning.roofline import trace as trace_lib

    if not rows or module is None:
        return {"device_s": None}
    runs = trace_lib.module_runs(rows, module)
    if runs:
        durs = [r.duration_ns * 1e-9 for r in runs]
        steady = durs[1:] if len(durs) > 2 else durs  # the first is the warm-up call
        return {"device_s": statistics.median(steady), "device_min_s": min(steady), "device_runs": len(durs),
                "device_source": "XLA Modules"}
    totals = trace_lib.op_totals(rows, module)
    if totals:
        return {"device_s": sum(t.self_ns for t in totals.values()) * 1e-9 / max(calls, 1), "device_runs": calls,
                "device_source": "host op events / calls"}
    return {"device_s": None}


def run_cases(cases: list[Case], log, deadline: float, target_s: float, min_reps: int, max_reps: int,
              peak: float, bandwidth: float) -> tuple[list[dict], list[str], list[str]]:
    """Run compiled cases in one trace: a warm call, one timed call, then reps back to back (reps so
    that they take about target_s); (results, the ids skipped for time, the programs the trace saw)."""
    import jax

    done: list[tuple[Case, dict]] = []
    skipped: list[str] = []
    with Tracer(log) as tracer:
        for c in cases:
            if c.compiled is None:
                done.append((c, {"error": c.error or "not compiled"}))
                continue
            if time.perf_counter() > deadline:
                skipped.append(c.id)
                continue
            try:
                args = c.maker()
                jax.block_until_ready(c.compiled(*args))
                t = time.perf_counter()
                jax.block_until_ready(c.compiled(*args))
                one = time.perf_counter() - t
                reps = int(min(max_reps, max(min_reps, math.ceil(target_s / max(one, 1e-7)))))
                t = time.perf_counter()
                out = None
                for _ in range(reps):
                    out = c.compiled(*args)
                jax.block_until_ready(out)
                wall = (time.perf_counter() - t) / reps
                del args, out
                done.append((c, {"reps": reps, "wall_s": wall, "calls": reps + 2}))
            except Exception as e:  # noqa: BLE001
                done.append((c, {"error": f"run: {type(e).__name__}: {str(e)[:400]}"}))
    results = []
    for c, r in done:
        row = {"id": c.id, **c.params, "flops": c.flops or None, "bytes": c.bytes or None, **r}
        if "wall_s" in r:
            row.update(device_seconds(tracer.rows, c.module, r["calls"]))
            dev = row.get("device_s")
            if c.flops:
                row["tflops"] = c.flops / dev / 1e12 if dev else None
                row["efficiency"] = efficiency(c.flops, dev, peak)
                row["efficiency_wall"] = efficiency(c.flops, r["wall_s"], peak)
            if c.bytes:
                row["gb_per_s"] = c.bytes / dev / 1e9 if dev else None
                row["efficiency"] = efficiency(c.bytes, dev, bandwidth)
                row["efficiency_wall"] = efficiency(c.bytes, r["wall_s"], bandwidth)
            _kernels(row, c, tracer.rows, r["calls"], peak)
        row.update({k: v for k, v in c.extra.items() if k not in ("kernel_shape",)})
        results.append(row)
        log("  " + _line(row))
    from paxsearch.search.planning.roofline import trace as trace_lib

    seen = sorted({trace_lib.base_module_name(r.name) for r in trace_lib.module_runs(tracer.rows)})
    return results, skipped, seen[:80]


def _kernels(row: dict, c: Case, rows: list, calls: int, peak: float) -> None:
    """Per splash kernel: its device time per call and its share of peak as the roofline counts it."""
    shape = c.extra.get("kernel_shape")
    if not shape or not rows or c.module is None:
        return
    from paxsearch.search.planning.roofline import trace as trace_lib
    from paxsearch.search.planning.roofline.cost import SPLASH_MATMULS

    totals = trace_lib.op_totals(rows, c.module)
    kernels = {}
    for kernel, matmuls in SPLASH_MATMULS:
        ns = sum(t.self_ns for name, t in totals.items() if kernel in name)
        if ns:
            s = ns * 1e-9 / max(calls, 1)
            kernels[kernel] = {"device_s": s, "efficiency": efficiency(
                splash_kernel_flops(*shape, matmuls=matmuls), s, peak)}
    row["kernels"] = kernels


def _line(row: dict) -> str:
    if "error" in row:
        return f"{row['id']}: {row['error'][:200]}"
    dev, eff = row.get("device_s"), row.get("efficiency")
    return (f"{row['id']}: device {dev * 1e6 if dev else float('nan'):.1f} us, wall {row['wall_s'] * 1e6:.1f} us "
            f"x{row['reps']}, efficiency {eff if eff is not None else float('nan'):.3f} "
            f"(wall {row.get('efficiency_wall') or float('nan'):.3f})")


# ----------------------------------------------------------------------------- sections

def matmul_cases(tiny: bool) -> list[Case]:
    import jax
    import jax.numpy as jnp

    bf16 = jnp.bfloat16
    cases: list[Case] = []

    def mm(name: str, m: int, k: int, n: int, kind: str) -> None:
        shapes = (jax.ShapeDtypeStruct((m, k), bf16), jax.ShapeDtypeStruct((k, n), bf16))
        cases.append(Case(f"mm_{name}_{m}x{k}x{n}", "matmul", lambda a, b: a @ b, shapes,
                          dict(kind=kind, m=m, k=k, n=n), flops=matmul_flops(m, k, n)))

    def wgrad(m: int, d: int, f: int) -> None:  # x^T dy: [m, d], [m, f] -> [d, f], contracted over the tokens
        shapes = (jax.ShapeDtypeStruct((m, d), bf16), jax.ShapeDtypeStruct((m, f), bf16))
        fn = lambda x, dy: jax.lax.dot_general(x, dy, (((0,), (0,)), ((), ())))  # noqa: E731
        cases.append(Case(f"mm_wgrad_{d}x{m}x{f}", "matmul", fn, shapes,
                          dict(kind="mlp weight gradient (contract tokens)", m=d, k=m, n=f),
                          flops=matmul_flops(d, m, f)))

    def heads(bh: int, s: int, d: int) -> None:  # plain attention's scores and PV per head
        qk = (jax.ShapeDtypeStruct((bh, s, d), bf16), jax.ShapeDtypeStruct((bh, d, s), bf16))
        pv = (jax.ShapeDtypeStruct((bh, s, s), bf16), jax.ShapeDtypeStruct((bh, s, d), bf16))
        bmm = lambda a, b: jnp.einsum("bij,bjk->bik", a, b)  # noqa: E731
        cases.append(Case(f"bmm_qk_{bh}x{s}x{d}x{s}", "matmul", bmm, qk,
                          dict(kind="attention scores per head", batch=bh, m=s, k=d, n=s),
                          flops=matmul_flops(s, d, s, bh)))
        cases.append(Case(f"bmm_pv_{bh}x{s}x{s}x{d}", "matmul", bmm, pv,
                          dict(kind="attention PV per head", batch=bh, m=s, k=s, n=d),
                          flops=matmul_flops(s, s, d, bh)))

    if tiny:
        mm("square", 256, 256, 256, "square")
        mm("up", 128, 64, 256, "mlp up")
        wgrad(128, 64, 256)
        mm("vocab", 128, 64, 512, "unembedding")
        heads(2, 128, 32)
        return cases
    for s in (8192, 4096, 2048, 1024):
        mm("square", s, s, s, "square")
    for d in (1024, 2048, 4096):
        for m in (2048, 8192, 16384):
            mm("up", m, d, 4 * d, "mlp up [M, d] x [d, 4d]")
            mm("down", m, 4 * d, d, "mlp down [M, 4d] x [4d, d]")
            wgrad(m, d, 4 * d)
        mm("qo", 8192, d, d, "attention q / out projection [M, d] x [d, d]")
        mm("kv", 8192, d, d // 4, "GQA k / v projection [M, d] x [d, d/4]")
        mm("vocab", 8192, d, 32000, "unembedding [M, d] x [d, 32000]")
    mm("vocabgrad", 8192, 32000, 2048, "unembedding input gradient [M, 32000] x [32000, d]")
    heads(16, 2048, 128)
    return cases


PROJ_HEAD_DIMS = (64, 128)


def projection_cases(tiny: bool, head_dims: tuple[int, ...] = PROJ_HEAD_DIMS, tokens: int = 8192,
                     d_models: tuple[int, ...] = (768, 1536), heads: int = 12) -> list[Case]:
    """The attention projections as the trainer writes them, per head dim: q [tokens, d_model] x [d_model, heads,
    head dim] -> [tokens, heads, head dim] and out [tokens, heads, head dim] x [heads, head dim, d_model], each
    forward and with its backward (both gradients), beside the same FLOPs as one plain [tokens, d_model] x
    [d_model, heads x head dim] matmul. At a head dim below the 128 lanes of a TPU tile the [.., heads, head dim]
    arrays are laid out padded (T(8,128): 64 takes 128 lanes)."""
    import jax
    import jax.numpy as jnp

    bf16 = jnp.bfloat16
    cases: list[Case] = []
    for d_model in ((128,) if tiny else d_models):
        for k in ((32,) if tiny else head_dims):
            t, h = (256 if tiny else tokens), (2 if tiny else heads)
            x = jax.ShapeDtypeStruct((t, d_model), bf16)
            a = jax.ShapeDtypeStruct((t, h, k), bf16)
            wq = jax.ShapeDtypeStruct((d_model, h, k), bf16)
            wo = jax.ShapeDtypeStruct((h, k, d_model), bf16)
            flat = jax.ShapeDtypeStruct((d_model, h * k), bf16)
            work = matmul_flops(t, d_model, h * k)
            for name, fn, shapes in (("q", lambda x_, w: jnp.einsum("td,dhk->thk", x_, w), (x, wq)),
                                     ("out", lambda a_, w: jnp.einsum("thk,hkd->td", a_, w), (a, wo)),
                                     ("flat", lambda x_, w: x_ @ w, (x, flat))):
                def both(p, q, fn=fn):
                    out, vjp = jax.vjp(fn, p, q)
                    return vjp(out)

                params = dict(kind=f"projection {name}", tokens=t, d_model=d_model, heads=h, head_dim=k)
                cases.append(Case(f"proj_{name}_fwd_t{t}_d{d_model}_h{h}_k{k}", "proj", fn, shapes,
                                  dict(pass_="fwd", **params), flops=work))
                cases.append(Case(f"proj_{name}_fwd_bwd_t{t}_d{d_model}_h{h}_k{k}", "proj", both, shapes,
                                  dict(pass_="fwd_bwd", **params), flops=3 * work))
    return cases


def splash_kernel(s: int, h: int, block: int, interpret: bool):
    """The splash kernel as trainer/attention.py _splash_kernel builds it (causal, every block size =
    `block`, one head shard, one query shard), for `h` heads over `s` tokens."""
    from jax.experimental.pallas.ops.tpu import splash_attention as sa

    sizes = sa.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                          block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
    mask = sa.MultiHeadMask([sa.CausalMask((s, s))] * h)
    return sa.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1, interpret=interpret)


def splash_cases(tiny: bool, interpret: bool, tokens: int = 8192, seqs: tuple[int, ...] = (1024, 2048, 4096, 8192),
                 head_dims: tuple[int, ...] = (128,),
                 blocks: tuple[int, ...] = (512, 128), heads: tuple[int, ...] = (8, 16),
                 kv_heads: tuple[int, ...] = (0,)) -> list[Case]:
    """Splash cases over head dims, seqs, query heads, K/V heads (0: as many as the query heads, MHA;
    fewer: grouped-query attention, as the trainer calls the kernel with GQA) and block sizes."""
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu import splash_attention as sa

    grid = [(256, 2, 128, d, kv) for d in head_dims for kv in kv_heads if kv in (0, 1)] if tiny else [
        (s, h, blk, d, kv) for d in head_dims for s in seqs for h in heads for kv in kv_heads
        for blk in blocks if not kv or (kv < h and h % kv == 0)]
    cases: list[Case] = []
    for s, h, blk, d, kv in grid:
        b = max(1, (256 if tiny else tokens) // s)
        kernel = splash_kernel(s, h, blk, interpret)

        def fwd(q, k, v, kernel=kernel, b=b, s=s):
            seg = jnp.ones((b, s), jnp.int32)
            return jax.vmap(lambda q1, k1, v1, sg: kernel(q1, k1, v1, segment_ids=sa.SegmentIds(sg, sg)))(q, k, v, seg)

        def fwd_bwd(q, k, v, do, fwd=fwd):
            _, vjp = jax.vjp(fwd, q, k, v)
            return vjp(do)

        shape = jax.ShapeDtypeStruct((b, h, s, d), jnp.bfloat16)
        kv_shape = jax.ShapeDtypeStruct((b, kv or h, s, d), jnp.bfloat16)
        params = dict(batch=b, heads=h, kv_heads=kv or h, seq=s, head_dim=d, block=blk, causal=True)
        for backward, fn in ((False, fwd), (True, fwd_bwd)):
            kind = "fwd_bwd" if backward else "fwd"
            name = (f"splash_{kind}_s{s}_h{h}_b{blk}" + (f"_d{d}" if d != 128 else "")
                    + (f"_kv{kv}" if kv and kv != h else ""))
            shapes = (shape, kv_shape, kv_shape) + ((shape,) if backward else ())
            cases.append(Case(name, "splash", fn, shapes,
                              dict(pass_=kind, **params), flops=attention_model_flops(b, h, s, d, backward=backward),
                              extra={"kernel_flops": splash_kernel_flops(b, h, s, d, blk, backward=backward),
                                     "kernel_shape": (b, h, s, d, blk)}))
    return cases


SPLASH_GRID_RECORDS = tuple(f"chip_figures_v5e_2026-12-07{run}.json" for run in (
    "", "_run2", "_run3_splash_gqa", "_run3_splash32k", "_run3_splash_grid1", "_run3_splash_grid2",
    "_run3_splash_grid3", "_run4_splash_g3"))


def splash_group(heads: int, kv_heads: int) -> int:
    """The query heads per K/V head a splash measurement is filed under: 3 and more as measured, 1 (MHA)
    and 2 together as 2 (the chip ran them at the same rates for the same batch x K/V heads)."""
    return max(2, heads // max(kv_heads, 1))


def splash_grid(cases) -> dict[tuple[str, int, int, int, int, int], float]:
    """{(kernel, block, head dim, group, seq, batch x K/V heads): share of peak} from splash cases of
    chip_figures records: each kernel's share (its FLOPs as the roofline counts them over its device time),
    the forward's forward-only and forward + backward runs (and repeated cases) averaged, to 3 decimals."""
    runs: dict[tuple, list[float]] = {}
    for c in cases:
        kv = c.get("kv_heads") or c["heads"]
        for kernel, k in (c.get("kernels") or {}).items():
            key = (kernel, c["block"], c["head_dim"], splash_group(c["heads"], kv), c["seq"], c["batch"] * kv)
            runs.setdefault(key, []).append(k["efficiency"])
    return {key: round(sum(v) / len(v), 3) for key, v in sorted(runs.items())}


def hbm_cases(tiny: bool) -> list[Case]:
    import jax
    import jax.numpy as jnp

    bf16, f32 = jnp.bfloat16, jnp.float32
    cases: list[Case] = []
    for mib in ((4,) if tiny else (32, 256)):
        n = mib * MiB // 2  # bf16 elements of the input
        cols = 8192 if n % 8192 == 0 and n >= 8192 * 8 else 512
        rows = n // cols
        x2 = jax.ShapeDtypeStruct((rows, cols), bf16)
        xf = jax.ShapeDtypeStruct((rows, cols), f32)
        side = 1 << (int(math.log2(n)) // 2)
        xt = jax.ShapeDtypeStruct((side, n // side), bf16)
        smax_cols = 2048 if n % 2048 == 0 else cols
        xs = jax.ShapeDtypeStruct((n // smax_cols, smax_cols), bf16)

        def rms(x):
            xf_ = x.astype(f32)
            return (xf_ * jax.lax.rsqrt(jnp.mean(xf_ * xf_, -1, keepdims=True) + 1e-6)).astype(x.dtype)

        ops = [
            ("scale", lambda x: x * 2, (x2,), 4 * n),
            ("add", lambda x, y: x + y, (x2, x2), 6 * n),
            ("reduce_sum_to_f32", lambda x: jnp.sum(x.astype(f32), axis=-1), (x2,), 2 * n + 4 * rows),
            ("transpose", lambda x: x.T, (xt,), 4 * n),
            ("copy", lambda x: jnp.copy(x), (x2,), 4 * n),
            ("convert_bf16_to_f32", lambda x: x.astype(f32), (x2,), 6 * n),
            ("convert_f32_to_bf16", lambda x: x.astype(bf16), (xf,), 6 * n),
            ("rmsnorm", rms, (x2,), 4 * n),
            ("softmax", lambda x: jax.nn.softmax(x, axis=-1), (xs,), 4 * n),
        ]
        for name, fn, shapes, nbytes in ops:
            cases.append(Case(f"hbm_{name}_{mib}mib", "hbm", fn, shapes,
                              dict(kind=name, mib=mib, shapes=[list(s.shape) for s in shapes],
                                   dtypes=[str(s.dtype) for s in shapes]), bytes=float(nbytes)))
    return cases


def index_cases(tiny: bool, rows: tuple[int, ...] = (8192, 32768), widths: tuple[int, ...] = (256, 1024, 4096),
                ragged: bool = True) -> list[Case]:
    """Row gathers, scatters and scatter-adds (trainer/moe.py's dispatch and combine) of `rows` rows of
    `widths` elements (bf16 and f32; random indices at width 1024), and ragged dots (`ragged`)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    cases: list[Case] = []
    grid = [(512, 64, "bfloat16", True)] if tiny else [
        (n, w, dt, srt) for n in rows for w in widths for dt in ("bfloat16", "float32")
        for srt in (True, False) if srt or (w == 1024 and dt == "bfloat16")]
    for n, w, dt, srt in grid:
        dtype = jnp.dtype(dt)
        rows = n + n // 4  # the table: a capacity buffer 1.25 x the routes
        table = jax.ShapeDtypeStruct((rows, w), dtype)
        upd = jax.ShapeDtypeStruct((n, w), dtype)
        rng = np.random.default_rng(0)
        perm = rng.permutation(rows)[:n].astype(np.int32)
        idx = np.sort(perm) if srt else perm  # distinct rows (a dispatch), sorted or not
        dup = np.sort(rng.integers(0, n // 2, n).astype(np.int32)) if srt else rng.integers(0, n // 2, n).astype(
            np.int32)  # two routes per token on average (a combine)

        def gather(t, idx=idx, srt=srt):
            return jnp.take(t, jnp.asarray(idx), axis=0, indices_are_sorted=srt, unique_indices=True, mode="clip")

        def scatter(t, u, idx=idx, srt=srt):
            return t.at[jnp.asarray(idx)].set(u, indices_are_sorted=srt, unique_indices=True, mode="drop")

        def scatter_add(t, u, dup=dup, srt=srt, n=n):
            return t[: n // 2].at[jnp.asarray(dup)].add(u, indices_are_sorted=srt, mode="drop")

        moved = float(n * w * dtype.itemsize)
        tag = f"n{n}_w{w}_{'bf16' if dt == 'bfloat16' else 'f32'}" + ("" if srt else "_random")
        params = dict(rows=n, width=w, dtype=dt, sorted=srt, row_bytes=w * dtype.itemsize)
        cases.append(Case(f"index_gather_{tag}", "index", gather, (table,), dict(kind="gather", **params),
                          bytes=2 * moved + 4 * n))
        cases.append(Case(f"index_scatter_{tag}", "index", scatter, (table, upd), dict(kind="scatter", **params),
                          bytes=2 * moved + 4 * n))
        cases.append(Case(f"index_scatter_add_{tag}", "index", scatter_add, (table, upd),
                          dict(kind="scatter_add", **params), bytes=3 * moved + 4 * n))
    # ragged dots: routes x d_model against G experts' [d_model, width], groups of equal size
    for n, d, f, g in ([(512, 64, 128, 4)] if tiny else [(32768, 1024, 1408, 8), (16384, 2048, 1408, 8),
                                                         (32768, 1024, 2816, 16)] if ragged else []):
        sizes = jnp.full((g,), n // g, jnp.int32)
        lhs = jax.ShapeDtypeStruct((n, d), jnp.bfloat16)
        rhs = jax.ShapeDtypeStruct((g, d, f), jnp.bfloat16)

        def rd(x, wt, sizes=sizes):
            return jax.lax.ragged_dot(x, wt, sizes)

        def rd_bwd(x, wt, rd=rd):
            out, vjp = jax.vjp(rd, x, wt)
            return vjp(out)

        work = matmul_flops(n, d, f)
        params = dict(kind="ragged_dot", rows=n, d=d, f=f, groups=g)
        cases.append(Case(f"index_ragged_dot_fwd_n{n}_d{d}_f{f}_g{g}", "index", rd, (lhs, rhs),
                          dict(pass_="fwd", **params), flops=work))
        cases.append(Case(f"index_ragged_dot_fwd_bwd_n{n}_d{d}_f{f}_g{g}", "index", rd_bwd, (lhs, rhs),
                          dict(pass_="fwd_bwd", **params), flops=3 * work))
    return cases


GMM_SHAPES = ((32768, 1024, 1408, 8), (16384, 4096, 14336, 8), (49152, 7168, 2048, 32))
GMM_TILES = ((512, 1024, 1024), (128, 128, 128))


def gmm_cases(tiny: bool, interpret: bool, shapes: tuple = GMM_SHAPES, tiles: tuple = GMM_TILES) -> list[Case]:
    """Grouped matmuls of routes x d_model against G experts' [d_model, width] (groups of equal size), forward
    and forward + backward, two ways: jax.lax.ragged_dot (what the TPU compiler makes of it) and the Pallas
    megablox kernel (jax.experimental.pallas.ops.tpu.megablox.ops.gmm, MaxText's `megablox=True`) at each
    tiling (tm, tk, tn; MaxText's default 512, 1024, 1024). FLOPs: 2 x rows x d x f forward, 3 x that with
    the backward (the routed work only, as the roofline counts a grouped matmul)."""
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu.megablox import ops as mblx

    cases: list[Case] = []
    for n, d, f, g in ([(256, 128, 128, 2)] if tiny else shapes):
        sizes = jnp.full((g,), n // g, jnp.int32)
        lhs = jax.ShapeDtypeStruct((n, d), jnp.bfloat16)
        rhs = jax.ShapeDtypeStruct((g, d, f), jnp.bfloat16)
        work = matmul_flops(n, d, f)
        ways: list[tuple[str, Callable, dict]] = [("ragged_dot", lambda x, w, sizes=sizes: jax.lax.ragged_dot(
            x, w, sizes), {})]
        for tm, tk, tn in ([(128, 128, 128)] if tiny else tiles):
            tiling = (min(tm, n), min(tk, d), min(tn, f))
            ways.append((f"megablox_t{tm}x{tk}x{tn}", lambda x, w, sizes=sizes, tiling=tiling: mblx.gmm(
                x, w, sizes, jnp.bfloat16, tiling, None, None, False, interpret), dict(tiling=list(tiling))))
        for way, fn, extra in ways:
            def fwd_bwd(x, w, fn=fn):
                out, vjp = jax.vjp(fn, x, w)
                return vjp(out)

            params = dict(kind=way.split("_t")[0], rows=n, d=d, f=f, groups=g, **extra)
            tag = f"{way}_n{n}_d{d}_f{f}_g{g}"
            cases.append(Case(f"gmm_fwd_{tag}", "gmm", fn, (lhs, rhs), dict(pass_="fwd", **params), flops=work))
            cases.append(Case(f"gmm_fwd_bwd_{tag}", "gmm", fwd_bwd, (lhs, rhs), dict(pass_="fwd_bwd", **params),
                              flops=3 * work))
    return cases


def host_section(tiny: bool, log, deadline: float) -> dict:
    """Host <-> device bandwidth, wall-timed (a transfer is not one device program): best and median
    of 3 for each size and path."""
    import jax

    dev = jax.devices()[0]
    kinds = [m.kind for m in dev.addressable_memories()] if hasattr(dev, "addressable_memories") else []
    out: dict = {"memory_kinds": kinds, "cases": [], "skipped": []}
    for mib in ((8, 32) if tiny else (256, 1024)):
        _host_size(mib, dev, kinds, out, log, deadline)
    out["note"] = ("wall time of one transfer, blocked (device -> numpy and -> pinned_host start from a fresh "
                   "device array each time); bytes / time, one direction; jit_* a jitted y * 1 whose output "
                   "(out) or input (in) lives in pinned_host, the way offloaded tensors move inside a step")
    return out


def _host_size(mib: int, dev, kinds: list[str], out: dict, log, deadline: float, reps: int = 3) -> None:
    import jax
    import numpy as np
    from jax.sharding import SingleDeviceSharding

    n = mib * MiB // 4  # float32 elements
    pinned = SingleDeviceSharding(dev, memory_kind="pinned_host") if "pinned_host" in kinds else None
    on_dev = SingleDeviceSharding(dev, memory_kind="device") if "device" in kinds else SingleDeviceSharding(dev)
    bump = jax.jit(lambda y: y + 1)

    def timed(name: str, fn: Callable[..., Any], prepare: Callable[[], Any] | None = None) -> None:
        if time.perf_counter() > deadline:
            out["skipped"].append(f"{name}_{mib}mib")
            return
        row: dict = {"id": f"{name}_{mib}mib", "path": name, "mib": mib}
        try:
            times = []
            for _ in range(reps + 1):
                arg = prepare() if prepare else None
                t = time.perf_counter()
                res = fn() if prepare is None else fn(arg)
                if not isinstance(res, np.ndarray):
                    jax.block_until_ready(res)
                times.append(time.perf_counter() - t)
                del res, arg
            steady = times[1:]
            best, med = min(steady), statistics.median(steady)
            row.update(bytes=n * 4, reps=reps, best_s=best, median_s=med, gb_per_s_best=n * 4 / best / 1e9,
                       gb_per_s_median=n * 4 / med / 1e9)
            log(f"  {row['id']}: {row['gb_per_s_best']:.2f} GB/s best, {row['gb_per_s_median']:.2f} median")
        except Exception as e:  # noqa: BLE001
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            log(f"  {row['id']}: {row['error']}")
        out["cases"].append(row)

    host = np.ones(n, np.float32)
    timed("numpy_to_device", lambda: jax.device_put(host, dev))
    x = jax.block_until_ready(jax.device_put(host, dev))
    timed("device_to_numpy", lambda y: np.asarray(y), prepare=lambda: jax.block_until_ready(bump(x)))
    if pinned is None:
        return
    timed("device_to_pinned_host", lambda y: jax.device_put(y, pinned), prepare=lambda: jax.block_until_ready(bump(x)))
    try:
        xh = jax.block_until_ready(jax.device_put(x, pinned))
        to_host = jax.jit(lambda y: y * 1, out_shardings=pinned)
        to_dev = jax.jit(lambda y: y * 1, out_shardings=on_dev)
        jax.block_until_ready((to_host(x), to_dev(xh)))
    except Exception as e:  # noqa: BLE001
        out["cases"].append({"id": f"pinned_{mib}mib", "error": f"{type(e).__name__}: {str(e)[:300]}"})
        log(f"  pinned_host {mib} MiB: {type(e).__name__}: {str(e)[:200]}")
        return
    timed("pinned_host_to_device", lambda: jax.device_put(xh, on_dev))
    timed("jit_out_pinned_host", lambda: to_host(x))
    timed("jit_in_pinned_host", lambda: to_dev(xh))


def overhead_section(tiny: bool, log, deadline: float) -> dict:
    """The fixed cost of dispatching a step: trivially small programs back to back."""
    import jax
    import jax.numpy as jnp

    out: dict = {"cases": []}
    n = 200 if tiny else 1000
    x = jnp.zeros((8,), jnp.float32)
    step = jax.jit(_named(lambda a: a + 1, "tiny_step"))
    donated = jax.jit(_named(lambda a: a + 1, "tiny_step_donated"), donate_argnums=0)
    tree_step = jax.jit(_named(lambda t: jax.tree.map(lambda a: a + 1, t), "tree64_step"), donate_argnums=0)
    tr = tree_step({f"w{i}": jnp.zeros((256,), jnp.float32) for i in range(64)})  # its leaves are donated from here on
    jax.block_until_ready((step(x), tr))
    jax.block_until_ready(donated(jnp.zeros((8,), jnp.float32)))

    def record(name: str, seconds: float, calls: int, note: str) -> None:
        out["cases"].append({"id": name, "per_call_s": seconds / calls, "calls": calls, "note": note})
        log(f"  {name}: {seconds / calls * 1e6:.1f} us per call ({calls} calls)")

    t = time.perf_counter()
    r = None
    for _ in range(n):
        r = step(x)
    jax.block_until_ready(r)
    record("back_to_back", time.perf_counter() - t, n, "x + 1 on f32[8], dispatched back to back, one block at the end")
    t = time.perf_counter()
    for _ in range(n // 4):
        jax.block_until_ready(step(x))
    record("blocked_each", time.perf_counter() - t, n // 4, "the same, blocked after every call (round trip)")
    y = jnp.zeros((8,), jnp.float32)
    t = time.perf_counter()
    for _ in range(n):
        y = donated(y)
    jax.block_until_ready(y)
    record("donated_back_to_back", time.perf_counter() - t, n, "x + 1 with the input donated, chained")
    t = time.perf_counter()
    for _ in range(n // 2):
        tr = tree_step(tr)
    jax.block_until_ready(tr)
    record("tree64_donated_back_to_back", time.perf_counter() - t, n // 2,
           "a 64-leaf tree of f32[256], each + 1, donated and chained (a train state's buffers)")
    if time.perf_counter() < deadline:
        with Tracer(log) as tracer:
            r = None
            for _ in range(100):
                r = step(x)
            jax.block_until_ready(r)
            for _ in range(100):
                tr = tree_step(tr)
            jax.block_until_ready(tr)
        out["device"] = {name: _device_gaps(tracer.rows, name) for name in ("jit_tiny_step", "jit_tree64_step")}
        log(f"  device: {out['device']}")
    return out


def _device_gaps(rows: list, module: str) -> dict:
    """A program's device time and the device's idle gap between its consecutive executions."""
    from paxsearch.search.planning.roofline import trace as trace_lib

    runs = trace_lib.module_runs(rows, module)
    if not runs:
        return {"device_runs": 0}
    gaps = [b.start_ns - a.end_ns for a, b in zip(runs, runs[1:], strict=False)]
    return {"device_runs": len(runs), "device_s_median": statistics.median(r.duration_ns for r in runs) * 1e-9,
            "gap_s_median": statistics.median(gaps) * 1e-9 if gaps else None,
            "period_s_median": (statistics.median(b.start_ns - a.start_ns for a, b in zip(runs, runs[1:], strict=False))
                                * 1e-9 if gaps else None)}


# ----------------------------------------------------------------------------- main

def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def _dims(text: str) -> tuple[tuple[int, ...], ...]:
    """"1x2x3,4x5x6" -> ((1, 2, 3), (4, 5, 6))."""
    return tuple(tuple(int(v) for v in part.split("x")) for part in text.split(",") if part.strip())


def figures_of(devices) -> tuple[float, float, str]:
    """(peak FLOP/s, HBM bytes/s, hardware name) of the device: trainer/hardware.py's (a CPU's measured)."""
    from paxsearch.search.planning.predict import hardware_for

    hw = hardware_for(devices)
    return hw.peak_flops, hw.hbm_bandwidth, hw.name


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="folder for chip_figures.json")
    ap.add_argument("--tiny", action="store_true", help="a reduced set (CPU test)")
    ap.add_argument("--sections", default=",".join(SECTIONS))
    ap.add_argument("--budget-s", type=float, default=135.0, help="start nothing after this many seconds")
    ap.add_argument("--target-s", type=float, default=0.04, help="device time per case to aim the reps at")
    ap.add_argument("--splash-head-dims", default="128", help="splash: head dims, comma-separated (e.g. 64,128)")
    ap.add_argument("--splash-blocks", default="512,128", help="splash: block sizes, comma-separated")
    ap.add_argument("--splash-heads", default="8,16", help="splash: query heads, comma-separated")
    ap.add_argument("--splash-tokens", type=int, default=8192, help="splash: batch x seq of each case")
    ap.add_argument("--splash-seqs", default="1024,2048,4096,8192", help="splash: sequence lengths, comma-separated")
    ap.add_argument("--splash-kv-heads", default="0",
                    help="splash: K/V heads, comma-separated (0: as many as the query heads; fewer: GQA)")
    ap.add_argument("--index-rows", default="8192,32768", help="index: rows moved, comma-separated")
    ap.add_argument("--index-widths", default="256,1024,4096", help="index: row widths (elements), comma-separated")
    ap.add_argument("--index-no-ragged", action="store_true", help="index: no ragged-dot cases")
    ap.add_argument("--gmm-shapes", default=",".join("x".join(map(str, s)) for s in GMM_SHAPES),
                    help="gmm: rows x d_model x width x groups, comma-separated")
    ap.add_argument("--gmm-tiles", default=",".join("x".join(map(str, t)) for t in GMM_TILES),
                    help="gmm: megablox tilings tm x tk x tn, comma-separated")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[chip_figures {time.perf_counter() - t_start:6.1f}s] {msg}", flush=True)

    import json

    import jax

    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, OUT_FILE)
    devices = jax.devices()[:1]
    peak, bandwidth, hw_name = figures_of(devices)
    from paxsearch.benchmarks.chip_profile import environment

    doc: dict = {"what": "the chip's own figures (benchmarks/chip_figures.py)", "environment": environment(devices),
                 "hardware": hw_name, "peak_flops": peak, "hbm_bandwidth": bandwidth, "tiny": args.tiny,
                 "timing": __doc__.split("Timing: ", 1)[1].split("\n\n", 1)[0].replace("\n", " "), "sections": {}}
    log(f"device {devices[0].device_kind}: peak {peak / 1e12:.1f} TFLOP/s, HBM {bandwidth / 1e9:.0f} GB/s ({hw_name})")
    interpret = devices[0].platform != "tpu"
    budget_end = t_start + args.budget_s
    for section in [s.strip() for s in args.sections.split(",") if s.strip()]:
        t = time.perf_counter()
        if t > budget_end or section not in SECTIONS:
            doc["sections"][section] = {"skipped": "budget" if section in SECTIONS else "unknown section"}
            log(f"{section}: skipped")
            continue
        deadline = min(budget_end, t + CAPS[section] * (10 if args.tiny else 1))
        log(f"{section}: until +{deadline - t_start:.0f} s")
        try:
            if section in ("matmul", "proj", "splash", "hbm", "index", "gmm"):
                if section in ("splash", "gmm") and interpret and not args.tiny:
                    raise RuntimeError(f"the {section} kernels need a TPU (the CPU runs them interpreted only with "
                                       "--tiny)")
                cases = (matmul_cases(args.tiny) if section == "matmul" else
                         projection_cases(args.tiny) if section == "proj" else
                         splash_cases(args.tiny, interpret, tokens=args.splash_tokens, seqs=_ints(args.splash_seqs),
                                      head_dims=_ints(args.splash_head_dims),
                                      blocks=_ints(args.splash_blocks), heads=_ints(args.splash_heads),
                                      kv_heads=_ints(args.splash_kv_heads)) if section == "splash" else
                         hbm_cases(args.tiny) if section == "hbm" else
                         gmm_cases(args.tiny, interpret, _dims(args.gmm_shapes), _dims(args.gmm_tiles))
                         if section == "gmm" else
                         index_cases(args.tiny, _ints(args.index_rows), _ints(args.index_widths),
                                     not args.index_no_ragged))
                compile_cases(cases, log)
                # the section's cap is for running: compiling (in threads, ahead of time) is not held against it
                deadline = min(budget_end, time.perf_counter() + CAPS[section] * (10 if args.tiny else 1))
                results, skipped, seen = run_cases(cases, log, deadline, args.target_s if not args.tiny else 0.005,
                                             3 if not args.tiny else 2, 200 if not args.tiny else 5, peak, bandwidth)
                doc["sections"][section] = {"cases": results, "skipped": skipped, "trace_programs": seen}
            elif section == "host":
                doc["sections"][section] = host_section(args.tiny, log, deadline)
            else:
                doc["sections"][section] = overhead_section(args.tiny, log, deadline)
        except Exception as e:  # noqa: BLE001 - a section's failure must not lose the others
            doc["sections"][section] = {"error": f"{type(e).__name__}: {str(e)[:2000]}",
                                        "traceback": traceback.format_exc()[-4000:]}
            log(f"{section}: FAILED {type(e).__name__}: {str(e)[:300]}")
        doc["sections"][section]["seconds"] = time.perf_counter() - t
        doc["total_s"] = time.perf_counter() - t_start
        with open(path, "w") as f:
            json.dump(doc, f, indent=1, default=str)
    doc["total_s"] = time.perf_counter() - t_start
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, default=str)
    log(f"done in {doc['total_s']:.0f} s; wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

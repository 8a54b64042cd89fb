"""MEASURED time of a compiled step's ops, read from a `jax.profiler` trace, bucketed the way the
roofline buckets its prediction (everything else under search/planning/roofline/ is predicted).

No xprof / tensorboard_plugin_profile is needed: jax ships `jax.profiler.ProfileData` (jaxlib's
profiler bindings), which reads the `*.xplane.pb` a `jax.profiler.trace(folder)` writes.

    with jax.profiler.trace(folder):
        ... run the step ...
    rows = read_xplane(newest_xplane(folder))           # TraceRow per event, plain data
    runs = module_runs(rows, module_name(hlo_text))     # the step program's executions (device time)
    ops = op_totals(rows, module_name(hlo_text))        # HLO instruction name -> OpTotal
    measured = measured_buckets(hlo_text, ops)          # bucket -> seconds, summed over the trace
    planned = plan_buckets(hlo_text, hw, mesh=...)      # bucket -> seconds per step, predicted

Where the ops are in a trace:
  * TPU (and GPU): a device plane ("/device:TPU:0"), line "XLA Ops", one event per executed HLO
    instruction, named by the instruction (the name in compiled.as_text()); line "XLA Modules", one
    event per execution of a program, named "<module>(<program id>)"; line "Steps" where the
    runtime marks steps. A loop's body ops appear once per iteration. An event that encloses
    others on its line (a while, a call) is counted by its self time (its duration less its
    children's), so nothing is counted twice.
  * CPU: host plane "/host:CPU", one line per thread; an op's event carries the stats `hlo_op` (the
    instruction) and `hlo_module`. Ops on different threads may overlap, so on CPU the buckets can
    add up to more than the step.

Buckets (BUCKETS), the roofline's own classification of each instruction (cost.py, host.py,
hlo.py), the same split as the retired benchmarks/diag_profile_buckets.py (benchmarks/RESULTS.md):
  matmul           an op that multiplies matrices (cost.uses_mxu), not an attention kernel
  attention kernel a Pallas splash kernel or cuDNN flash attention (cost.is_attention_kernel)
  other on-chip    every other op with FLOPs or HBM bytes of its own (cost.op_work is not None):
                   the HBM-bound loop fusions, reductions, copies, converts
  collectives      collectives and their async halves, TPU async-collective fusions (hlo.collective_kind)
  host transfers   transfers between HBM and host memory (host.host_transfer, and their -done)
  on-chip DMA      DMAs between HBM and VMEM (dma.moves_dma_bytes: their starts, or the slice an async-start
                   wraps, priced by the roofline on the compute stream; and their -done halves: a -done's
                   time is the wait for its DMA)
  control          what has no work of its own (while, tuple, bitcast ...; a loop's self time)
  unmatched        a measured op whose name is not in the module
Predicted: the first three are the per-op roofline (analyze's roof, each op's priced seconds times
its executions per step); collectives and host transfers are predicted twice, all their time and
the exposed part (what the step time adds), both per step.
"""
from __future__ import annotations

import bisect
import glob
import os
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable

from .chip import Hardware
from .cost import _fusion_is_collective, is_attention_kernel, op_costs, op_work, priced_seconds, uses_mxu
from .dma import dma_start, moves_dma_bytes
from .hlo import Computation, HloModule, Instr, call_graph, collective_kind, parse_module
from .host import DONE_OPCODES, host_transfer
from .model import _running_ops, analyze

MATMUL = "matmul"
ATTENTION = "attention kernel"
OTHER = "other on-chip"
COLLECTIVES = "collectives"
HOST = "host transfers"
DMA = "on-chip DMA"
CONTROL = "control"
UNMATCHED = "unmatched"
BUCKETS = (MATMUL, ATTENTION, OTHER, COLLECTIVES, HOST, DMA, CONTROL, UNMATCHED)

DEVICE_OPS_LINE = "XLA Ops"
DEVICE_MODULES_LINE = "XLA Modules"
DEVICE_STEPS_LINE = "Steps"
# device lines of ops that run beside the XLA Ops stream (async copies, host offload DMAs): reported
# apart, never added to the buckets (their time overlaps the stream's)
DEVICE_ASYNC_LINES = ("Async XLA Ops", "Host Offload Ops")


# ----------------------------------------------------------------------------- reading a trace

@dataclass(frozen=True)
class TraceRow:
    """One event of a trace, as plain data."""

    plane: str
    line: str
    name: str
    start_ns: float
    duration_ns: float
    stats: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def end_ns(self) -> float:
        return self.start_ns + self.duration_ns

    @property
    def on_device(self) -> bool:
        return self.plane.startswith("/device:")


def newest_xplane(folder: str) -> str:
    """The newest `*.xplane.pb` under `folder` (what jax.profiler.trace(folder) wrote last)."""
    paths = glob.glob(os.path.join(folder, "**", "*.xplane.pb"), recursive=True)
    if not paths:
        raise FileNotFoundError(f"no *.xplane.pb under {folder}")
    return max(paths, key=os.path.getmtime)


def read_xplane(path: str) -> list[TraceRow]:
    """Every event of an xplane.pb file, read with jax.profiler.ProfileData (no xprof needed)."""
    from jax.profiler import ProfileData

    return rows_of(ProfileData.from_file(path))


def rows_of(profile) -> list[TraceRow]:
    """TraceRows of a jax.profiler.ProfileData (planes -> lines -> events)."""
    rows = []
    for plane in profile.planes:
        for line in plane.lines:
            for ev in line.events:
                stats = {}
                for stat in ev.stats:
                    try:
                        k, v = stat
                    except (TypeError, ValueError):
                        continue
                    stats[str(k)] = v
                rows.append(TraceRow(plane.name, line.name, ev.name, float(ev.start_ns), float(ev.duration_ns),
                                     stats))
    return rows


def base_module_name(name: str) -> str:
    """A program's name without the "(<program id>)" a device's XLA Modules line adds."""
    return name.split("(", 1)[0].strip()


def module_name(hlo_text: str) -> str:
    """The module's name from the first line of its HLO text ("HloModule jit_train_step, ...")."""
    for line in hlo_text.splitlines():
        line = line.strip()
        if line.startswith("HloModule"):
            return line.split()[1].rstrip(",")
    raise ValueError("no HloModule line in the HLO text")


def module_runs(rows: Iterable[TraceRow], module: str | None = None) -> list[TraceRow]:
    """The executions of a program on a device (events of its XLA Modules line), by start time;
    every program's where `module` is None. Empty on CPU (no such line)."""
    out = [r for r in rows if r.on_device and r.line == DEVICE_MODULES_LINE
           and (module is None or base_module_name(r.name) == module)]
    return sorted(out, key=lambda r: r.start_ns)


def device_steps(rows: Iterable[TraceRow]) -> list[TraceRow]:
    """The device's own step markers (its "Steps" line), by start time; empty where there is none."""
    return sorted((r for r in rows if r.on_device and r.line == DEVICE_STEPS_LINE), key=lambda r: r.start_ns)


def host_steps(rows: Iterable[TraceRow], name: str) -> list[TraceRow]:
    """The host's `jax.profiler.StepTraceAnnotation(name, step_num=...)` events, by start time."""
    return sorted((r for r in rows if not r.on_device and r.name == name and "step_num" in r.stats),
                  key=lambda r: r.start_ns)


def op_name(row: TraceRow) -> str | None:
    """The HLO instruction an event executed: on a device's XLA Ops line its name, on a host the
    `hlo_op` stat; None for events that are not op executions."""
    if row.on_device:
        return row.name.lstrip("%").split(" ")[0] if row.line == DEVICE_OPS_LINE else None
    op = row.stats.get("hlo_op")
    return str(op) if op else None


def self_times(rows: Iterable[TraceRow]) -> list[tuple[TraceRow, float]]:
    """(row, self time in ns) for every row: its duration less that of the rows nested in it on
    the same (plane, line): a loop's event encloses its body's ops on a device's XLA Ops line."""
    by_line: dict[tuple[str, str], list[TraceRow]] = defaultdict(list)
    for r in rows:
        by_line[(r.plane, r.line)].append(r)
    out: list[tuple[TraceRow, float]] = []
    for line_rows in by_line.values():
        line_rows.sort(key=lambda r: (r.start_ns, -r.duration_ns))
        child = [0.0] * len(line_rows)
        stack: list[int] = []
        for i, r in enumerate(line_rows):
            while stack and line_rows[stack[-1]].end_ns <= r.start_ns:
                stack.pop()
            if stack and r.end_ns <= line_rows[stack[-1]].end_ns + 1e-3:
                child[stack[-1]] += r.duration_ns  # a direct child: deeper ones are its own children
            stack.append(i)
        out.extend((r, max(r.duration_ns - c, 0.0)) for r, c in zip(line_rows, child, strict=True))
    return out


@dataclass
class OpTotal:
    """One instruction's measured executions in a trace."""

    count: int = 0
    total_ns: float = 0.0  # sum of its events' durations
    self_ns: float = 0.0  # the same less what nests inside them (= total_ns for a leaf op)


def _inside(runs: list[TraceRow]):
    """A test of whether a device row lies within one of `runs` (sorted by start)."""
    starts = [r.start_ns for r in runs]

    def test(row: TraceRow) -> bool:
        i = bisect.bisect_right(starts, row.start_ns) - 1
        return i >= 0 and row.start_ns < runs[i].end_ns and row.plane == runs[i].plane
    return test


def op_totals(rows: Iterable[TraceRow], module: str | None = None) -> dict[str, OpTotal]:
    """HLO instruction name -> its measured executions, over the whole trace. With `module`, only
    the ops of that program: on a device those within its XLA Modules events, on a host those whose
    `hlo_module` stat names it."""
    rows = list(rows)
    ops = [r for r in rows if op_name(r) is not None]
    if module is not None:
        runs = module_runs(rows, module)
        within = _inside(runs)
        # a device whose XLA Modules line names no program `module`: all its ops (the caller says so)
        ops = [r for r in ops if ((within(r) or not runs) if r.on_device else
                                  base_module_name(str(r.stats.get("hlo_module", ""))) == module)]
    totals: dict[str, OpTotal] = defaultdict(OpTotal)
    for r, self_ns in self_times(ops):
        t = totals[op_name(r) or r.name]
        t.count += 1
        t.total_ns += r.duration_ns
        t.self_ns += self_ns
    return dict(totals)


# ----------------------------------------------------------------------------- the roofline's buckets

def bucket_of(module: HloModule, comp: Computation, ins: Instr) -> str:
    """The bucket of one instruction, by the roofline's own tests (see the module docstring)."""
    if collective_kind(ins.opcode) or (ins.opcode == "fusion" and _fusion_is_collective(module, ins)):
        return COLLECTIVES
    if host_transfer(module, comp, ins) is not None or _closes_host_transfer(module, comp, ins):
        return HOST
    if moves_dma_bytes(module, comp, ins) or dma_start(module, comp, ins) is not None:
        return DMA
    if is_attention_kernel(ins):
        return ATTENTION
    if uses_mxu(module, ins):
        return MATMUL
    return OTHER if op_work(module, comp, ins) is not None else CONTROL


def _closes_host_transfer(module: HloModule, comp: Computation, ins: Instr) -> bool:
    if ins.opcode not in DONE_OPCODES or not ins.operands:
        return False
    start = comp.by_name.get(ins.operands[0])
    return start is not None and host_transfer(module, comp, start) is not None


def instruction_index(module: HloModule) -> dict[str, tuple[Computation, Instr]]:
    """Instruction name -> (its computation, itself), over the module (names are unique in it)."""
    return {ins.name: (comp, ins) for comp in module.computations.values() for ins in comp.instrs}


def measured_buckets(hlo_text: str, totals: dict[str, OpTotal]) -> dict[str, float]:
    """Measured seconds per bucket (self time, summed over every execution in `totals`)."""
    module = parse_module(hlo_text)
    index = instruction_index(module)
    out = dict.fromkeys(BUCKETS, 0.0)
    for name, t in totals.items():
        found = index.get(name)
        key = bucket_of(module, *found) if found is not None else UNMATCHED
        out[key] += t.self_ns * 1e-9
    return out


def plan_buckets(hlo_text: str, hw: Hardware, *, mesh=None, num_devices: int | None = None) -> dict:
    """Predicted seconds per step and bucket: the per-op roofline of the ops that run on their own
    (each op's priced seconds, as analyze prices it, times its executions per step), and the
    transfers' time, all and exposed. "step" is analyze's step time (per-op roofline + exposed)."""
    module = parse_module(hlo_text)
    graph = call_graph(module)
    out = dict.fromkeys(BUCKETS, 0.0)
    for comp, ins, mult in _running_ops(module, graph):
        costs = op_costs(module, comp, ins, hw)
        if costs is None:
            continue
        out[bucket_of(module, comp, ins)] += priced_seconds(costs[2], costs[3], hw) * mult
    roof = analyze(hlo_text, hw, mesh=mesh, num_devices=num_devices)
    out[DMA] += roof.dma_exposed_s  # with Hardware.dma_overlap: the DMAs' waits, priced apart from their ops
    transfers = {COLLECTIVES: [c for c in roof.collectives if c.link != "host"],
                 HOST: [c for c in roof.collectives if c.link == "host"]}
    result: dict = {"buckets": out, "step_s": roof.step_time_s, "roofline_s": roof.roofline_s,
                    "exposed_comm_s": roof.exposed_comm_s}
    for key, cs in transfers.items():
        out[key] = sum(c.exposed_s for c in cs)  # what the step time adds
        result[f"{key} all_s"] = sum(c.seconds for c in cs)
    return result


def per_op_table(hlo_text: str, hw: Hardware, totals: dict[str, OpTotal], steps: int, top: int = 20) -> list[dict]:
    """The `top` ops by measured self time per step, each with its bucket and predicted seconds per
    step (the op's priced roofline times its executions per step)."""
    module = parse_module(hlo_text)
    graph = call_graph(module)
    index = instruction_index(module)
    rows = []
    for name, t in sorted(totals.items(), key=lambda kv: -kv[1].self_ns)[:top]:
        found = index.get(name)
        entry = {"op": name, "measured_s": t.self_ns * 1e-9 / max(steps, 1),
                 "executions_per_step": t.count / max(steps, 1)}
        if found is not None:
            comp, ins = found
            mult = graph.multiplier.get(comp.name, 0.0)
            costs = op_costs(module, comp, ins, hw) if comp.name not in graph.fused else None
            entry.update(bucket=bucket_of(module, comp, ins), opcode=ins.opcode, computation=comp.name,
                         predicted_s=(priced_seconds(costs[2], costs[3], hw) * mult if costs else None),
                         flops=costs[0] if costs else None, hbm_bytes=costs[1] if costs else None)
        else:
            entry["bucket"] = UNMATCHED
        rows.append(entry)
    return rows


def compare(hlo_text: str, hw: Hardware, rows: list[TraceRow], steps: int, *, mesh=None,
            num_devices: int | None = None, wall_step_s: float | None = None, top: int = 20) -> dict:
    """Predicted against measured, per step, for a trace of `steps` executions of one compiled step
    (`rows`: read_xplane of it). Measured step: the mean of the program's device executions where
    the device reports them (TPU), else the mean of the host's StepTraceAnnotation("train") events."""
    module = module_name(hlo_text)
    totals = op_totals(rows, module)
    runs = module_runs(rows, module)
    measured = {k: v / max(steps, 1) for k, v in measured_buckets(hlo_text, totals).items()}
    plan = plan_buckets(hlo_text, hw, mesh=mesh, num_devices=num_devices)
    starts = [r.start_ns for r in runs]
    host = host_steps(rows, "train")
    async_lines: dict[str, float] = defaultdict(float)
    for r in rows:
        if r.on_device and r.line in DEVICE_ASYNC_LINES:
            async_lines[r.line] += r.duration_ns * 1e-9 / max(steps, 1)
    out = {
        "module": module,
        "modules_seen": sorted({base_module_name(r.name) for r in module_runs(rows)})[:20],
        "device_async_lines_s": dict(async_lines),
        "steps_traced": steps,
        "device_runs": len(runs),
        "measured_step_s": (sum(r.duration_ns for r in runs) / len(runs) * 1e-9 if runs else
                            sum(r.duration_ns for r in host) / len(host) * 1e-9 if host else None),
        "measured_step_source": "device XLA Modules" if runs else "host StepTraceAnnotation" if host else None,
        "device_period_s": ((starts[-1] - starts[0]) / (len(starts) - 1) * 1e-9 if len(starts) > 1 else None),
        "device_steps_line_s": [r.duration_ns * 1e-9 for r in device_steps(rows)][:8],
        "host_step_s": [r.duration_ns * 1e-9 for r in host],
        "wall_step_s": wall_step_s,
        "measured_busy_s": sum(v for k, v in measured.items()),
        "predicted_step_s": plan["step_s"],
        "predicted_roofline_s": plan["roofline_s"],
        "buckets": {k: {"predicted_s": plan["buckets"][k], "measured_s": measured[k]} for k in BUCKETS},
        "predicted_transfers_all_s": {k: plan[f"{k} all_s"] for k in (COLLECTIVES, HOST)},
        "top_ops": per_op_table(hlo_text, hw, totals, steps, top),
    }
    return out

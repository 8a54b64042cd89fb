"""A roofline model of one train step, read from the compiled, optimized HLO.

Everything here is PREDICTED: no step runs. The inputs are the optimized HLO text of the
compiled step (`plan(..., keep_hlo=True).hlo_text`), the jax Mesh it was compiled for, and
the hardware figures of one chip (trainer/topology.py).

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
    which XLA cannot see into, are counted from their operand shapes (`splash_flops`).
  * HBM bytes. For every instruction that runs on its own (a fusion, a copy, a custom call,
    a dot outside a fusion ...): bytes of its operands plus bytes of its result. An operand
    that is only read through dynamic-slice counts the slice, and an in-place
    dynamic-update-slice counts the update, not the whole buffer (the stacked per-layer
    weights and saved activations of a scan would otherwise be counted whole each layer).
  * Collectives: all-gather, reduce-scatter, all-reduce, all-to-all, collective-permute
    (and collective-broadcast), in plain or async (-start / -done, async-start, TPU
    async-collective fusions) form. Each one is counted once per execution (the -done
    half and the copies of one channel inside TPU async-collective fusions are the same
    transfer). Its replica groups are read in any of XLA's three spellings (explicit
    `{{0,1},{2,3}}`, iota `[2,4]<=[4,2]T(1,0)`, mesh-axes `mesh['a'=2,'b'=4] {'b'}`),
    mapped onto the jax Mesh (logical device i is mesh.devices.flat[i]) to name the mesh
    axes it spans, and onto the devices to decide the link: DCN when a group holds devices
    of more than one slice, ICI otherwise.

Cost of one collective over a group of n devices, per device (ring algorithms):
    all-gather          input x (n - 1)          (= output x (n-1)/n)
    reduce-scatter      input x (n - 1) / n
    all-reduce          2 x input x (n - 1) / n  (reduce-scatter + all-gather)
    all-to-all          input x (n - 1) / n
    collective-permute  input                    (one hop)
  time = bytes / bandwidth + (n - 1) x step latency.
  ICI bandwidth: a group that spans k physical torus dimensions (from the devices'
  coordinates; 1 when they are unknown) runs k bidirectional rings, so it drives 2k links:
  bandwidth = 2 k x one-way link bandwidth (a collective-permute uses one link, one way).
  DCN bandwidth: the chip's share of its host's data-center NICs. Torus wrap-around links
  are assumed present.

Combination (the assumption that matters most):
    per-op roofline   = sum over ops of max(flops / peak, hbm bytes / HBM bandwidth)
    exposed comm      = max(0, comm - OVERLAP_FRACTION x per-op roofline)
    step time         = per-op roofline + exposed comm
  i.e. collectives hide behind at most OVERLAP_FRACTION of the compute/memory time (XLA's
  latency-hiding scheduler overlaps async collectives with independent work, but not all of
  it: a tensor-parallel all-reduce blocks the next matmul).
  compute_s (= flops / peak) and memory_s (= bytes / bandwidth) are reported beside it.
  Peak is the dense bf16 peak: the prediction assumes every matmul runs at MXU peak, so
  predicted step time is a lower bound and predicted MFU an upper bound.
    predicted MFU = model FLOPs per step / devices / predicted step time / peak
  (model FLOPs as in trainer/flops.py).
"""
from __future__ import annotations

import dataclasses
import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

OVERLAP_FRACTION = 0.5  # share of the per-op roofline time that can hide collectives
ICI_STEP_LATENCY_S = 1e-6  # per ring step over ICI
DCN_STEP_LATENCY_S = 20e-6  # per ring step over the data-center network

COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute",
               "collective-broadcast", "ragged-all-to-all")

DTYPE_BYTES = {
    "pred": 1, "s2": 0.25, "u2": 0.25, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "s16": 2, "u16": 2,
    "s32": 4, "u32": 4, "s64": 8, "u64": 8, "f16": 2, "bf16": 2, "f32": 4, "f64": 8, "c64": 8,
    "c128": 16, "f8e4m3fn": 1, "f8e5m2": 1, "f8e4m3": 1, "f8e3m4": 1, "f8e4m3b11fnuz": 1,
    "f8e4m3fnuz": 1, "f8e5m2fnuz": 1, "f8e8m0fnu": 1, "f4e2m1fn": 0.5, "token": 0, "opaque": 0,
}
_ARRAY_RE = re.compile(r"\b([a-z][a-z0-9]*)\[([^\]]*)\]")
_HEADER_RE = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\{\s*$")
_INSTR_RE = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_COMMENT_RE = re.compile(r"/\*.*?\*/")

# No HBM traffic of their own (aliases, bookkeeping, control flow, the -done half of async ops).
_NO_TRAFFIC = {
    "parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while", "call", "conditional",
    "after-all", "partition-id", "replica-id", "opt-barrier", "add-dependency", "domain",
    "copy-done", "send-done", "recv-done", "async-done", "async-update", "iota", "send", "recv",
    "async-start",  # its wrapped computation is counted instead
}
_ELEMENTWISE = {
    "add", "subtract", "multiply", "divide", "maximum", "minimum", "negate", "abs", "sign",
    "compare", "select", "clamp", "and", "or", "xor", "not", "remainder", "floor", "ceil",
    "round-nearest-afz", "round-nearest-even", "shift-left", "shift-right-arithmetic",
    "shift-right-logical", "atan2", "popcnt", "count-leading-zeros", "convert",
}


# ----------------------------------------------------------------------------- parsing

def shape_bytes(shape: str) -> float:
    """Bytes of an HLO shape string (arrays and tuples; layouts ignored)."""
    total = 0.0
    for dtype, dims in _ARRAY_RE.findall(shape):
        if dtype not in DTYPE_BYTES:
            continue
        total += DTYPE_BYTES[dtype] * _prod(_dims(dims))
    return total


_ARRAY_LAYOUT_RE = re.compile(r"\b([a-z][a-z0-9]*)\[([^\]]*)\](\{[^}]*\})?")
_MEMORY_SPACE_RE = re.compile(r"S\((\d+)\)")


def hbm_shape_bytes(shape: str) -> float:
    """Bytes of a shape that live in HBM: arrays whose layout puts them in another memory
    space (`S(1)`: TPU VMEM, chosen by XLA's memory-space assignment) are left out."""
    total = 0.0
    for dtype, dims, layout in _ARRAY_LAYOUT_RE.findall(shape):
        if dtype not in DTYPE_BYTES:
            continue
        m = _MEMORY_SPACE_RE.search(layout or "")
        if m and int(m.group(1)) != 0:
            continue
        total += DTYPE_BYTES[dtype] * _prod(_dims(dims))
    return total


def shape_dims(shape: str) -> list[int]:
    """Dimensions of the first array in a shape string."""
    m = _ARRAY_RE.search(shape)
    return _dims(m.group(2)) if m else []


def _dims(text: str) -> list[int]:
    return [int(d.replace("<=", "")) for d in text.split(",") if d.strip()]


def _prod(xs: Iterable[int]) -> int:
    return int(math.prod(xs))


@dataclass
class Instr:
    name: str
    shape: str
    opcode: str
    operands: list[str]
    attrs: str
    root: bool = False

    def attr(self, key: str) -> str | None:
        """Value of `key=` in the attributes: a %name, {...} block or plain token."""
        m = re.search(r"(?:^|[\s,])" + re.escape(key) + r"=", self.attrs)
        if not m:
            return None
        i = m.end()
        s = self.attrs
        if i < len(s) and s[i] == "{":
            return _balanced(s, i, "{", "}")
        j = i
        while j < len(s) and s[j] not in ", ":
            j += 1
        return s[i:j]


@dataclass
class Computation:
    name: str
    instrs: list[Instr]
    entry: bool = False
    by_name: dict[str, Instr] = field(default_factory=dict)

    @property
    def root(self) -> Instr | None:
        for ins in self.instrs:
            if ins.root:
                return ins
        return self.instrs[-1] if self.instrs else None


@dataclass
class HloModule:
    computations: dict[str, Computation]
    entry: str
    num_partitions: int | None = None  # per-slice partitions on multi-slice TPU programs


def _balanced(s: str, i: int, open_: str, close: str) -> str:
    depth = 0
    for j in range(i, len(s)):
        if s[j] == open_:
            depth += 1
        elif s[j] == close:
            depth -= 1
            if depth == 0:
                return s[i:j + 1]
    return s[i:]


def _split_top(s: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in s:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if cur:
        parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def _parse_instr(line: str) -> Instr | None:
    m = _INSTR_RE.match(line)
    if not m:
        return None
    root, name, rest = bool(m.group(1)), m.group(2), m.group(3)
    if rest.startswith("("):
        shape = _balanced(rest, 0, "(", ")")
    else:
        shape = rest.split(" ", 1)[0]
    rest = rest[len(shape):].lstrip()
    k = rest.find("(")
    if k < 0:
        return None
    opcode = rest[:k].strip()
    args = _balanced(rest, k, "(", ")")
    attrs = rest[k + len(args):].lstrip(", ")
    operands = []
    for a in _split_top(args[1:-1]):
        tok = a.split()[-1] if a.split() else a
        operands.append(tok.lstrip("%"))
    return Instr(name, shape, opcode, operands, attrs, root)


def parse_module(text: str) -> HloModule:
    """Parse optimized HLO text (as `compiled.as_text()` prints it)."""
    comps: dict[str, Computation] = {}
    entry = None
    partitions = None
    cur: Computation | None = None
    for raw in text.splitlines():
        line = _COMMENT_RE.sub("", raw).rstrip()
        if line.startswith("HloModule"):
            m = re.search(r"num_partitions=(\d+)", line)
            partitions = int(m.group(1)) if m else None
            continue
        if not line.strip():
            continue
        if cur is None:
            m = _HEADER_RE.match(line)
            if m:
                cur = Computation(m.group(2), [], entry=bool(m.group(1)))
            continue
        if line.strip() == "}":
            comps[cur.name] = cur
            if cur.entry:
                entry = cur.name
            cur = None
            continue
        ins = _parse_instr(line)
        if ins is not None:
            cur.instrs.append(ins)
            cur.by_name[ins.name] = ins
    if entry is None:
        raise ValueError("no ENTRY computation in the HLO text")
    return HloModule(comps, entry, partitions)


# ----------------------------------------------------------------------------- call graph

def _called(ins: Instr) -> list[tuple[str, str]]:
    """(kind, computation) pairs: kind is 'body', 'cond', 'fused' or 'control'."""
    out = []
    if ins.opcode == "while":
        for key, kind in (("body", "body"), ("condition", "cond")):
            v = ins.attr(key)
            if v:
                out.append((kind, v.lstrip("%")))
        return out
    for key in ("calls", "called_computations", "branch_computations", "true_computation",
                "false_computation"):
        v = ins.attr(key)
        if not v:
            continue
        names = [x.strip().lstrip("%") for x in v.strip("{}").split(",") if x.strip()]
        kind = "fused" if ins.opcode in ("fusion", "custom-call") else "control"
        if ins.opcode == "conditional":
            kind = "branch"
        out.extend((kind, n) for n in names)
    return out


def trip_count(module: HloModule, comp: Computation, ins: Instr) -> int | None:
    """Trip count of a while instruction, or None when it cannot be read."""
    m = re.search(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"?(\d+)', ins.attrs)
    if m:
        return int(m.group(1))
    cond = module.computations.get((ins.attr("condition") or "").lstrip("%"))
    body = module.computations.get((ins.attr("body") or "").lstrip("%"))
    if cond is None or body is None:
        return None
    cmp = _loop_compare(module, cond)
    if cmp is None:
        return None
    index, limit, direction = cmp
    init = _tuple_element_constant(module, comp, ins.operands[0] if ins.operands else "", index)
    step = _loop_step(module, body, index)
    if init is None:
        init = 0
    if step is None or step == 0:
        step = 1
    if direction == "LT":
        n = math.ceil((limit - init) / step)
    elif direction == "LE":
        n = math.floor((limit - init) / step) + 1
    elif direction == "GT":
        n = math.ceil((init - limit) / -step) if step < 0 else None
    elif direction == "NE":
        n = (limit - init) // step if (limit - init) % step == 0 else None
    else:
        n = None
    return max(int(n), 0) if n is not None else None


def _const_value(comp: Computation, name: str, module: HloModule, depth: int = 0) -> int | None:
    ins = comp.by_name.get(name)
    if ins is None or depth > 4:
        return None
    if ins.opcode == "constant":
        m = re.match(r"\s*(-?\d+)", ins.operands[0] if ins.operands else "")
        return int(m.group(1)) if m else None
    if ins.opcode in ("copy", "bitcast", "convert") and ins.operands:
        return _const_value(comp, ins.operands[0], module, depth + 1)
    if ins.opcode == "fusion":  # a fused constant (e.g. %constant_fusion)
        called = module.computations.get((ins.attr("calls") or "").lstrip("%"))
        if called is not None and called.root is not None and called.root.opcode == "constant":
            return _const_value(called, called.root.name, module, depth + 1)
    return None


def _gte_index(comp: Computation, name: str, depth: int = 0) -> int | None:
    """k when `name` is get-tuple-element(parameter, index=k) (through copies)."""
    ins = comp.by_name.get(name)
    if ins is None or depth > 4:
        return None
    if ins.opcode == "get-tuple-element":
        m = re.search(r"index=(\d+)", ins.attrs)
        src = comp.by_name.get(ins.operands[0]) if ins.operands else None
        if m and src is not None and src.opcode == "parameter":
            return int(m.group(1))
        return None
    if ins.opcode in ("copy", "bitcast", "convert") and ins.operands:
        return _gte_index(comp, ins.operands[0], depth + 1)
    return None


def _resolve_through_fusion(module: HloModule, comp: Computation, ins: Instr):
    """For a fusion wrapping a single op (e.g. CPU's wrapped_compare): (op, operand map)."""
    called = module.computations.get((ins.attr("calls") or "").lstrip("%"))
    if called is None or called.root is None:
        return None, {}
    params = {}
    for p in called.instrs:
        if p.opcode == "parameter":
            m = re.match(r"\s*(\d+)", p.operands[0] if p.operands else "")
            if m and int(m.group(1)) < len(ins.operands):
                params[p.name] = ins.operands[int(m.group(1))]
    return called.root, params


def _loop_compare(module: HloModule, cond: Computation):
    root = cond.root
    if root is None:
        return None
    operands, where = root.operands, cond
    if root.opcode == "fusion":
        inner, params = _resolve_through_fusion(module, cond, root)
        if inner is None or inner.opcode != "compare":
            return None
        direction = inner.attr("direction")
        operands = [params.get(o, o) for o in inner.operands]
    elif root.opcode == "compare":
        direction = root.attr("direction")
    else:
        return None
    if len(operands) != 2:
        return None
    a, b = operands
    ia, ib = _gte_index(where, a), _gte_index(where, b)
    ca, cb = _const_value(where, a, module), _const_value(where, b, module)
    if ia is not None and cb is not None:
        return ia, cb, direction
    if ib is not None and ca is not None:  # N > i  is  i < N
        flip = {"GT": "LT", "GE": "LE", "LT": "GT", "LE": "GE", "NE": "NE", "EQ": "EQ"}
        return ib, ca, flip.get(direction, direction)
    return None


def _tuple_element_constant(module: HloModule, comp: Computation, name: str, index: int) -> int | None:
    ins = comp.by_name.get(name)
    if ins is None:
        return None
    if ins.opcode == "tuple" and index < len(ins.operands):
        return _const_value(comp, ins.operands[index], module)
    return None


def _loop_step(module: HloModule, body: Computation, index: int) -> int | None:
    root = body.root
    if root is None or root.opcode != "tuple" or index >= len(root.operands):
        return None
    ins = body.by_name.get(root.operands[index])
    for _ in range(4):
        if ins is None:
            return None
        if ins.opcode in ("copy", "bitcast") and ins.operands:
            ins = body.by_name.get(ins.operands[0])
            continue
        break
    if ins is None:
        return None
    operands, where = ins.operands, body
    opcode = ins.opcode
    if opcode == "fusion":
        inner, params = _resolve_through_fusion(module, body, ins)
        if inner is None:
            return None
        opcode, operands = inner.opcode, [params.get(o, o) for o in inner.operands]
    if opcode not in ("add", "subtract") or len(operands) != 2:
        return None
    for a, b in (operands, operands[::-1]):
        if _gte_index(where, a) == index:
            c = _const_value(where, b, module)
            if c is not None:
                return c if opcode == "add" else -c
    return None


@dataclass
class CallGraph:
    multiplier: dict[str, float]  # executions per step of each computation
    fused: set[str]  # computations reached through a fusion (their ops run inside it)
    unknown_trip_counts: list[str]
    trip_counts: dict[str, int]


def call_graph(module: HloModule) -> CallGraph:
    edges: dict[str, list[tuple[str, float, bool]]] = defaultdict(list)
    unknown, trips = [], {}
    for comp in module.computations.values():
        for ins in comp.instrs:
            called = _called(ins)
            if not called:
                continue
            if ins.opcode == "while":
                n = trip_count(module, comp, ins)
                if n is None:
                    unknown.append(ins.name)
                    n = 1
                trips[ins.name] = n
                for kind, name in called:
                    edges[comp.name].append((name, float(n + (1 if kind == "cond" else 0)), False))
                continue
            branches = [c for c in called if c[0] == "branch"]
            for kind, name in called:
                factor = 1.0 / len(branches) if kind == "branch" else 1.0
                edges[comp.name].append((name, factor, kind == "fused"))
    # topological order from the entry (the call graph is a DAG)
    order, seen = [], set()

    def visit(n):
        if n in seen:
            return
        seen.add(n)
        for child, _, _ in edges.get(n, ()):
            visit(child)
        order.append(n)

    import sys
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10000))
    try:
        visit(module.entry)
    finally:
        sys.setrecursionlimit(limit)
    mult: dict[str, float] = defaultdict(float)
    mult[module.entry] = 1.0
    fused: set[str] = set()
    for n in reversed(order):
        for child, factor, is_fused in edges.get(n, ()):
            mult[child] += mult[n] * factor
            if is_fused or n in fused:
                fused.add(child)
    return CallGraph(dict(mult), fused, unknown, trips)


# ----------------------------------------------------------------------------- FLOPs and bytes

def _window(ins: Instr) -> list[dict]:
    w = ins.attr("window")
    if not w:
        return []
    fields = dict(re.findall(r"(\w+)=([^\s}]+)", w))
    size = [int(x) for x in fields.get("size", "").split("x") if x]
    n = len(size)

    def vec(key, default):
        v = fields.get(key)
        return [int(x) for x in v.split("x")] if v else [default] * n

    pads = [tuple(int(y) for y in p.split("_")) for p in fields["pad"].split("x")] if "pad" in fields else [(0, 0)] * n
    stride, lhs_d, rhs_d = vec("stride", 1), vec("lhs_dilate", 1), vec("rhs_dilate", 1)
    return [dict(size=size[i], stride=stride[i], pad_low=pads[i][0], base_dilation=lhs_d[i],
                 window_dilation=rhs_d[i]) for i in range(n)]


def conv_flops(ins: Instr, lhs_shape: str, rhs_shape: str) -> float:
    """FLOPs of a convolution, counted as XLA's HloCostAnalysis counts them."""
    labels = ins.attr("dim_labels")
    lhs, rhs, out = shape_dims(lhs_shape), shape_dims(rhs_shape), shape_dims(ins.shape)
    if not labels or "->" not in labels:
        return 2.0 * _prod(out)
    lhs_l, rest = labels.split("_", 1)
    rhs_l, out_l = rest.split("->")
    spatial = sorted(c for c in lhs_l if c.isdigit())
    in_feat = lhs[lhs_l.index("f")]
    batch = lhs[lhs_l.index("b")]
    out_feat = out[out_l.index("f")]
    fgc = int(ins.attr("feature_group_count") or 1)
    bgc = int(ins.attr("batch_group_count") or 1)
    win = _window(ins) or [dict(size=1, stride=1, pad_low=0, base_dilation=1, window_dilation=1)] * len(spatial)
    counts = []
    for i, s in enumerate(spatial):
        k_lim, o_lim, i_lim = rhs[rhs_l.index(s)], out[out_l.index(s)], lhs[lhs_l.index(s)]
        w = win[i] if i < len(win) else win[-1]
        o = np.arange(o_lim)[:, None]
        k = np.arange(k_lim)[None, :]
        undilated = o * w["stride"] - w["pad_low"] + k * w["window_dilation"]
        bd = w["base_dilation"]
        valid = (undilated % bd == 0) if bd > 1 else np.ones_like(undilated, dtype=bool)
        idx = undilated // bd if bd > 1 else undilated
        valid &= (idx >= 0) & (idx < i_lim)
        counts.append(int(valid.sum()))
    return 2.0 * (in_feat // fgc) * out_feat * (batch // bgc) * _prod(counts)


def _operand_shape(comp: Computation, name: str) -> str:
    ins = comp.by_name.get(name)
    return ins.shape if ins is not None else ""


# Pallas splash-attention kernels (TPU custom calls, named by their kernel): XLA cannot see
# into them, so their matmuls are counted here from the query-shaped operand (..., H, S, D):
# forward QK^T and PV (2); dK/dV recomputes QK^T then P^T dO, dO V^T and dS^T Q (4); dQ
# recomputes QK^T then dO V^T and dS K (3). Each matmul is 2 S^2 D FLOPs per head, over the
# causal blocks splash computes: n (n + 1) / 2 of n^2 for n = S / block.
SPLASH_MATMULS = (("splash_mha_fwd", 2), ("splash_mha_dkv", 4), ("splash_mha_dq", 3))


def splash_flops(comp: Computation, ins: Instr) -> float:
    """FLOPs of one splash-attention custom call (0 for any other custom call)."""
    matmuls = next((k for name, k in SPLASH_MATMULS if name in ins.name), 0)
    if not matmuls:
        return 0.0
    shapes = [shape_dims(_operand_shape(comp, o)) for o in ins.operands]
    q = max((d for d in shapes if len(d) >= 3), key=_prod, default=None)
    if q is None:
        return 0.0
    s, d = q[-2], q[-1]
    from .attention import splash_block  # the block size the kernel was built with
    n = s // splash_block(s) if s % 128 == 0 else 1
    causal = (n + 1) / (2 * n)
    return matmuls * 2.0 * s * s * d * _prod(q[:-2]) * causal


def instr_flops(module: HloModule, comp: Computation, ins: Instr, _depth: int = 0) -> float:
    """FLOPs of one instruction; a fusion's are those of its fused computation."""
    op = ins.opcode
    if op == "custom-call":
        return splash_flops(comp, ins)
    if op == "dot":
        lhs = shape_dims(_operand_shape(comp, ins.operands[0])) if ins.operands else []
        cdims = ins.attr("lhs_contracting_dims")
        k = _prod(lhs[int(d)] for d in cdims.strip("{}").split(",") if d.strip()) if cdims and lhs else 1
        return 2.0 * _prod(shape_dims(ins.shape)) * k
    if op == "convolution" and len(ins.operands) >= 2:
        return conv_flops(ins, _operand_shape(comp, ins.operands[0]), _operand_shape(comp, ins.operands[1]))
    if op in ("fusion",) and _depth < 8:
        called = module.computations.get((ins.attr("calls") or "").lstrip("%"))
        if called is None:
            return 0.0
        return sum(instr_flops(module, called, i, _depth + 1) for i in called.instrs)
    if op in _ELEMENTWISE:
        return float(sum(_prod(shape_dims(s)) for s in [ins.shape]) if not ins.shape.startswith("(") else 0)
    if op in ("reduce", "reduce-window") and ins.operands:
        return float(_prod(shape_dims(_operand_shape(comp, ins.operands[0]))))
    return 0.0


def _param_index(ins: Instr) -> int | None:
    m = re.match(r"\s*(\d+)", ins.operands[0] if ins.operands else "")
    return int(m.group(1)) if m else None


def instr_bytes(module: HloModule, comp: Computation, ins: Instr) -> float:
    """HBM bytes one instruction reads and writes (see the module docstring)."""
    operand_bytes = [hbm_shape_bytes(_operand_shape(comp, o)) for o in ins.operands]
    out_bytes = hbm_shape_bytes(ins.shape)
    if ins.opcode == "dynamic-slice":
        return 2 * out_bytes + sum(operand_bytes[1:])
    if ins.opcode == "dynamic-update-slice" and len(operand_bytes) >= 2:
        return 2 * operand_bytes[1] + sum(operand_bytes[2:])
    if ins.opcode == "copy-start" and ins.shape.startswith("("):  # (destination, source, context)
        return sum(operand_bytes) + hbm_shape_bytes(_split_top(ins.shape[1:-1])[0])
    if ins.opcode != "fusion":
        return sum(operand_bytes) + out_bytes
    called = module.computations.get((ins.attr("calls") or "").lstrip("%"))
    if called is None:
        return sum(operand_bytes) + out_bytes
    users: dict[str, list[tuple[Instr, int]]] = defaultdict(list)
    for i in called.instrs:
        for pos, o in enumerate(i.operands):
            users[o].append((i, pos))
    params = {p.name: _param_index(p) for p in called.instrs if p.opcode == "parameter"}
    total = 0.0
    in_place_outputs = 0.0
    for pname, idx in params.items():
        if idx is None or idx >= len(operand_bytes):
            continue
        full = operand_bytes[idx]
        uses = _through_bitcasts(called, pname, users)
        if uses and all(u.opcode == "dynamic-slice" and pos == 0 for u, pos in uses):
            total += min(full, sum(shape_bytes(u.shape) for u, _ in uses))
        elif uses and all(u.opcode == "dynamic-update-slice" and pos == 0 for u, pos in uses):
            upd = min(full, sum(shape_bytes(_operand_shape(called, u.operands[1])) for u, _ in uses))
            total += upd  # read-modify-write of the slice only
            in_place_outputs += full - upd
        else:
            total += full
    return total + max(out_bytes - in_place_outputs, 0.0)


def _through_bitcasts(comp: Computation, name: str, users, depth: int = 0):
    out = []
    for u, pos in users.get(name, ()):
        if u.opcode == "bitcast" and depth < 3:
            out.extend(_through_bitcasts(comp, u.name, users, depth + 1))
        else:
            out.append((u, pos))
    return out


# ----------------------------------------------------------------------------- collectives

def _iota_groups(spec: str) -> list[list[int]]:
    m = re.fullmatch(r"\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", spec.strip())
    if not m:
        raise ValueError(f"not an iota replica group list: {spec!r}")
    shape, reshape = _dims(m.group(1)), _dims(m.group(2))
    arr = np.arange(_prod(reshape)).reshape(reshape)
    if m.group(3):
        arr = arr.transpose([int(x) for x in m.group(3).split(",")])
    return arr.reshape(shape[0], -1).tolist()


def _device_array(spec: str | None, sizes: list[int]) -> np.ndarray:
    n = _prod(sizes)
    if not spec:
        return np.arange(n).reshape(sizes)
    spec = spec.strip()
    if spec.startswith("["):
        m = re.fullmatch(r"\[([\d,]+)\](?:T\(([\d,]+)\))?", spec)
        if not m:
            raise ValueError(f"cannot read device_ids={spec!r}")
        arr = np.arange(n).reshape(_dims(m.group(1)))
        if m.group(2):
            arr = arr.transpose([int(x) for x in m.group(2).split(",")])
        return arr.reshape(sizes)
    return np.array([int(x) for x in spec.split(",") if x.strip()]).reshape(sizes)


def _mesh_axes_groups(text: str) -> list[list[int]]:
    """Replica groups of XLA's mesh-axes spelling: mesh['a'=2,'b'=4], device_ids=(...) {'b'}."""
    m = re.match(r"mesh\[(.*?)\](?:,\s*device_ids=\((.*?)\))?\s*\{(.*?)\}", text.strip())
    if not m:
        raise ValueError(f"cannot read mesh replica groups {text!r}")
    axes = re.findall(r"'([^']*)'\s*=\s*(\d+)", m.group(1))
    names, sizes = [a for a, _ in axes], [int(s) for _, s in axes]
    devices = _device_array(m.group(2), sizes)
    refs = []
    for name, pre, size in re.findall(r"'([^']*)'(?::\((\d+)\)(\d+))?", m.group(3)):
        inner = re.fullmatch(r"(.*):\((\d+)\)(\d+)", name)  # the sub-axis written inside the quotes
        if inner and inner.group(1) in names:
            name, pre, size = inner.groups()
        if name not in names:
            raise ValueError(f"replica groups name axis {name!r}, not one of the mesh's {names}")
        refs.append((names.index(name), int(pre) if pre else None, int(size) if size else None))
    if not refs:
        return [[int(d)] for d in devices.flat]
    # Split mesh axes into sub-axes where sub-axis references need it (major to minor).
    new_shape, grouped, offset = [], [], {}
    per_axis: dict[int, list] = defaultdict(list)
    for k, (ax, pre, size) in enumerate(refs):
        per_axis[ax].append((pre, size, k))
    slot_of_ref: dict[int, int] = {}
    for ax, full in enumerate(sizes):
        subs = per_axis.get(ax, [])
        if not subs or all(p is None for p, _, _ in subs):
            offset[ax] = len(new_shape)
            for _, _, k in subs:
                slot_of_ref[k] = len(new_shape)
            new_shape.append(full)
            continue
        prefix = 1
        for pre, size, k in sorted(subs, key=lambda t: t[0]):
            if pre != prefix:
                new_shape.append(pre // prefix)
                prefix = pre
            slot_of_ref[k] = len(new_shape)
            new_shape.append(size)
            prefix *= size
        if prefix != full:
            new_shape.append(full // prefix)
    grouped = [slot_of_ref[k] for k in range(len(refs))]
    arr = devices.reshape(new_shape)
    rest = [i for i in range(len(new_shape)) if i not in grouped]
    group_size = _prod(new_shape[i] for i in grouped)
    return arr.transpose(rest + grouped).reshape(-1, group_size).tolist()


def replica_groups(ins: Instr, num_devices: int) -> list[list[int]]:
    """Groups of logical device ids of a collective, in any of XLA's spellings."""
    if ins.opcode.startswith("collective-permute"):
        pairs = ins.attr("source_target_pairs") or "{}"
        return [[int(a), int(b)] for a, b in re.findall(r"\{(\d+),(\d+)\}", pairs)]
    i = ins.attrs.find("replica_groups=")
    if i < 0:
        return [list(range(num_devices))]
    s = ins.attrs[i + len("replica_groups="):]
    if s.startswith("{"):
        block = _balanced(s, 0, "{", "}")
        groups = [[int(x) for x in g.split(",") if x.strip()] for g in re.findall(r"\{([\d,\s]*)\}", block[1:-1])]
        return groups or [list(range(num_devices))]
    if s.startswith("["):
        m = re.match(r"\[[\d,]+\]<=\[[\d,]+\](?:T\([\d,]+\))?", s)
        return _iota_groups(m.group(0))
    if s.startswith("mesh["):
        return _mesh_axes_groups(s)
    if s.startswith("maximal_mesh"):
        return [[0]]
    raise ValueError(f"cannot read replica_groups of {ins.name}: {s[:80]!r}")


@dataclass
class Hardware:
    """Figures of one device, all in bytes/s, FLOP/s and seconds."""

    name: str
    peak_flops: float
    hbm_bandwidth: float
    ici_link_bandwidth: float  # one direction of one link
    dcn_bandwidth: float  # per chip
    physical_dims: int = 1  # torus dimensions (2 for v5e/v6e, 3 for v4/v5p)
    ici_step_latency_s: float = ICI_STEP_LATENCY_S
    dcn_step_latency_s: float = DCN_STEP_LATENCY_S


@dataclass
class CollectiveCost:
    kind: str  # all-gather, reduce-scatter, all-reduce, all-to-all, collective-permute, ...
    name: str
    computation: str
    executions: float  # per step (loop trip counts included)
    operand_bytes: float
    group_size: int
    axes: tuple[str, ...]  # mesh axes the groups span
    link: str  # "ici" | "dcn" | "none"
    bytes_per_execution: float  # bytes each device moves per execution
    seconds: float  # per step, all executions

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _traffic(kind: str, operand_bytes: float, n: int) -> float:
    if n <= 1:
        return 0.0
    if kind == "all-gather":
        return operand_bytes * (n - 1)
    if kind == "all-reduce":
        return 2 * operand_bytes * (n - 1) / n
    if kind in ("reduce-scatter", "all-to-all", "ragged-all-to-all"):
        return operand_bytes * (n - 1) / n
    return operand_bytes  # collective-permute / collective-broadcast: one hop


def _collective_kind(opcode: str) -> str | None:
    base = opcode[:-6] if opcode.endswith("-start") else opcode
    return base if base in COLLECTIVES else None


class DeviceLayout:
    """Logical device id -> mesh coordinates, slice and physical coordinates.

    Logical id i is mesh.devices.flat[i] (jax compiles a NamedSharding over the mesh's flat
    device order). On multi-slice TPU programs XLA compiles one program per slice
    (num_partitions = devices per slice) and ids count the devices of one slice, in the
    same flat order; cross-slice transfers are separate (megascale) operations."""

    def __init__(self, mesh_devices: np.ndarray | None, axis_names: Sequence[str] | None):
        self.axis_names = tuple(axis_names or ())
        self.local: list[int] | None = None
        if mesh_devices is None:
            self.shape, self.slices, self.coords = None, None, None
            return
        arr = np.asarray(mesh_devices, dtype=object)
        self.shape = arr.shape
        flat = list(arr.flat)
        self.slices = [getattr(d, "slice_index", 0) or 0 for d in flat]
        coords = [getattr(d, "coords", None) for d in flat]
        self.coords = None if any(c is None for c in coords) else [tuple(c) for c in coords]

    @property
    def num_devices(self) -> int | None:
        return _prod(self.shape) if self.shape is not None else None

    def use_partitions(self, num_partitions: int | None) -> None:
        """Map ids to the devices of the first slice when the program is per slice."""
        if self.shape is None or not num_partitions or num_partitions >= self.num_devices:
            return
        first = self.slices[0]
        self.local = [i for i, s in enumerate(self.slices) if s == first][:num_partitions]

    def dcn_axes(self) -> tuple[str, ...]:
        """Mesh axes along which the slice changes."""
        if self.shape is None:
            return ()
        sl = np.array(self.slices).reshape(self.shape)
        names = []
        for ax in range(sl.ndim):
            if (np.diff(sl, axis=ax) != 0).any():
                names.append(self.axis_names[ax] if ax < len(self.axis_names) else f"axis{ax}")
        return tuple(names)

    def span(self, groups: list[list[int]], kind: str) -> tuple[tuple[str, ...], str, int]:
        """(mesh axes spanned, link, physical torus dims spanned)."""
        if self.shape is None:
            return (), "ici", 1
        n = self.num_devices
        axes: set[int] = set()
        slices_cross = False
        phys: set[int] = set()
        for g in groups:
            if self.local is not None:
                g = [self.local[d] for d in g if d < len(self.local)]
            g = [d for d in g if d < n]
            if len(g) < 2:
                continue
            coords = np.array(np.unravel_index(g, self.shape)).T
            axes.update(int(i) for i in np.nonzero((coords != coords[0]).any(axis=0))[0])
            if len({self.slices[d] for d in g}) > 1:
                slices_cross = True
            if self.coords is not None:
                pc = np.array([self.coords[d] for d in g])
                phys.update(int(i) for i in np.nonzero((pc != pc[0]).any(axis=0))[0])
        names = tuple(self.axis_names[i] if i < len(self.axis_names) else f"axis{i}" for i in sorted(axes))
        if not axes:
            return (), "none", 0
        return names, ("dcn" if slices_cross else "ici"), max(len(phys), 1)


_MEGASCALE_KINDS = {"ALL_REDUCE": "all-reduce", "ALL_GATHER": "all-gather", "REDUCE_SCATTER": "reduce-scatter",
                    "ALL_TO_ALL": "all-to-all", "ONE_TO_ONE": "collective-permute"}


def _megascale(ins: Instr) -> tuple[str, int] | None:
    """(kind, slices in the group) of a TPU cross-slice (DCN) transfer: a host-transfer
    `send` carrying _xla_megascale_transfer_type; its `recv` half is not counted."""
    if ins.opcode != "send":
        return None
    m = re.search(r'_xla_megascale_transfer_type="?([A-Z_]+)', ins.attrs)
    if not m:
        return None
    kind = _MEGASCALE_KINDS.get(m.group(1), m.group(1).lower().replace("_", "-"))
    n = 2
    t = re.search(r'_xla_megascale_target="\{([^}]*)\}', ins.attrs)
    if t and kind != "collective-permute":
        members = 0
        for part in t.group(1).split(","):
            if ":" in part:
                a, b = part.split(":")
                members += int(b) - int(a) + 1
            elif part.strip():
                members += 1
        n = max(members, 1)
    return kind, n


def collectives(module: HloModule, graph: CallGraph, layout: DeviceLayout, hw: Hardware,
                num_devices: int) -> list[CollectiveCost]:
    out: list[CollectiveCost] = []
    seen_channels: dict[str, int] = {}
    layout.use_partitions(module.num_partitions)
    for comp in module.computations.values():
        mult = graph.multiplier.get(comp.name, 0.0)
        if mult == 0:
            continue
        for ins in comp.instrs:
            mega = _megascale(ins)
            if mega is not None:
                kind, n = mega
                operand_bytes = shape_bytes(_operand_shape(comp, ins.operands[0])) if ins.operands else 0.0
                per = _traffic(kind, operand_bytes, n)
                steps = 1 if kind == "collective-permute" else max(n - 1, 0)
                seconds = (per / hw.dcn_bandwidth + steps * hw.dcn_step_latency_s) * mult if per else 0.0
                out.append(CollectiveCost(kind, ins.name, comp.name, mult, operand_bytes, n, layout.dcn_axes(),
                                          "dcn", per, seconds))
                continue
            kind = _collective_kind(ins.opcode)
            if kind is None:
                continue
            channel = ins.attr("channel_id")
            if channel is not None:
                key = f"{kind}:{channel}"
                if key in seen_channels:  # the same transfer, copied into async fusions
                    prev = out[seen_channels[key]]
                    if mult > prev.executions:
                        out[seen_channels[key]] = dataclasses.replace(
                            prev, executions=mult, seconds=prev.seconds / max(prev.executions, 1e-30) * mult)
                    continue
            operand_bytes = sum(shape_bytes(_operand_shape(comp, o)) for o in ins.operands)
            if operand_bytes == 0:
                operand_bytes = shape_bytes(ins.shape)
            groups = replica_groups(ins, num_devices)
            n = max((len(g) for g in groups), default=1)
            axes, link, phys = layout.span(groups, kind)
            if layout.shape is None and n > 1:
                link = "ici"
            per = _traffic(kind, operand_bytes, n)
            if link == "dcn":
                bw, lat = hw.dcn_bandwidth, hw.dcn_step_latency_s
            else:
                links = 1 if kind in ("collective-permute", "collective-broadcast") else 2 * min(phys, max(hw.physical_dims, 1))
                bw, lat = hw.ici_link_bandwidth * links, hw.ici_step_latency_s
            steps = 1 if kind in ("collective-permute", "collective-broadcast") else max(n - 1, 0)
            seconds = 0.0 if link == "none" or per == 0 else (per / bw + steps * lat) * mult
            cost = CollectiveCost(kind, ins.name, comp.name, mult, operand_bytes, n, axes, link, per, seconds)
            if channel is not None:
                seen_channels[f"{kind}:{channel}"] = len(out)
            out.append(cost)
    return out


# ----------------------------------------------------------------------------- the model

@dataclass
class Roofline:
    """Predicted per-device costs of one step (everything here is a prediction)."""

    hardware: str
    flops_per_step: float  # per device, loop trip counts included
    hbm_bytes_per_step: float  # per device
    compute_s: float
    memory_s: float
    roofline_s: float  # sum over ops of max(compute, memory)
    comm_s: float
    exposed_comm_s: float
    step_time_s: float
    overlap_fraction: float
    collectives: list[CollectiveCost]
    trip_counts: dict[str, int]
    unknown_trip_counts: list[str]

    def predicted_mfu(self, model_flops_per_step: float, num_devices: int, peak_flops: float) -> float:
        if self.step_time_s <= 0:
            return 0.0
        return model_flops_per_step / num_devices / self.step_time_s / peak_flops

    def collectives_summary(self) -> list[dict]:
        """Collectives grouped by (kind, mesh axes, link), largest time first."""
        agg: dict[tuple, dict] = {}
        for c in self.collectives:
            key = (c.kind, c.axes, c.link)
            a = agg.setdefault(key, dict(kind=c.kind, axes=list(c.axes), link=c.link, count=0,
                                         executions=0.0, bytes=0.0, seconds=0.0))
            a["count"] += 1
            a["executions"] += c.executions
            a["bytes"] += c.bytes_per_execution * c.executions
            a["seconds"] += c.seconds
        return sorted(agg.values(), key=lambda a: -a["seconds"])

    def to_dict(self) -> dict:
        return {
            "predicted": True,
            "hardware": self.hardware,
            "flops_per_step": self.flops_per_step,
            "hbm_bytes_per_step": self.hbm_bytes_per_step,
            "compute_s": self.compute_s,
            "memory_s": self.memory_s,
            "roofline_s": self.roofline_s,
            "comm_s": self.comm_s,
            "exposed_comm_s": self.exposed_comm_s,
            "step_time_s": self.step_time_s,
            "overlap_fraction": self.overlap_fraction,
            "collectives": self.collectives_summary(),
            "trip_counts": dict(self.trip_counts),
            "unknown_trip_counts": list(self.unknown_trip_counts),
        }


def analyze(hlo_text: str, hw: Hardware, *, mesh=None, mesh_devices=None, axis_names=None,
            num_devices: int | None = None, overlap_fraction: float = OVERLAP_FRACTION) -> Roofline:
    """The roofline of one compiled step. Pass the jax `mesh` it was compiled for (or its
    `mesh_devices` array and `axis_names`) so collectives can be mapped to mesh axes."""
    if mesh is not None:
        mesh_devices, axis_names = mesh.devices, mesh.axis_names
    layout = DeviceLayout(mesh_devices, axis_names)
    num_devices = num_devices or layout.num_devices or 1
    module = parse_module(hlo_text)
    graph = call_graph(module)
    flops = bytes_ = compute = memory = roof = 0.0
    for comp in module.computations.values():
        mult = graph.multiplier.get(comp.name, 0.0)
        if mult == 0 or comp.name in graph.fused:
            continue
        for ins in comp.instrs:
            if ins.opcode in _NO_TRAFFIC or _collective_kind(ins.opcode) or ins.opcode.endswith("-done"):
                continue
            f = instr_flops(module, comp, ins)
            if f == 0 and ins.opcode == "fusion" and _fusion_is_collective(module, ins):
                continue  # a TPU async-collective wrapper: its traffic is the collective's
            b = instr_bytes(module, comp, ins)
            flops += f * mult
            bytes_ += b * mult
            tc, tm = f / hw.peak_flops, b / hw.hbm_bandwidth
            compute += tc * mult
            memory += tm * mult
            roof += max(tc, tm) * mult
    colls = collectives(module, graph, layout, hw, num_devices)
    comm = sum(c.seconds for c in colls)
    exposed = max(0.0, comm - overlap_fraction * roof)
    return Roofline(hw.name, flops, bytes_, compute, memory, roof, comm, exposed, roof + exposed,
                    overlap_fraction, colls, graph.trip_counts, graph.unknown_trip_counts)


def _fusion_is_collective(module: HloModule, ins: Instr) -> bool:
    """TPU async-collective fusions: their traffic is the collective's, priced as such."""
    called = module.computations.get((ins.attr("calls") or "").lstrip("%"))
    return called is not None and any(_collective_kind(i.opcode) for i in called.instrs)

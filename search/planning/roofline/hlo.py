"""HLO text: parsing, shapes, the call graph and loop trip counts (see search/planning/roofline/__init__.py)."""
from __future__ import annotations

import math
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable

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


# ----------------------------------------------------------------------------- parsing

def shape_bytes(shape: str) -> float:
    """Bytes of an HLO shape string (arrays and tuples; layouts ignored)."""
    total = 0.0
    for dtype, dims in _ARRAY_RE.findall(shape):
        if dtype not in DTYPE_BYTES:
            continue
        total += DTYPE_BYTES[dtype] * prod(parse_dims(dims))
    return total


_ARRAY_LAYOUT_RE = re.compile(r"\b([a-z][a-z0-9]*)\[([^\]]*)\](\{[^}]*\})?")
_MEMORY_SPACE_RE = re.compile(r"S\((\d+)\)")


def _memory_space(layout: str | None) -> int:
    m = _MEMORY_SPACE_RE.search(layout or "")
    return int(m.group(1)) if m else 0


def minor_dim(shape: str) -> int | None:
    """The logical dimension the first array of a shape lays along the lanes (its layout's minor-most: the first
    entry of `{minor_to_major...}`); None without a layout or for a scalar."""
    m = _ARRAY_LAYOUT_RE.search(shape)
    if not m or not m.group(3):
        return None
    first = m.group(3).strip("{}").split(":")[0].split(",")[0].strip()
    return int(first) if first.isdigit() else None


def tile(shape: str) -> tuple[int, ...] | None:
    """The first tile of the first array of a shape's TPU layout (T(8,128)(2,1): (8, 128)); None without one."""
    m = _ARRAY_LAYOUT_RE.search(shape)
    return _layout_tile(m.group(3)) if m else None


def memory_space(shape: str) -> int:
    """The memory space of the first array of a shape: 0 HBM (no `S(n)` in its layout), 1 TPU
    VMEM, 5 host memory, ..."""
    m = _ARRAY_LAYOUT_RE.search(shape)
    return _memory_space(m.group(3)) if m else 0


_TILE_RE = re.compile(r"T\(([\d,]+)\)")


def _layout_tile(layout: str | None) -> tuple[int, ...] | None:
    """The first tile of a TPU layout (`{minor_to_major:T(8,128)(2,1)}`: (8, 128)); None without one (CPU, GPU)."""
    t = _TILE_RE.search(layout) if layout and ":" in layout else None
    return tuple(int(x) for x in t.group(1).split(",")) if t else None


def _minor_to_major(layout: str) -> list[int]:
    """The dimension order of a layout `{minor_to_major:tiles...}`, minor-most first."""
    return [int(x) for x in layout[1:-1].split(":", 1)[0].split(",") if x.strip()]


def tiled_dims(dims: list[int], layout: str | None) -> list[int]:
    """The dimensions an array occupies in memory under its TPU layout (`{minor_to_major:T(a,b)...}`):
    its first tile pads the minor-most dimensions (in layout order) up to multiples of the tile's, the
    last entry of the tile the minor-most one (T(8,128): a head dim of 64 takes 128 lanes, a dim of 12
    heads in the second-minor place 16 sublanes). Without a tile (CPU, GPU layouts) the dimensions as
    they are."""
    first = _layout_tile(layout)
    if first is None or layout is None or not dims:
        return dims
    order = _minor_to_major(layout)
    if len(order) != len(dims):
        return dims
    out = list(dims)
    for k, size in enumerate(reversed(first)):
        if k < len(order) and size > 1:
            out[order[k]] = -(-out[order[k]] // size) * size
    return out


def lane_dim(shape: str) -> tuple[int, int, int] | None:
    """(index, size, size as tiled) of the minor-most dimension of a shape's first array under a TPU
    layout with a tile (the dimension that lies along the 128 lanes: T(8,128) pads a size of 64 to
    128); None without a tiled layout (CPU, GPU)."""
    m = _ARRAY_LAYOUT_RE.search(shape)
    if m is None or _layout_tile(m.group(3)) is None:
        return None
    dims = parse_dims(m.group(2))
    order = _minor_to_major(m.group(3))
    if not dims or len(order) != len(dims):
        return None
    return order[0], dims[order[0]], tiled_dims(dims, m.group(3))[order[0]]


def tiled_arrays(shape: str) -> Iterable[tuple[str, int, int, tuple[int, ...] | None]]:
    """(dtype, elements as its layout tiles them (tiled_dims), memory space, its first tile or None) of each array
    of a shape whose dtype has a size."""
    for dtype, dims, layout in _ARRAY_LAYOUT_RE.findall(shape):
        if dtype in DTYPE_BYTES:
            yield dtype, prod(tiled_dims(parse_dims(dims), layout)), _memory_space(layout), _layout_tile(layout)


def hbm_shape_bytes(shape: str) -> float:
    """Bytes a shape moves in HBM: each array as its layout lays it out (tiled_dims: TPU's tiles pad
    the minor-most dimensions, so a [.., 64] array of bf16 takes the bytes of [.., 128]); arrays whose
    layout puts them in another memory space (`S(1)`: TPU VMEM, chosen by XLA's memory-space
    assignment; `S(5)`: host memory) are left out."""
    return float(sum(DTYPE_BYTES[dtype] * n for dtype, n, space, _ in tiled_arrays(shape) if space == 0))


def shape_dims(shape: str) -> list[int]:
    """Dimensions of the first array in a shape string."""
    m = _ARRAY_RE.search(shape)
    return parse_dims(m.group(2)) if m else []


def parse_dims(text: str) -> list[int]:
    """The integers of a dimension list ("8,<=16" -> [8, 16]: a bounded dimension counts its bound)."""
    return [int(d.replace("<=", "")) for d in text.split(",") if d.strip()]


def prod(xs: Iterable[int]) -> int:
    """Product of integers, as an int (1 for none)."""
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
            return balanced(s, i, "{", "}")
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
    is_scheduled: bool = False  # instruction order is the schedule (`is_scheduled=true`)


def balanced(s: str, i: int, open_: str, close: str) -> str:
    """The bracketed span of s that opens at s[i], up to its matching `close` (the rest of s if none)."""
    depth = 0
    for j in range(i, len(s)):
        if s[j] == open_:
            depth += 1
        elif s[j] == close:
            depth -= 1
            if depth == 0:
                return s[i:j + 1]
    return s[i:]


def split_top_level(s: str) -> list[str]:
    """s split at the commas outside any bracket, each part stripped, empty parts dropped."""
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
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
        shape = balanced(rest, 0, "(", ")")
    else:
        shape = rest.split(" ", 1)[0]
    rest = rest[len(shape):].lstrip()
    k = rest.find("(")
    if k < 0:
        return None
    opcode = rest[:k].strip()
    args = balanced(rest, k, "(", ")")
    attrs = rest[k + len(args):].lstrip(", ")
    operands = []
    for a in split_top_level(args[1:-1]):
        tok = a.split()[-1] if a.split() else a
        operands.append(tok.lstrip("%"))
    return Instr(name, shape, opcode, operands, attrs, root)


def parse_module(text: str) -> HloModule:
    """Parse optimized HLO text (as `compiled.as_text()` prints it)."""
    comps: dict[str, Computation] = {}
    entry = None
    partitions = None
    scheduled = False
    cur: Computation | None = None
    for raw in text.splitlines():
        line = _COMMENT_RE.sub("", raw).rstrip()
        if line.startswith("HloModule"):
            m = re.search(r"num_partitions=(\d+)", line)
            partitions = int(m.group(1)) if m else None
            scheduled = bool(re.search(r"\bis_scheduled=true\b", line))
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
    return HloModule(comps, entry, partitions, scheduled)


def operand_shape(comp: Computation, name: str) -> str:
    """Shape string of instruction `name` of comp ("" when comp has no such instruction)."""
    ins = comp.by_name.get(name)
    return ins.shape if ins is not None else ""


# ----------------------------------------------------------------------------- collectives

COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute",
               "collective-broadcast", "ragged-all-to-all")


def collective_kind(opcode: str) -> str | None:
    """The collective an opcode performs (its -start half too), or None."""
    base = opcode[:-6] if opcode.endswith("-start") else opcode
    return base if base in COLLECTIVES else None


_OP_NAME = re.compile(r'op_name="([^"]*)"')


def op_name(ins: Instr) -> str | None:
    """The op_name jax gave an instruction (its metadata), None where it has none."""
    m = _OP_NAME.search(ins.attrs)
    return m.group(1) if m else None


def called_computation(module: HloModule, ins: Instr) -> Computation | None:
    """The computation an instruction's `calls=` names (a fusion's, an async-start's); None where none."""
    return module.computations.get((ins.attr("calls") or "").lstrip("%"))


def fused_walk(module: HloModule | None, comp: Computation | None, ins: Instr, _depth: int = 0):
    """(computation, instruction) of an instruction and, for a fusion, of every instruction it calls, at
    any depth (8 at most)."""
    yield comp, ins
    if module is None or ins.opcode != "fusion" or _depth >= 8:
        return
    called = called_computation(module, ins)
    for i in called.instrs if called is not None else ():
        yield from fused_walk(module, called, i, _depth + 1)


# ----------------------------------------------------------------------------- call graph

def callees(ins: Instr) -> list[tuple[str, str]]:
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
        called = called_computation(module, ins)
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
    called = called_computation(module, ins)
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
            called = callees(ins)
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



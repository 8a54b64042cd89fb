"""Ops whose time is not their bytes or their FLOPs at the matmul rate: row gathers and scatters
(a MoE layer's token dispatch and combine) and ragged dots (its dropless grouped matmuls), each priced
at what the chip was measured to do (Hardware.index_rows, Hardware.ragged_shares; trainer/hardware.py).

A TPU scatter moves its update rows one at a time: on the project's v5e a sorted scatter of 32,768
rows of 1,024 bf16 took 879 us (27 ns a row) where its 134 MB at the HBM roofline would take 0.2 ms,
and a MoE step's scatters ran 5-9x their roofline price (benchmarks/RESULTS.md, 'MoE dispatch and
ragged dots on the chip'). So an instruction holding gathers or scatters takes at least rows x the
measured seconds per row at its row size (index_seconds), and a ragged dot's FLOPs (the TPU's
ragged-dot kernel, or its masked-group convolution form) run at the measured share of peak for its
shape and direction (ragged_share).
"""
from __future__ import annotations

import math

from .chip import Hardware, log_interp
from .hlo import (
    DTYPE_BYTES,
    Computation,
    HloModule,
    Instr,
    fused_walk,
    op_name,
    operand_shape,
    parse_dims,
    prod,
    shape_dims,
)


def _itemsize(shape: str) -> float:
    return DTYPE_BYTES.get(shape.split("[", 1)[0].strip(), 4)


def _window(text: str | None) -> set[int]:
    return set(parse_dims(text.strip("{}"))) if text else set()


def index_op(module: HloModule, comp: Computation, ins: Instr) -> tuple[str, int, int, bool] | None:
    """(kind, rows, row bytes, sorted) of one gather or scatter: kind "gather", "scatter" or
    "scatter_add" (a scatter whose combiner adds), the rows its indices move (the index dims of the
    updates or of the output) and the bytes of one row (its window); None for any other op."""
    if ins.opcode == "gather":
        dims = shape_dims(ins.shape)
        window = _window(ins.attr("offset_dims"))
        rows = prod(d for i, d in enumerate(dims) if i not in window)
        width = prod(d for i, d in enumerate(dims) if i in window)
        return "gather", rows, int(width * _itemsize(ins.shape)), ins.attr("indices_are_sorted") == "true"
    if ins.opcode == "scatter" and len(ins.operands) >= 3:
        upd = operand_shape(comp, ins.operands[-1])
        dims = shape_dims(upd)
        window = _window(ins.attr("update_window_dims"))
        rows = prod(d for i, d in enumerate(dims) if i not in window)
        width = prod(d for i, d in enumerate(dims) if i in window)
        combiner = module.computations.get((ins.attr("to_apply") or "").lstrip("%"))
        root = combiner.root if combiner is not None else None
        kind = "scatter_add" if root is not None and root.opcode == "add" else "scatter"
        return kind, rows, int(width * _itemsize(upd)), ins.attr("indices_are_sorted") == "true"
    return None


def index_ops(module: HloModule, comp: Computation, ins: Instr) -> list[tuple[str, int, int, bool]]:
    """The gathers and scatters an instruction is or (a fusion) holds, at any depth."""
    return [op for c, i in fused_walk(module, comp, ins) if (op := index_op(module, c, i)) is not None]


def _interp(pts, x: float, proportional_above: bool) -> float:
    """chip.log_interp, or proportional to x above the last point (`proportional_above`)."""
    if proportional_above and x > pts[-1][0]:
        return pts[-1][1] * x / pts[-1][0]
    return log_interp(pts, x)


def row_seconds(hw: Hardware, kind: str, row_bytes: int, rows: int, sorted_: bool = True) -> float | None:
    """Seconds per row of a `kind` op moving `rows` rows of `row_bytes` (Hardware.index_rows): at each
    measured row count, linear in log2(row bytes) between the measured sizes and proportional to the
    bytes above the largest; then linear in log2(rows) between the measured row counts
    and held outside them. Unsorted indices: x the kind's Hardware.unsorted_index factor (measured at rows
    of 2 KiB). Rows narrower than the narrowest measured (128 B on v5e: a MoE layer's int32 index maps and
    routing weights, 4 B a row) take its time: a row's cost has a floor that the narrow rows already show
    (v5e, 32768 rows: a scatter 10.5 ns at 512 B, 5.8 at 256, 4.6 at 128; a gather 2-3 ns at any of them).
    None: no figures."""
    tables = sorted((n, pts) for k, n, pts in hw.index_rows if k == kind and pts)
    if not tables or row_bytes <= 0:
        return None
    row_bytes = max(row_bytes, min(pts[0][0] for _, pts in tables))
    per_count = [(n, _interp(pts, row_bytes, True)) for n, pts in tables]
    t = _interp(per_count, max(rows, 1), False)
    return t if sorted_ else t * dict(hw.unsorted_index).get(kind, 1.0)


def index_seconds(module: HloModule, comp: Computation, ins: Instr, hw: Hardware) -> float | None:
    """The measured per-row time of the gathers and scatters an instruction holds, summed; None where it
    holds none or the chip has no figures for them."""
    if not hw.index_rows:
        return None
    total, priced = 0.0, False
    for kind, rows, row_bytes, sorted_ in index_ops(module, comp, ins):
        t = row_seconds(hw, kind, row_bytes, rows, sorted_)
        if t is not None:
            total += rows * t
            priced = True
    return total if priced else None


def is_backward(ins: Instr) -> bool:
    """Whether an op belongs to the backward pass: its op_name is under jax's transpose(...), or it has
    none of jax's (the ragged dot's weight gradient, a masked-group convolution, carries no op_name; libtpu
    0.0.42.1's ragged-dot kernel of the lhs gradient only its own name, no jit(...)/ path)."""
    name = op_name(ins)
    return name is None or "transpose(" in name or "/" not in name


def _labels(ins: Instr) -> tuple[str, str, str]:
    labels = ins.attr("dim_labels") or ""
    if "->" not in labels or "_" not in labels:
        return "", "", ""
    lhs, rest = labels.split("_", 1)
    rhs, out = rest.split("->")
    return lhs, rhs, out


def mask_rows(comp: Computation, g: int) -> int | None:
    """The rows of the pred[G, rows] group mask a computation takes (a ragged dot's convolution form), or None."""
    for i in comp.instrs:
        dims = shape_dims(i.shape) if i.opcode == "parameter" and i.shape.startswith("pred[") else []
        if len(dims) == 2 and dims[0] == g:
            return dims[1]
    return None


def ragged_dims(comp: Computation, ins: Instr) -> tuple[int, int]:
    """The two feature dims K and N of a ragged dot (rows and groups aside), smaller first. The kernel
    (a custom call): lhs [rows, K] against the groups' [G, K, N] (its last operand), or a [G, K, N] weight
    gradient. A convolution over the G groups: of its contracted dim (the kernel's 'i') and the output's
    'b' and 'f', the two that are not the rows; the rows are the group mask's (pred[G, rows], which its
    computation takes), else the output's 'b' (the forward and input-gradient forms)."""
    out = shape_dims(ins.shape)
    if ins.opcode == "convolution" and len(ins.operands) >= 2:
        _, rhs_l, out_l = _labels(ins)
        rhs = shape_dims(operand_shape(comp, ins.operands[1]))
        if not ({"i"} <= set(rhs_l) and {"b", "f", "0"} <= set(out_l)) or len(rhs) != len(rhs_l) or len(out) != len(
                out_l):
            return 0, 0
        dims = [rhs[rhs_l.index("i")], out[out_l.index("b")], out[out_l.index("f")]]
        rows = mask_rows(comp, out[out_l.index("0")]) or dims[1]
        if rows in dims:
            dims.remove(rows)
        else:
            dims.pop(1)
        k, n = dims
    elif len(out) == 3:
        k, n = out[1], out[2]
    else:
        rhs = shape_dims(operand_shape(comp, ins.operands[-1])) if ins.operands else []
        k, n = (rhs[-2], rhs[-1]) if len(rhs) == 3 else (0, 0)
    return (k, n) if k <= n else (n, k)


def ragged_share(hw: Hardware, dims: tuple[int, int], backward: bool, megablox: bool = False) -> float | None:
    """The measured share of peak of a ragged dot with feature dims `dims` (Hardware.ragged_shares, or
    Hardware.megablox_shares for the megablox kernels: the measured shape nearest in log2 of both dims), its
    forward or backward figure; None: no figures."""
    table = hw.megablox_shares if megablox else hw.ragged_shares
    if not table or min(dims) <= 0:
        return None
    lk, ln = math.log2(dims[0]), math.log2(dims[1])
    _, _, fwd, bwd = min(table, key=lambda r: (math.log2(min(r[0], r[1])) - lk) ** 2
                         + (math.log2(max(r[0], r[1])) - ln) ** 2)
    return bwd if backward else fwd

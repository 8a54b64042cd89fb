"""Per-instruction costs: FLOPs and HBM bytes of each instruction that runs on its own, and
its time on one chip's Hardware (see search/planning/roofline/__init__.py)."""
from __future__ import annotations

import json
import re
from collections import defaultdict
from typing import NamedTuple

import numpy as np

from . import indexed, vpu
from .chip import Hardware
from .dma import moves_dma_bytes
from .hlo import (
    Computation,
    HloModule,
    Instr,
    called_computation,
    collective_kind,
    fused_walk,
    hbm_shape_bytes,
    lane_dim,
    op_name,
    operand_shape,
    prod,
    shape_bytes,
    shape_dims,
    split_top_level,
)

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


# jax's primitive of jax.lax.ragged_dot; libtpu 0.0.42.1 names the kernel of its lhs gradient only by the kernel's
# own name (op_name="ragged-dot-none", no jax path)
_RAGGED_DOT = re.compile(r'op_name="(?:[^"]*ragged_dot_general\b|ragged-dot-)')
# the megablox kernels' pallas_call, under jax's jit of gmm (forward, lhs gradient) or tgmm (weight gradient)
_MEGABLOX = re.compile(r'op_name="[^"]*jit\(t?gmm\)\)*/pallas_call')


def _group_mask(comp: Computation | None, g: int) -> bool:
    """Whether a computation takes a pred[G, rows] parameter: the group mask of a ragged dot's masked
    convolution form (libtpu 0.0.42.1 writes the weight gradient so, in a fusion without an op_name)."""
    return comp is not None and indexed.mask_rows(comp, g) is not None


def ragged_dot_groups(ins: Instr, lhs_shape: str, rhs_shape: str, comp: Computation | None = None) -> int:
    """The groups of a ragged dot as the TPU compiler writes it (jax.lax.ragged_dot, trainer/moe.py's
    dropless experts): a convolution whose one spatial dim is the G groups (lhs, kernel and output all G
    long) with window G, stride G - 1 and lhs dilation G, so output group g meets kernel group g only; its
    operands are every row broadcast to each group and masked to the group's rows (the fusion is handed the
    group offsets). A batched matmul over the groups (the capacity experts' einsum 'ecd,edf->ecf') is
    written as the same convolution, each group with rows of its own: the two are told apart by the
    op_name jax gives the instruction (ragged_dot_general), or where it has none (libtpu 0.0.42.1's weight
    gradient), by the group mask its computation takes (_group_mask); an instruction whose op_name names
    anything else is not a ragged dot, whatever masks its computation takes (the capacity einsum's fusion
    is handed the dispatch's masks too). 1 for any other convolution."""
    named = bool(_RAGGED_DOT.search(ins.attrs))
    if not named and (comp is None or op_name(ins)):
        return 1
    win = _window(ins)
    labels = ins.attr("dim_labels") or ""
    if len(win) != 1 or "->" not in labels:
        return 1
    g, w = win[0]["size"], win[0]
    lhs_l, rest = labels.split("_", 1)
    rhs_l, out_l = rest.split("->")
    dims = [shape_dims(lhs_shape), shape_dims(rhs_shape), shape_dims(ins.shape)]
    spatial = [d[lab.index("0")] if "0" in lab and len(d) == len(lab) else None
               for d, lab in zip(dims, (lhs_l, rhs_l, out_l), strict=True)]
    if g > 1 and spatial == [g, g, g] and w["stride"] == g - 1 and w["base_dilation"] == g and w["pad_low"] == 0:
        return g if named or _group_mask(comp, g) else 1
    return 1


def conv_flops(ins: Instr, lhs_shape: str, rhs_shape: str, comp: Computation | None = None) -> float:
    """FLOPs of a convolution, counted as XLA's HloCostAnalysis counts them; a ragged dot's
    (ragged_dot_groups G > 1) as the work of its groups: 1 / G of that count, every row once. XLA counts
    every row against every group's weights (G x the routed work), which is the dense expansion; the TPU's
    ragged dot computes each group's rows only (MaxText documents jax.lax.ragged_dot on TPU as computing
    "only on active tokens": docs/reference/core_concepts/moe_configuration.md, sparse_matmul)."""
    groups = ragged_dot_groups(ins, lhs_shape, rhs_shape, comp)
    return _conv_flops(ins, lhs_shape, rhs_shape) / groups


def _conv_flops(ins: Instr, lhs_shape: str, rhs_shape: str) -> float:
    labels = ins.attr("dim_labels")
    lhs, rhs, out = shape_dims(lhs_shape), shape_dims(rhs_shape), shape_dims(ins.shape)
    if not labels or "->" not in labels:
        return 2.0 * prod(out)
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
    return 2.0 * (in_feat // fgc) * out_feat * (batch // bgc) * prod(counts)


# Pallas splash-attention kernels (TPU custom calls, named by their kernel): XLA cannot see
# into them, so their matmuls are counted here from the query-shaped operand (..., H, S, D):
# forward QK^T and PV (2); dK/dV recomputes QK^T then P^T dO, dO V^T and dS^T Q (4); dQ
# recomputes QK^T then dO V^T and dS K (3). Each matmul is 2 S^2 D FLOPs per head, over the
# causal blocks splash computes: n (n + 1) / 2 of n^2 for n = S / block.
SPLASH_MATMULS = (("splash_mha_fwd", 2), ("splash_mha_dkv", 4), ("splash_mha_dq", 3))


def splash_matmuls(ins: Instr) -> int:
    """How many S x S matmuls one splash-attention kernel runs per head (0: not a splash kernel)."""
    return next((k for name, k in SPLASH_MATMULS if name in ins.name), 0) if ins.opcode == "custom-call" else 0


def _splash_query(comp: Computation, ins: Instr) -> list[int] | None:
    """The dims (..., H, S, D) of a splash kernel's query-shaped operand (its largest of rank >= 3)."""
    shapes = [shape_dims(operand_shape(comp, o)) for o in ins.operands]
    return max((d for d in shapes if len(d) >= 3), key=prod, default=None)


def _q_shaped(comp: Computation, ins: Instr, q: list[int]) -> list[list[int]]:
    """The dims of a splash call's operands shaped as its query but for heads and head dim (q itself, K, V,
    dO, ...): the same rank, batch dims and sequence."""
    return [k for k in (shape_dims(operand_shape(comp, o)) for o in ins.operands)
            if len(k) == len(q) and k[:-3] == q[:-3] and k[-2] == q[-2]]


def splash_head_dim(comp: Computation, ins: Instr) -> int | None:
    """The head dim of one splash-attention custom call (None for any other instruction)."""
    q = _splash_query(comp, ins) if splash_matmuls(ins) else None
    return q[-1] if q else None


def splash_block(comp: Computation, ins: Instr) -> int | None:
    """The q block of one splash-attention custom call: its first operand is the mask's block map
    (h, q blocks, kv blocks), so S / q blocks (None where that operand is not such a map)."""
    q = _splash_query(comp, ins) if splash_matmuls(ins) and ins.operands else None
    if not q:
        return None
    first = shape_dims(operand_shape(comp, ins.operands[0]))
    s = q[-2]
    if len(first) == 3 and 0 < first[1] <= s // 128 and s % first[1] == 0:
        return s // first[1]
    return None


def splash_grid_key(comp: Computation, ins: Instr,
                    q: list[int] | None = None) -> tuple[int, int | None, int, int, int] | None:
    """(seq, q block, head dim, query heads per K/V head, batch x K/V heads) of one splash-attention custom call:
    what Hardware.grid_share looks its rate up by (None for any other instruction). `q`: its query's dims where the
    caller has them (_splash_query)."""
    q = q or (_splash_query(comp, ins) if splash_matmuls(ins) else None)
    if not q:
        return None
    kv_heads = min((k[-3] for k in _q_shaped(comp, ins, q) if k[-1] == q[-1]), default=q[-3])
    return q[-2], splash_block(comp, ins), q[-1], q[-3] // max(kv_heads, 1), prod(q[:-3]) * kv_heads


def splash_grid_rate(hw: Hardware, kernel: str, key: tuple) -> float | None:
    """FLOP/s of the splash kernel named `kernel` with splash_grid_key `key`: its share measured inside training
    steps where its shape lies inside theirs (Hardware.step_grid_share), else its grid share (Hardware.grid_share; a
    head dim above the measured one at that one's rate, one below at d / it) over its in-step factor
    (Hardware.grid_in_step); None where neither table has a row for it."""
    stepped = hw.step_grid_share(kernel, *key) if hw.attention_step_grid else None
    if stepped is not None:
        return hw.peak_flops * stepped
    found = hw.grid_share(kernel, *key) if hw.attention_grid else None
    if found is None:
        return None
    share, measured_d = found
    return hw.peak_flops * share * (min(key[2], measured_d) / measured_d) / hw.grid_in_step(kernel)


def splash_flops(comp: Computation, ins: Instr) -> float:
    """FLOPs of one splash-attention custom call (0 for any other custom call)."""
    matmuls = splash_matmuls(ins)
    if not matmuls:
        return 0.0
    q = _splash_query(comp, ins)
    if q is None:
        return 0.0
    s, d = q[-2], q[-1]
    from ....trainer.attention import splash_block  # the block size the kernel was built with
    n = s // splash_block(s) if s % 128 == 0 else 1
    causal = (n + 1) / (2 * n)
    # the value head dim: an operand shaped as q but for its heads and last dim (MLA: v 128 against q/k 192)
    dv = next((k[-1] for k in _q_shaped(comp, ins, q) if k[-1] != d), d)
    # of the kernel's S x S matmuls, those contracting or writing the value dim: forward P V (1 of 2); dK/dV
    # dV and dP (2 of 4); dQ dP (1 of 3)
    on_v = {2: 1, 4: 2, 3: 1}.get(matmuls, matmuls // 2)
    return 2.0 * s * s * ((matmuls - on_v) * d + on_v * dv) * prod(q[:-2]) * causal


# cuDNN flash-attention custom calls (XLA GPU, `__cudnn$fmha...`): XLA cannot see into them
# either. Their backend_config carries the score shape [B, H, Sq, Skv] and the mask; the head
# dims come from q, k and v (operands 0-2 of the forward and the backward call). FLOPs as cuDNN's
# own benchmark counts them (cudnn-frontend benchmark/sdpa_benchmark_training): 2 x (d_qk + d_v)
# per computed score in the forward (QK^T, PV), 2 x (3 d_qk + 2 d_v) in the backward (QK^T again,
# dV, dP, dQ, dK), over the scores the mask leaves (causal: the lower triangle, S (S + 1) / 2).
CUDNN_FMHA = "__cudnn$fmha"


def is_cudnn_fmha(ins: Instr) -> bool:
    """Whether an instruction is a cuDNN flash-attention call (forward or backward)."""
    return ins.opcode == "custom-call" and CUDNN_FMHA in (ins.attr("custom_call_target") or "")


def is_attention_kernel(ins: Instr) -> bool:
    """Whether an instruction is an attention kernel whose matmuls XLA cannot see: a Pallas splash
    kernel (TPU) or a cuDNN flash-attention call (GPU). Their FLOPs are priced at
    Hardware.attention_efficiency."""
    return bool(splash_matmuls(ins)) or is_cudnn_fmha(ins)


def _cudnn_operand_shapes(comp: Computation, ins: Instr) -> list[list[int]]:
    """The operands' dims: from operand_layout_constraints (XLA writes it on every cuDNN call),
    else from the operands' producers."""
    constraints = ins.attr("operand_layout_constraints")
    if constraints:
        return [shape_dims(s) for s in split_top_level(constraints[1:-1])]
    return [shape_dims(operand_shape(comp, o)) for o in ins.operands]


def cudnn_fmha_flops(comp: Computation, ins: Instr) -> float:
    """FLOPs of one cuDNN flash-attention call (0 for any other instruction, or one whose
    backend_config does not say its score shape)."""
    if not is_cudnn_fmha(ins):
        return 0.0
    try:
        cfg = json.loads(ins.attr("backend_config") or "{}").get("cudnn_fmha_backend_config", {})
        b, h, sq, skv = (int(d) for d in cfg["intermediate_tensor_shape"]["dimensions"])
    except (ValueError, KeyError, TypeError):
        return 0.0
    shapes = _cudnn_operand_shapes(comp, ins)
    if len(shapes) < 3 or not all(shapes[:3]) or not b * h * sq * skv:
        return 0.0
    q, k, v = (prod(d) for d in shapes[:3])
    d_qk = q / (b * h * sq)
    d_v = d_qk * v / k  # k and v have the same heads (GQA: fewer than q) and the same sequence
    mask = str(cfg.get("mask_type", ""))
    if "CAUSAL" in mask:  # top-left aligned: query i sees keys 0..i
        n = min(sq, skv)
        scores = n * (n + 1) / 2 + max(sq - skv, 0) * skv
    else:
        scores = float(sq * skv)
    per_score = 3 * d_qk + 2 * d_v if "Backward" in (ins.attr("custom_call_target") or "") else d_qk + d_v
    return 2.0 * b * h * scores * per_score


def _grouped_kernel(ins: Instr, *names: re.Pattern) -> bool:
    """Whether an instruction is a grouped-matmul kernel call whose op_name one of `names` matches: a
    custom call over the group metadata and the two matrices (its last two operands), not a group-metadata
    call (one s32 operand)."""
    return (ins.opcode == "custom-call" and len(ins.operands) >= 3 and any(n.search(ins.attrs) for n in names)
            and not ins.shape.startswith(("(", "s32")))


def is_megablox_kernel(ins: Instr) -> bool:
    """Whether an instruction is one of the Pallas megablox kernels (trainer/moe.py with
    ModelConfig.grouped_matmul "megablox"): a tpu_custom_call under jit(gmm) or jit(tgmm) whose last two
    operands are the two matrices, as the TPU's ragged-dot kernel's."""
    return _grouped_kernel(ins, _MEGABLOX)


def is_ragged_dot_kernel(ins: Instr) -> bool:
    """Whether an instruction is the TPU's ragged-dot kernel: on v5p the compiler writes jax.lax.ragged_dot
    as a tpu_custom_call (named ragged-dot-..., its op_name ragged_dot_general) over the group metadata
    and the two matrices (its last two operands); not its group-metadata call (one s32 operand). The
    megablox kernels (is_megablox_kernel) have the same operands and count the same."""
    return _grouped_kernel(ins, _RAGGED_DOT, _MEGABLOX)


def ragged_dot_kernel_flops(comp: Computation, ins: Instr) -> float:
    """FLOPs of one ragged-dot kernel, every row once (0 for any other instruction): 2 x rows x K x N. The
    forward and the lhs gradient write [rows, N] from lhs [rows, K] and the groups' [G, K, N]; the rhs
    gradient writes [G, K, N] from [rows, K] and [rows, N]. Rows are all the rows handed to the kernel:
    under expert parallelism (trainer/moe.py all-gathers every device's routes) those of other devices'
    experts lie outside every group, so this is then an upper bound."""
    if not is_ragged_dot_kernel(ins):
        return 0.0
    lhs = shape_dims(operand_shape(comp, ins.operands[-2]))
    out = shape_dims(ins.shape)
    if len(lhs) != 2 or len(out) not in (2, 3):
        return 0.0
    rows = lhs[0]
    k_times_n = lhs[1] * out[1] if len(out) == 2 else out[1] * out[2]
    return 2.0 * rows * k_times_n


def instr_flops(module: HloModule, comp: Computation, ins: Instr, _depth: int = 0) -> float:
    """FLOPs of one instruction; a fusion's are those of its fused computation."""
    op = ins.opcode
    if op == "custom-call":
        return splash_flops(comp, ins) or cudnn_fmha_flops(comp, ins) or ragged_dot_kernel_flops(comp, ins)
    if op == "dot":
        lhs = shape_dims(operand_shape(comp, ins.operands[0])) if ins.operands else []
        cdims = ins.attr("lhs_contracting_dims")
        k = prod(lhs[int(d)] for d in cdims.strip("{}").split(",") if d.strip()) if cdims and lhs else 1
        return 2.0 * prod(shape_dims(ins.shape)) * k
    if op == "convolution" and len(ins.operands) >= 2:
        return conv_flops(ins, operand_shape(comp, ins.operands[0]), operand_shape(comp, ins.operands[1]), comp)
    if op in ("fusion",) and _depth < 8:
        called = called_computation(module, ins)
        if called is None:
            return 0.0
        return sum(instr_flops(module, called, i, _depth + 1) for i in called.instrs)
    if op in _ELEMENTWISE:
        return float(sum(prod(shape_dims(s)) for s in [ins.shape]) if not ins.shape.startswith("(") else 0)
    if op in ("reduce", "reduce-window") and ins.operands:
        return float(prod(shape_dims(operand_shape(comp, ins.operands[0]))))
    return 0.0


def _param_index(ins: Instr) -> int | None:
    m = re.match(r"\s*(\d+)", ins.operands[0] if ins.operands else "")
    return int(m.group(1)) if m else None


# custom calls that move no bytes: AllocateBuffer gives a buffer without writing it (TPU: the
# stacked buffer a scan's per-layer dynamic-update-slices then fill; priced at its whole result, it
# added 11-43 ms to the steps of benchmarks/calibrate_onchip.py's points)
_NO_TRAFFIC_CALLS = ("AllocateBuffer",)


def instr_bytes(module: HloModule, comp: Computation, ins: Instr) -> float:
    """HBM bytes one instruction reads and writes (see the module docstring)."""
    return sum(instr_read_write(module, comp, ins))


def instr_read_write(module: HloModule, comp: Computation, ins: Instr) -> tuple[float, float]:
    """(HBM bytes read, HBM bytes written) of one instruction (instr_bytes is their sum)."""
    if ins.opcode == "custom-call" and (ins.attr("custom_call_target") or "").strip('"') in _NO_TRAFFIC_CALLS:
        return 0.0, 0.0
    operand_bytes = [hbm_shape_bytes(operand_shape(comp, o)) for o in ins.operands]
    out_bytes = hbm_shape_bytes(ins.shape)
    if ins.opcode == "dynamic-slice":
        return out_bytes + sum(operand_bytes[1:]), out_bytes
    if ins.opcode == "dynamic-update-slice" and len(operand_bytes) >= 2:
        return operand_bytes[1] + sum(operand_bytes[2:]), operand_bytes[1]
    if ins.opcode == "copy-start" and ins.shape.startswith("("):  # (destination, source, context)
        return sum(operand_bytes), hbm_shape_bytes(split_top_level(ins.shape[1:-1])[0])
    if ins.opcode.endswith("slice-start") and ins.shape.startswith("(("):
        # TPU async slice DMA: ((source), slice, context). It reads the slice of the source,
        # not the source (which the tuple only aliases), and writes the slice where it lives.
        parts = split_top_level(ins.shape[1:-1])
        if len(parts) >= 2:
            read = shape_bytes(parts[1]) if operand_bytes and operand_bytes[0] > 0 else 0.0
            return read, hbm_shape_bytes(parts[1])
    if ins.opcode == "slice" and operand_bytes:
        # reads its slice of the source, not the source: the same DMA as the slice-start above
        # (XLA's dump prints that one as an async-start calling a computation of this slice)
        return (shape_bytes(ins.shape) if operand_bytes[0] > 0 else 0.0), out_bytes
    if ins.opcode != "fusion":
        return sum(operand_bytes), out_bytes
    called = called_computation(module, ins)
    if called is None:
        return sum(operand_bytes), out_bytes
    users = _users(called)
    params = {p.name: _param_index(p) for p in called.instrs if p.opcode == "parameter"}
    total = 0.0
    in_place_outputs = 0.0
    for pname, idx in params.items():
        if idx is None or idx >= len(operand_bytes):
            continue
        full = operand_bytes[idx]
        uses = _through_bitcasts(called, pname, users)
        sliced = _sliced_read(module, called, pname, users)
        if uses and all(u.opcode == "dynamic-update-slice" and pos == 0 for u, pos in uses):
            # updated in place: the update is written (the result's bytes below) and nothing of the
            # buffer is read (the update's own operands are counted as the fusion's other parameters)
            upd = min(full, sum(shape_bytes(operand_shape(called, u.operands[1])) for u, _ in uses))
            in_place_outputs += full - upd
        elif sliced is not None:
            total += min(full, sliced)
        else:
            total += full
    return total, max(out_bytes - in_place_outputs, 0.0)


def _users(comp: Computation) -> dict[str, list[tuple[Instr, int]]]:
    users: dict[str, list[tuple[Instr, int]]] = defaultdict(list)
    for i in comp.instrs:
        for pos, o in enumerate(i.operands):
            users[o].append((i, pos))
    return users


def _sliced_read(module: HloModule, comp: Computation, pname: str, users=None, depth: int = 0) -> float | None:
    """Bytes read of fusion parameter `pname` when every use reads only a dynamic-slice of
    it, directly, through bitcasts, through a pad (a fusion computes each element of the slice
    of a padded operand from one element of the operand or the pad value: the windowed-einsum
    loops of tensor parallelism slice a padded activation this way), or through a nested fusion
    whose parameter is read that way (TPU nests the per-layer slice of a scan's stacked buffer
    one fusion deeper); None when some use reads it whole."""
    users = users if users is not None else _users(comp)
    uses = _through_bitcasts(comp, pname, users)
    if not uses:
        return None
    total = 0.0
    for u, pos in uses:
        if u.opcode == "dynamic-slice" and pos == 0:
            total += shape_bytes(u.shape)
            continue
        if u.opcode == "pad" and pos == 0 and depth < 4:
            padded = _sliced_read(module, comp, u.name, users, depth + 1)
            if padded is None:
                return None
            total += padded
            continue
        inner = module.computations.get((u.attr("calls") or "").lstrip("%")) if u.opcode == "fusion" else None
        if inner is None or depth >= 4:
            return None
        param = next((p for p in inner.instrs if p.opcode == "parameter" and _param_index(p) == pos), None)
        r = _sliced_read(module, inner, param.name, None, depth + 1) if param is not None else None
        if r is None:
            return None
        total += r
    return total


def _through_bitcasts(comp: Computation, name: str, users, depth: int = 0):
    out = []
    for u, pos in users.get(name, ()):
        if u.opcode == "bitcast" and depth < 3:
            out.extend(_through_bitcasts(comp, u.name, users, depth + 1))
        else:
            out.append((u, pos))
    return out


def _fusion_is_collective(module: HloModule, ins: Instr) -> bool:
    """TPU async-collective fusions: their traffic is the collective's, priced as such."""
    called = called_computation(module, ins)
    return called is not None and any(collective_kind(i.opcode) for i in called.instrs)


def op_work(module: HloModule, comp: Computation, ins: Instr) -> tuple[float, float] | None:
    """(FLOPs, HBM bytes) of one instruction that runs on its own, once; None for what has no
    work of its own (bookkeeping, control flow, collectives and their -done halves, TPU
    async-collective wrappers)."""
    work = op_read_write(module, comp, ins)
    return None if work is None else (work[0], work[1] + work[2])


def op_read_write(module: HloModule, comp: Computation, ins: Instr) -> tuple[float, float, float] | None:
    """(FLOPs, HBM bytes read, HBM bytes written) of what op_work counts; None where it counts nothing."""
    if ins.opcode in _NO_TRAFFIC or collective_kind(ins.opcode) or ins.opcode.endswith("-done"):
        return None
    f = instr_flops(module, comp, ins)
    if f == 0 and ins.opcode == "fusion" and _fusion_is_collective(module, ins):
        return None  # a TPU async-collective wrapper: its traffic is the collective's
    return (f, *instr_read_write(module, comp, ins))


_ESTIMATED_CYCLES = re.compile(r'"estimated_cycles":"(\d+)"')


def compiler_cycles(ins: Instr) -> int | None:
    """The TPU compiler's own estimate of one instruction's cycles: code generation writes it
    into the backend_config of every op it emits (a fully compiled module's text has it; the
    module of the HLO passes, before code generation, does not). None where absent or 0."""
    m = _ESTIMATED_CYCLES.search(ins.attrs)
    cycles = int(m.group(1)) if m else 0
    return cycles if cycles > 0 else None


def _holds(module: HloModule | None, comp: Computation | None, ins: Instr, test) -> bool:
    """Whether `test(comp, ins)` holds for an instruction or, in a fusion, for one it calls (at any depth)."""
    return any(test(c, i) for c, i in fused_walk(module, comp, ins))


def uses_mxu(module: HloModule, ins: Instr) -> bool:
    """Whether an instruction multiplies matrices: a dot or convolution, a fusion holding one
    (at any depth), a splash-attention kernel or the TPU's ragged-dot kernel."""
    return _holds(module, None, ins, lambda _, i: i.opcode in ("dot", "convolution") or is_attention_kernel(i)
                  or is_ragged_dot_kernel(i))


def compiler_estimate(module: HloModule, ins: Instr, hw: Hardware) -> float | None:
    """The compiler's estimate of one op in seconds, for an op that does not multiply matrices, in
    a module carrying estimates, on a chip with a clock; else None."""
    if not hw.clock_hz:
        return None
    cycles = compiler_cycles(ins)
    if cycles is None or uses_mxu(module, ins):
        return None
    return cycles / hw.clock_hz


INT8_TYPES = ("s8", "u8")


def _int8_dot(comp: Computation | None, ins: Instr) -> bool:
    if ins.opcode not in ("dot", "convolution") or comp is None:
        return False
    kinds = [operand_shape(comp, o).split("[", 1)[0].strip() for o in ins.operands[:2]]
    return len(kinds) == 2 and all(k in INT8_TYPES for k in kinds)


def int8_matmul(module: HloModule | None, comp: Computation, ins: Instr) -> bool:
    """Whether an instruction is (or is a fusion holding) a dot or convolution of 8-bit integer operands
    (trainer/quant.py's int8 x int8 -> int32 matmuls)."""
    return _holds(module, comp, ins, _int8_dot)


def _padded(shape: str, roles: str, role: str) -> float:
    """tiled / real size of the dimension along the lanes of `shape`, when its role (a character of a
    convolution's dim_labels for it, `roles`) is `role`; else 1."""
    lane = lane_dim(shape)
    if lane is None or lane[0] >= len(roles) or roles[lane[0]] != role or lane[1] <= 0:
        return 1.0
    return lane[2] / lane[1]


def _dot_padding(comp: Computation, ins: Instr) -> float:
    """lane_padding of one dot or convolution."""
    lhs, rhs = (operand_shape(comp, o) for o in ins.operands[:2])
    if ins.opcode == "convolution":
        labels = ins.attr("dim_labels") or ""
        if "_" not in labels or "->" not in labels:
            return 1.0
        lhs_roles, rest = labels.split("_", 1)
        rhs_roles, out_roles = rest.split("->", 1)
        return max(_padded(lhs, lhs_roles, "f"), _padded(rhs, rhs_roles, "i"), _padded(ins.shape, out_roles, "f"))
    dims = {k: {int(d) for d in (ins.attr(k) or "").strip("{}").split(",") if d.strip()}
            for k in ("lhs_contracting_dims", "rhs_contracting_dims")}
    lhs_rank, rhs_rank = len(shape_dims(lhs)), len(shape_dims(rhs))
    lhs_roles = "".join("f" if d in dims["lhs_contracting_dims"] else "b" for d in range(lhs_rank))
    rhs_roles = "".join("i" if d in dims["rhs_contracting_dims"] else "o" for d in range(rhs_rank))
    rows = lhs_rank - len(dims["lhs_contracting_dims"])  # the output is [batch, lhs free, rhs free]
    out_roles = "b" * rows + "f" * max(0, len(shape_dims(ins.shape)) - rows)
    return max(_padded(lhs, lhs_roles, "f"), _padded(rhs, rhs_roles, "i"), _padded(ins.shape, out_roles, "f"))


def lane_padding(module: HloModule | None, comp: Computation, ins: Instr) -> float:
    """How much longer the matmuls of an op take for the lanes their layouts leave empty: a TPU tile lays
    the minor-most dimension of an array along 128 lanes, and where a matmul's contracting dimension or its
    output's feature (column) dimension lies there at a size under 128 the MXU passes over the padding too
    (a head dim of 64 along the lanes: twice the passes). 1 where no such dimension does (or no tiled
    layout: CPU, GPU); over the matmuls of a fusion, weighted by their FLOPs. Measured on the v5e chip in
    head-dim-64 steps: the projections whose [.., heads, 64] operand or result has 64 minor ran 1.86-2.06x
    their roofline, those with the same shapes and another minor dimension 0.91-1.02x
    (benchmarks/RESULTS.md, "On-chip run 5"). An operand whose padded lane dimension is not contracted (a
    weight gradient's) is not counted: those ran 1.07-1.40x."""
    if module is None:
        return _dot_padding(comp, ins) if ins.opcode in ("dot", "convolution") and len(ins.operands) >= 2 else 1.0
    total = weighted = 0.0
    for c, i in fused_walk(module, comp, ins):
        if i.opcode not in ("dot", "convolution") or len(i.operands) < 2 or c is None:
            continue
        f = instr_flops(module, c, i)
        total += f
        weighted += f * _dot_padding(c, i)
    return weighted / total if total > 0 else 1.0


def flop_rate(comp: Computation, ins: Instr, hw: Hardware, module: HloModule | None = None) -> float:
    """FLOP/s one instruction's FLOPs are priced at: an attention kernel's (splash on TPU, cuDNN's
    flash attention on GPU) at the rate those kernels were measured to run at, any other op's at the
    matmul rate (over lane_padding where a TPU layout leaves lanes empty; an int8 x int8 matmul, int8_matmul,
    at Hardware.int8_speedup times it; a ragged dot, with
    Hardware.ragged_shares, the megablox kernels with Hardware.megablox_shares, at the measured share of its
    shape, indexed.ragged_share). A splash kernel with
    rows in Hardware.attention_grid (trainer/hardware.py V5E_SPLASH_GRID) runs at Hardware.grid_share for its
    block, head dim, query heads per K/V head (the K/V operand's heads), seq and batch x K/V heads, over what
    a training step's kernels of its kind were measured to take beyond that (Hardware.grid_in_step); else,
    with a row in Hardware.attention_rates (per kernel, block and seq: V5E_SPLASH_RATES), at its row's share
    for its sequence and block (Hardware.attention_share); any other at
    Hardware.attention_efficiency. One whose head dim d is below Hardware.attention_head_dim (the head
    dim the figures hold for) runs at d / that of it: its QK^T contracts over d and its PV writes d
    columns, so of a 128 x 128 MXU it fills d / 128 (measured at 64 on v5e: 0.46-0.56 of the
    head-dim-128 rates, mean 0.52)."""
    if not is_attention_kernel(ins):
        ragged = _ragged(module, comp, ins) if hw.ragged_shares or hw.megablox_shares else None
        if ragged is not None:
            share = indexed.ragged_share(hw, indexed.ragged_dims(*ragged), indexed.is_backward(ins),
                                         is_megablox_kernel(ragged[1]))
            if share is not None:
                return hw.peak_flops * share
        padding = lane_padding(module, comp, ins)
        if hw.int8_speedup != 1.0 and int8_matmul(module, comp, ins):
            return hw.sustained_flops * hw.int8_speedup / padding
        return hw.sustained_flops / padding
    rate = hw.sustained_attention_flops
    q = _splash_query(comp, ins) if splash_matmuls(ins) else None
    key = splash_grid_key(comp, ins, q) if q else None
    gridded = splash_grid_rate(hw, ins.name, key) if key is not None else None
    if gridded is not None:
        return gridded
    if q:
        share = hw.attention_share(ins.name, q[-2], splash_block(comp, ins))
        if share is not None:
            rate = hw.peak_flops * share
    d = q[-1] if q else None
    if d and hw.attention_head_dim and d < hw.attention_head_dim:
        return rate * d / hw.attention_head_dim
    return rate


def _ragged(module: HloModule | None, comp: Computation, ins: Instr):
    """(computation, instruction) of the ragged dot an op is (the TPU's kernel) or holds (a convolution
    over groups, ragged_dot_groups > 1); None for any other op."""
    def ragged(c: Computation, i: Instr) -> bool:
        return is_ragged_dot_kernel(i) or (i.opcode == "convolution" and len(i.operands) >= 2 and ragged_dot_groups(
            i, operand_shape(c, i.operands[0]), operand_shape(c, i.operands[1]), c) > 1)
    return next(((c, i) for c, i in fused_walk(module, comp, ins) if ragged(c, i)), None)


def roofline_seconds(flops: float, hbm_bytes: float, hw: Hardware, rate: float | None = None) -> float:
    """The per-op roofline: max(FLOPs / sustained FLOP/s (or `rate`), bytes / sustained HBM bandwidth)."""
    return max(flops / (rate or hw.sustained_flops), hbm_bytes / hw.sustained_hbm_bandwidth)


class OpPrice(NamedTuple):
    """One instruction's work and its price, once (op_price)."""

    flops: float
    read: float  # HBM bytes
    written: float
    rate: float  # FLOP/s its FLOPs are priced at (flop_rate)
    seconds: float  # its roofline: max(FLOPs / rate, Hardware.hbm_seconds), or its rows' time where longer
    estimate: float | None  # the compiler's estimate (compiler_estimate), None where absent or not looked up
    rows: float = 0.0  # its gathers' and scatters' rows' time (indexed.index_seconds), 0 where none
    vpu: float = 0.0  # its VPU time (vpu.vpu_seconds), 0 where not priced
    dma_discount: float = 0.0  # what Hardware.dma_share takes off an HBM <-> VMEM DMA's price


def op_price(module: HloModule, comp: Computation, ins: Instr, hw: Hardware, estimate: bool = True) -> OpPrice | None:
    """The work and price of one instruction that runs on its own, once (op_read_write, flop_rate,
    Hardware.hbm_seconds, indexed.index_seconds, vpu.vpu_seconds for an op without a matmul, compiler_estimate;
    the estimate is not looked up when not `estimate`); an HBM <-> VMEM DMA (dma.moves_dma_bytes) at
    Hardware.dma_share of that. None for what has no work of its own."""
    work = op_read_write(module, comp, ins)
    if work is None:
        return None
    f, read, written = work
    rate = flop_rate(comp, ins, hw, module)
    rows = indexed.index_seconds(module, comp, ins, hw) or 0.0
    vector = vpu.vpu_seconds(module, comp, ins, hw) if hw.vpu_cycles and not uses_mxu(module, ins) else 0.0
    roof = max(f / rate, hw.hbm_seconds(read, written), rows, vector)
    # with the overlap its wait is priced apart, from the schedule (dma_overlap.py); without one, on the stream
    share = 0.0 if hw.dma_overlap and module.is_scheduled else hw.dma_share
    discount = roof * (1.0 - share) if share != 1.0 and moves_dma_bytes(module, comp, ins) else 0.0
    return OpPrice(f, read, written, rate, roof - discount, compiler_estimate(module, ins, hw) if estimate else None,
                   rows, vector, discount)


def op_costs(module: HloModule, comp: Computation, ins: Instr, hw: Hardware,
             estimate: bool = True) -> tuple[float, float, float, float | None] | None:
    """(FLOPs, HBM bytes, roofline seconds, the compiler's estimate or None) of one instruction
    that runs on its own, once (op_price); None for what has no work of its own."""
    p = op_price(module, comp, ins, hw, estimate)
    return None if p is None else (p.flops, p.read + p.written, p.seconds, p.estimate)


def op_seconds(module: HloModule, comp: Computation, ins: Instr, hw: Hardware) -> tuple[float, float, float] | None:
    """(FLOPs, HBM bytes, seconds) of one instruction that runs on its own, once (op_work);
    None for what has no work of its own. Seconds: the roofline, max(FLOPs / sustained FLOP/s,
    bytes / sustained HBM bandwidth); with hw.on_chip "compiler", an op that does not multiply matrices
    takes at least the compiler's own estimate where the module carries one (compiler_estimate:
    the VPU and XLU time of elementwise fusions, reductions and relayouts, which bytes alone
    miss; see search/planning/roofline/__init__.py for why that is not the default)."""
    costs = op_costs(module, comp, ins, hw, estimate=hw.on_chip == "compiler")
    if costs is None:
        return None
    f, b, roof, estimate = costs
    return f, b, priced_seconds(roof, estimate, hw)


def priced_seconds(roof: float, estimate: float | None, hw: Hardware) -> float:
    """An op's seconds from its roofline and its compiler estimate, as hw.on_chip says."""
    return max(roof, estimate) if estimate is not None and hw.on_chip == "compiler" else roof

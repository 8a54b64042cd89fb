"""The vector units' time of an op that does not multiply matrices: what its elementwise work, reductions and
data movement take on a TPU core's VPU, where bytes alone miss it (an op whose operands the compiler put in
VMEM moves no HBM bytes, and RoPE's sine and cosine are software polynomials: on the v5e chip a fusion of both
over 8 x 2048 x 64 floats ran 1.33 ms with no HBM traffic at all).

Each fused instruction of the op counts the 32-bit vector registers its result fills (1,024 elements: 8
sublanes x 128 lanes, its layout's padding included; a reduction's operand, not its result), at the cycles
per register of its kind (Hardware.vpu_cycles; trainer/hardware.py V5E_VPU_CYCLES says where the v5e's come
from). The op's VPU seconds are their sum over the chip's clock; cost.op_price prices the op at least that.
A chip without figures (CPU, GPU, the TPUs not measured) has no VPU term."""
from __future__ import annotations

from .chip import Hardware
from .hlo import Computation, HloModule, Instr, fused_walk, minor_dim, operand_shape, prod, tile, tiled_arrays

VREG_ELEMENTS = 8 * 128

TRIG = "trigonometric"
TRANSCENDENTAL = "transcendental"
ARITHMETIC = "arithmetic"
REDUCTION = "reduction"
MOVEMENT = "movement"
TRANSPOSE = "transpose"  # a copy or transpose that moves another dimension onto the lanes (the transpose unit's work)
KINDS = (TRIG, TRANSCENDENTAL, ARITHMETIC, REDUCTION, MOVEMENT, TRANSPOSE)

_KIND = {
    **dict.fromkeys(("sine", "cosine", "tan"), TRIG),
    **dict.fromkeys(("exponential", "exponential-minus-one", "log", "log-plus-one", "rsqrt", "sqrt", "cbrt", "tanh",
                     "logistic", "divide", "power", "remainder", "atan2", "erf"), TRANSCENDENTAL),
    **dict.fromkeys(("add", "subtract", "multiply", "maximum", "minimum", "select", "compare", "negate", "abs",
                     "sign", "and", "or", "xor", "not", "clamp", "floor", "ceil", "round-nearest-even",
                     "round-nearest-afz", "shift-left", "shift-right-logical", "shift-right-arithmetic",
                     "is-finite", "popcnt", "count-leading-zeros", "convert"), ARITHMETIC),
    **dict.fromkeys(("reduce", "reduce-window"), REDUCTION),
    **dict.fromkeys(("copy", "transpose", "pad", "slice", "concatenate", "dynamic-slice", "dynamic-update-slice",
                     "broadcast", "iota", "reverse"), MOVEMENT),
}


def vregs(shape: str) -> float:
    """32-bit vector registers the arrays of a shape fill: their elements as their layouts tile them / 1,024, and
    at least one register a tile (a tile of fewer rows than a register's 8 sublanes, T(2,128) or T(1,128), leaves
    the rest of its register empty: [10240, 2, 1024] in T(2,128) tiles fills 81,920 registers, not 20,480)."""
    return sum(n / min(VREG_ELEMENTS, prod(t) if t else VREG_ELEMENTS) for _, n, _, t in tiled_arrays(shape))


def kind_of(ins: Instr, comp: Computation | None = None) -> str | None:
    """The kind of VPU work one instruction is (KINDS); None where it is none (parameters, bitcasts, tuples). A copy
    or transpose whose result lays along the lanes a dimension its operand did not (in `comp`) is a TRANSPOSE."""
    kind = _KIND.get(ins.opcode)
    if kind == MOVEMENT and ins.opcode in ("copy", "transpose") and comp is not None and ins.operands:
        lanes, source = minor_dim(ins.shape), minor_dim(operand_shape(comp, ins.operands[0]))
        if lanes is not None and source is not None:
            if ins.opcode == "transpose":
                perm = [int(d) for d in (ins.attr("dimensions") or "").strip("{}").split(",") if d.strip()]
                lanes = perm[lanes] if lanes < len(perm) else lanes
            if lanes != source:
                return TRANSPOSE
    return kind


def relayout(comp: Computation | None, ins: Instr) -> bool:
    """Whether an op is a reshape that re-tiles its operand (bf16[16384, 1024] in T(8,128) tiles to [8192, 2, 1024]
    in T(2,128), a MoE layer's top-k combine): a copy through the transpose unit, not a bitcast. On the v5e chip
    such reshapes ran 2.0-2.4 cycles a register of their result, as the attention's transposes did."""
    if ins.opcode != "reshape" or comp is None or not ins.operands:
        return False
    out, source = tile(ins.shape), tile(operand_shape(comp, ins.operands[0]))
    return out is not None and source is not None and out != source


def vpu_registers(module: HloModule, comp: Computation, ins: Instr) -> dict[str, float]:
    """{kind: vector registers} of the instructions an op is or fuses (at any depth); an op that is itself a
    re-tiling reshape (relayout) counts its result as TRANSPOSE work (a reshape inside a fusion counts nothing)."""
    out = dict.fromkeys(KINDS, 0.0)
    if relayout(comp, ins):
        out[TRANSPOSE] = vregs(ins.shape)
        return out
    for c, i in fused_walk(module, comp, ins):
        kind = kind_of(i, c)
        if kind is None:
            continue
        shape = operand_shape(c, i.operands[0]) if kind == REDUCTION and c is not None and i.operands else i.shape
        out[kind] += vregs(shape)
    return out


def vpu_seconds(module: HloModule, comp: Computation, ins: Instr, hw: Hardware) -> float:
    """Seconds the VPU work of one op takes on `hw` (0 without Hardware.vpu_cycles or a clock)."""
    if not hw.vpu_cycles or not hw.clock_hz:
        return 0.0
    per = dict(hw.vpu_cycles)
    regs = vpu_registers(module, comp, ins)
    return sum(per.get(k, 0.0) * n for k, n in regs.items()) / hw.clock_hz

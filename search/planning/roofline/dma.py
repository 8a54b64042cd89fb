"""On-chip DMAs between HBM and VMEM, read from the compiled step. The TPU compiler's memory-space
assignment moves buffers into the core's VMEM (memory space 1, `S(1)` in a layout) ahead of the
ops that read them, and back out, with async copies: a copy-start / copy-done, or an async slice
(slice-start / slice-done in the compiled program's text; in the dump the HLO passes read, an
async-start / async-done wrapping a slice of a computation of its own).

What the v5e chip's profiles of four head-dim-64 steps show (benchmarks/RESULTS.md, "On-chip run 5";
benchmarks/data/chip_steps_v5e_run5): the starts take no time of their own, and the -done halves
wait 0.9-7.3 ms a step, 12-44% of what the DMAs' bytes take at the sustained bandwidth. Until run 6 the roofline
priced each DMA as an op of the compute stream at its HBM bytes (cost.instr_bytes): priced as
transfers the schedule hides (tried: a DMA moving while HBM is idle), the 71 trained points came out
2.8% mean with 80% predicted fast, against 2.1% and 41% with them on the stream (both with the lane
padding, before HBM reads and writes were priced apart): what the ops that read VMEM cost (relayouts,
VPU work on VMEM buffers, priced at no HBM bytes) is what the on-stream price stands in for. Here:
which ops are those DMAs (trace.py buckets them apart, so a profile shows their waits beside their
price). Over the fourteen steps kept (chip_steps_v5e_run5 and _run6) the waits come to 0.226 of the price
(benchmarks/fit_vpu.py), but 0.08-0.46 step by step: a constant share (Hardware.dma_share, a what-if of
benchmarks/reprice_onchip.py) cannot say which steps hide their DMAs. The v5e entry prices them by the schedule
instead (Hardware.dma_overlap, roofline/dma_overlap.py): nothing at the start, and at the -done what the bytes take
beyond the HBM time the ops between leave idle.

Host transfers (roofline/host.py, memory space 5) are not these: they move over PCIe."""
from __future__ import annotations

from .hlo import Computation, HloModule, Instr, called_computation, memory_space, operand_shape, split_top_level
from .host import HOST_MEMORY_SPACE

VMEM_MEMORY_SPACE = 1
_SLICES = ("slice", "dynamic-slice")


def _between_hbm_and_vmem(source: str, destination: str) -> bool:
    """Whether a copy from `source` to `destination` (shapes) has VMEM on one side and host memory on none."""
    spaces = (memory_space(source), memory_space(destination))
    return VMEM_MEMORY_SPACE in spaces and HOST_MEMORY_SPACE not in spaces


def vmem_dma(module: HloModule, comp: Computation, ins: Instr) -> tuple[Computation, Instr] | None:
    """Where `ins` starts an async DMA between HBM and VMEM, the (computation, instruction) whose HBM bytes it
    moves (cost.instr_bytes of it: the copy-start itself, or the slice its async-start wraps); None when `ins`
    starts none (any other op, a host transfer, an async collective)."""
    if not ins.shape.startswith("("):
        return None
    parts = split_top_level(ins.shape[1:-1])
    if ins.opcode == "copy-start" and len(parts) >= 2:  # (destination, source, context)
        return (comp, ins) if _between_hbm_and_vmem(parts[1], parts[0]) else None
    if ins.opcode in ("slice-start", "dynamic-slice-start") and len(parts) >= 2:  # ((source, ...), slice, context)
        sources = split_top_level(parts[0][1:-1]) if parts[0].startswith("(") else [parts[0]]
        ok = bool(sources) and _between_hbm_and_vmem(sources[0], parts[1])
        return (comp, ins) if ok else None
    if ins.opcode == "async-start":  # the HLO passes' dump: a computation of its own around the slice
        body = called_computation(module, ins)
        root = body.root if body is not None else None
        if body is None or root is None or root.opcode not in _SLICES or not root.operands:
            return None
        source = operand_shape(body, root.operands[0])
        return (body, root) if source and _between_hbm_and_vmem(source, root.shape) else None
    return None


def moves_dma_bytes(module: HloModule, comp: Computation, ins: Instr) -> bool:
    """Whether an op's own work (what the roofline prices it for) is a DMA's between HBM and VMEM: an op that
    starts one (vmem_dma), or the slice at the root of a computation of its own whose result is in VMEM and
    source in HBM (what the HLO passes' async-start wraps; the start itself is priced at nothing)."""
    if vmem_dma(module, comp, ins) is not None:
        return True
    return (ins.opcode in _SLICES and comp.root is ins and bool(ins.operands)
            and _between_hbm_and_vmem(operand_shape(comp, ins.operands[0]), ins.shape))


def dma_start(module: HloModule, comp: Computation, done: Instr) -> Instr | None:
    """The VMEM DMA's start that a -done (copy-done, slice-done, async-done) closes; None when it
    closes anything else."""
    if not done.opcode.endswith("-done") or not done.operands:
        return None
    start = comp.by_name.get(done.operands[0])
    return start if start is not None and vmem_dma(module, comp, start) is not None else None

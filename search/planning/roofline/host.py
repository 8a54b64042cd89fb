"""Transfers between a chip's HBM and its host's memory (host offload), read from the compiled
step: XLA's TPU compiler moves an offloaded tensor as an async-start / async-done pair wrapping a
dynamic-update-slice into a buffer in host memory (device to host) or a dynamic-slice out of one
(host to device), or as a copy-start / copy-done whose destination or source lives there. The same
slices print as their own async pair in the compiled program's text (`compiled.as_text()`, what a
full compile and the chip's own trials keep): a dynamic-update-slice-start / -done whose buffer, and a
dynamic-slice-start / -done whose source, lives in host memory (the buffer-assignment dump that the
HLO passes read prints the async-start form). Host
memory is memory space 5 in the layout (`{...S(5)}`). Each transfer moves its bytes over the
chip's PCIe link (Hardware.host_bandwidth, one direction; the two directions are separate
queues) while the compute stream goes on: search/planning/roofline/collectives.py prices it,
search/planning/roofline/schedule.py replays when it is waited for."""
from __future__ import annotations

from .hlo import (
    Computation,
    HloModule,
    Instr,
    called_computation,
    memory_space,
    operand_shape,
    shape_bytes,
    split_top_level,
)

HOST_MEMORY_SPACE = 5
# the -done halves that close a host transfer's start (host_transfer): async-start's, copy-start's and
# the async slices' of compiled.as_text()
DONE_OPCODES = ("async-done", "copy-done", "dynamic-slice-done", "dynamic-update-slice-done")


def in_host_memory(shape: str) -> bool:
    """True when the (first) array of `shape` lives in host memory."""
    return memory_space(shape) == HOST_MEMORY_SPACE


def host_transfer(module: HloModule, comp: Computation, ins: Instr) -> tuple[str, float] | None:
    """("d2h" | "h2d", bytes moved) when `ins` starts a transfer between HBM and host memory."""
    if ins.opcode == "copy-start" and ins.shape.startswith("("):  # (destination, source, context)
        parts = split_top_level(ins.shape[1:-1])
        if len(parts) >= 2:
            if in_host_memory(parts[0]) and not in_host_memory(parts[1]):
                return "d2h", shape_bytes(parts[0])
            if in_host_memory(parts[1]) and not in_host_memory(parts[0]):
                return "h2d", shape_bytes(parts[0])
        return None
    if ins.opcode in ("dynamic-slice-start", "dynamic-update-slice-start"):
        return _async_slice(ins)
    if ins.opcode != "async-start":
        return None
    called = called_computation(module, ins)
    root = called.root if called is not None else None
    if root is None or called is None:
        return None
    if root.opcode == "dynamic-update-slice" and in_host_memory(root.shape) and len(root.operands) > 1:
        return "d2h", shape_bytes(operand_shape(called, root.operands[1]))
    if root.opcode == "dynamic-slice" and root.operands and in_host_memory(operand_shape(called, root.operands[0])):
        return "h2d", shape_bytes(root.shape)
    return None


def _async_slice(ins: Instr) -> tuple[str, float] | None:
    """A dynamic-slice-start ((source, indices...), slice, context) out of host memory moves its slice
    host to device; a dynamic-update-slice-start ((buffer, update, indices...), buffer, context) into
    host memory moves its update device to host."""
    if not ins.shape.startswith("(("):
        return None
    parts = split_top_level(ins.shape[1:-1])
    if len(parts) < 2 or not parts[0].startswith("("):
        return None
    operands = split_top_level(parts[0][1:-1])
    if ins.opcode == "dynamic-slice-start" and operands and in_host_memory(operands[0]) \
            and not in_host_memory(parts[1]):
        return "h2d", shape_bytes(parts[1])
    if ins.opcode == "dynamic-update-slice-start" and len(operands) > 1 and in_host_memory(parts[1]) \
            and not in_host_memory(operands[1]):
        return "d2h", shape_bytes(operands[1])
    return None


def host_round_trips(module: HloModule) -> list[tuple[str, float]]:
    """(computation, bytes each way) of every buffer the step copies from host memory to HBM only to
    relay it out and copy it back (copy-start h2d -> copy-done -> copy -> copy-start d2h): a
    whole offloaded stack's layout change, which moves it over the PCIe link twice. libtpu 0.0.52
    does this to the layer inputs and attention outputs when both are offloaded, with its
    collective pipeliner on (the flag set no_collective_pipeliner leaves it out)."""
    def producer(comp: Computation, ins: Instr | None, opcode: str) -> Instr | None:
        """The instruction of `opcode` that produces `ins`'s first operand, if it is one."""
        src = comp.by_name.get(ins.operands[0]) if ins is not None and ins.operands else None
        return src if src is not None and src.opcode == opcode else None

    out = []
    for comp in module.computations.values():
        for ins in comp.instrs:
            transfer = host_transfer(module, comp, ins) if ins.opcode == "copy-start" else None
            if transfer is None or transfer[0] != "d2h":
                continue
            relayout = producer(comp, ins, "copy")
            start = producer(comp, producer(comp, relayout, "copy-done"), "copy-start")
            back = host_transfer(module, comp, start) if start is not None else None
            if relayout is not None and back is not None and back[0] == "h2d":
                out.append((comp.name, transfer[1]))
    return out

"""What the DMAs between HBM and VMEM add to a step when they move while the ops scheduled between their start and
their -done leave HBM idle (Hardware.dma_overlap; roofline/dma.py says which ops those DMAs are).

A DMA issued at its start moves its bytes in the HBM time the ops the schedule places before its -done do not use:
each such op leaves max(0, its matmul or VPU seconds - its HBM seconds) idle (a matmul fusion most of its time, an
HBM-bound op none, nor a gather or scatter whose rows' time exceeds its bytes': its rows keep HBM busy). What the
DMA's bytes take beyond that idle time is the -done's wait, on the compute stream. On the v5e chip's nineteen
profiled steps (benchmarks/data/chip_steps_v5e_run5, _run6, _run6b) this puts each step's DMA waits at 0.23-1.09 of
what they measured (benchmarks/RESULTS.md, 'On-chip run 6'), where a share of the bytes' price (Hardware.dma_share)
is off by 0.03-0.46 step by step."""
from __future__ import annotations

from itertools import accumulate

from .chip import Hardware
from .cost import instr_read_write, op_price
from .dma import dma_start, moves_dma_bytes, vmem_dma
from .hlo import CallGraph, Computation, HloModule


def _idle_seconds(module: HloModule, comp: Computation, ins, hw: Hardware) -> float:
    """HBM-idle seconds of one op (none for a DMA itself; nested computations count none)."""
    if moves_dma_bytes(module, comp, ins):
        return 0.0
    price = op_price(module, comp, ins, hw, estimate=False)
    if price is None:
        return 0.0
    # its matmul or vector time beyond its bytes (gathered rows keep HBM busy)
    return max(0.0, max(price.flops / price.rate, price.vpu) - hw.hbm_seconds(price.read, price.written))


def dma_exposed_seconds(module: HloModule, graph: CallGraph, hw: Hardware) -> float:
    """Seconds per step the -done halves of the step's HBM <-> VMEM DMAs wait (see the module docstring)."""
    total = 0.0
    for comp in module.computations.values():
        mult = graph.multiplier.get(comp.name, 0.0)
        if mult == 0 or comp.name in graph.fused:
            continue
        position = {ins.name: k for k, ins in enumerate(comp.instrs)}
        idle_before: list[float] | None = None  # idle seconds of the ops before each, priced once per computation
        for ins in comp.instrs:
            start = dma_start(module, comp, ins)
            if start is None:
                continue
            moved = vmem_dma(module, comp, start)
            if moved is None:
                continue
            if idle_before is None:
                idle_before = list(accumulate((_idle_seconds(module, comp, i, hw) for i in comp.instrs), initial=0.0))
            seconds = hw.hbm_seconds(*instr_read_write(module, *moved))
            idle = idle_before[position[ins.name]] - idle_before[position[start.name] + 1]
            total += max(0.0, seconds - idle) * mult
    return total

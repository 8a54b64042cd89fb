"""The combination: per-op roofline, collectives and their exposed time, one Roofline per
compiled step (see search/planning/roofline/__init__.py)."""
from __future__ import annotations

from dataclasses import dataclass

from .chip import Hardware
from .collectives import CollectiveCost, DeviceLayout, chain_homes, collectives
from .cost import op_price, op_work, priced_seconds
from .dma_overlap import dma_exposed_seconds
from .hlo import call_graph, parse_module
from .host import host_round_trips
from .schedule import exposed_by_schedule

OVERLAP_FRACTION = 0.5  # the fallback only (HLO that is not scheduled): share of the roofline that hides comm
OVERLAP_SCHEDULE = "schedule"
OVERLAP_FIXED = "fixed_fraction"


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
    overlap_fraction: float | None  # the fixed fraction used, None when the schedule was read
    collectives: list[CollectiveCost]
    trip_counts: dict[str, int]
    unknown_trip_counts: list[str]
    overlap: str = OVERLAP_SCHEDULE  # "schedule" | "fixed_fraction" (HLO not scheduled)
    # ops without a matmul that carry the TPU compiler's cycle estimate (cost.compiler_estimate: a
    # fully compiled TPU module's; 0 for the HLO passes' module, GPUs, CPUs), and what those
    # estimates add over the roofline's price of the same ops, per step (priced in only with
    # Hardware.on_chip "compiler")
    compiler_cycles_ops: int = 0
    compiler_excess_s: float = 0.0
    on_chip: str = "roofline"
    # buffers copied from host memory to HBM and back only for a relayout (host.host_round_trips):
    # how many, and their bytes each way per step
    host_round_trips: int = 0
    host_round_trip_bytes: float = 0.0
    # what row gathers and scatters add over their ops' roofline per step (indexed.py: the chip's measured
    # seconds per row); in roofline_s and step_time_s, in neither compute_s nor memory_s
    index_excess_s: float = 0.0
    # what the VPU time of ops without a matmul adds over their bytes' price per step (vpu.py), and what the
    # DMAs between HBM and VMEM are priced under their bytes' price (Hardware.dma_share); both in roofline_s
    # and step_time_s, in neither compute_s nor memory_s (memory_s holds the DMAs' whole bytes' price)
    vpu_excess_s: float = 0.0
    dma_discount_s: float = 0.0
    # with Hardware.dma_overlap: the DMAs' waits the schedule does not hide (dma_overlap.py), in roofline_s
    dma_exposed_s: float = 0.0

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
                                         executions=0.0, bytes=0.0, seconds=0.0, exposed_seconds=0.0))
            a["count"] += 1
            a["executions"] += c.executions
            a["bytes"] += c.bytes_per_execution * c.executions
            a["seconds"] += c.seconds
            a["exposed_seconds"] += c.exposed_s
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
            "overlap": self.overlap,
            "overlap_fraction": self.overlap_fraction,
            "on_chip": self.on_chip,
            "compiler_cycles_ops": self.compiler_cycles_ops,
            "compiler_excess_s": self.compiler_excess_s,
            "host_round_trips": self.host_round_trips,
            "host_round_trip_bytes": self.host_round_trip_bytes,
            "index_excess_s": self.index_excess_s,
            "vpu_excess_s": self.vpu_excess_s,
            "dma_discount_s": self.dma_discount_s,
            "dma_exposed_s": self.dma_exposed_s,
            "collectives": self.collectives_summary(),
            "trip_counts": dict(self.trip_counts),
            "unknown_trip_counts": list(self.unknown_trip_counts),
        }


@dataclass(frozen=True)
class StepWork:
    """FLOPs and HBM bytes per device of one step, as analyze counts them, without hardware."""

    flops_per_step: float
    hbm_bytes_per_step: float
    unknown_trip_counts: list[str]  # loops counted once: their trip count could not be read


def step_work(hlo_text: str) -> StepWork:
    """The FLOPs and HBM bytes of one compiled step, read from its optimized HLO with every
    loop's trip count applied (what analyze counts; no hardware figures, no collectives)."""
    module = parse_module(hlo_text)
    graph = call_graph(module)
    flops = bytes_ = 0.0
    for comp, ins, mult in _running_ops(module, graph):
        work = op_work(module, comp, ins)
        if work is not None:
            flops += work[0] * mult
            bytes_ += work[1] * mult
    return StepWork(flops, bytes_, list(graph.unknown_trip_counts))


def _running_ops(module, graph):
    """(computation, instruction, times it runs per step) of every instruction that runs on
    its own: not inside a fusion, in a computation that is called."""
    for comp in module.computations.values():
        mult = graph.multiplier.get(comp.name, 0.0)
        if mult == 0 or comp.name in graph.fused:
            continue
        for ins in comp.instrs:
            yield comp, ins, mult


def analyze(hlo_text: str, hw: Hardware, *, mesh=None, mesh_devices=None, axis_names=None,
            num_devices: int | None = None, overlap_fraction: float = OVERLAP_FRACTION) -> Roofline:
    """The roofline of one compiled step. Pass the jax `mesh` it was compiled for (or its
    `mesh_devices` array and `axis_names`) so collectives can be mapped to mesh axes.
    `overlap_fraction` is used only when the HLO is not scheduled (the fallback)."""
    if mesh is not None:
        mesh_devices, axis_names = mesh.devices, mesh.axis_names
    layout = DeviceLayout(mesh_devices, axis_names)
    num_devices = num_devices or layout.num_devices or 1
    module = parse_module(hlo_text)
    graph = call_graph(module)
    flops = bytes_ = compute = memory = roof = index_excess = vpu_excess = dma_discount = 0.0
    estimated, excess = 0, 0.0
    for comp, ins, mult in _running_ops(module, graph):
        price = op_price(module, comp, ins, hw)
        if price is None:
            continue
        f, roof_s, estimate = price.flops, price.seconds, price.estimate
        t = priced_seconds(roof_s, estimate, hw)
        if estimate is not None:
            estimated += 1
            excess += max(0.0, estimate - roof_s) * mult
        flops += f * mult
        bytes_ += (price.read + price.written) * mult
        op_compute, op_memory = f / price.rate, hw.hbm_seconds(price.read, price.written)
        compute += op_compute * mult
        memory += op_memory * mult
        index_excess += max(0.0, price.rows - max(op_compute, op_memory)) * mult
        vpu_excess += max(0.0, price.vpu - max(op_compute, op_memory, price.rows)) * mult
        dma_discount += price.dma_discount * mult
        roof += t * mult
    dma_exposed = dma_exposed_seconds(module, graph, hw) if hw.dma_overlap and module.is_scheduled else 0.0
    roof += dma_exposed
    homes = chain_homes(module, graph)  # read once: both the costs and the schedule replay use it
    colls = collectives(module, graph, layout, hw, num_devices, homes)
    comm = sum(c.seconds for c in colls)
    if module.is_scheduled:
        by_key = exposed_by_schedule(module, graph, hw, colls, homes)
        for c in colls:
            c.exposed_s = by_key.get(c.key, 0.0)
        exposed, fraction, how = sum(c.exposed_s for c in colls), None, OVERLAP_SCHEDULE
    else:
        exposed, fraction, how = max(0.0, comm - overlap_fraction * roof), overlap_fraction, OVERLAP_FIXED
        for c in colls:  # spread over the collectives by their share of the time
            c.exposed_s = exposed * c.seconds / comm if comm else 0.0
    trips = [moved * graph.multiplier.get(comp, 0.0) for comp, moved in host_round_trips(module)]
    return Roofline(hw.name, flops, bytes_, compute, memory, roof, comm, exposed, roof + exposed,
                    fraction, colls, graph.trip_counts, graph.unknown_trip_counts, how, estimated, excess,
                    hw.on_chip, len(trips), sum(trips), index_excess, vpu_excess, dma_discount, dma_exposed)

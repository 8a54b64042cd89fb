"""Collectives: replica groups, the device layout, and the cost of each transfer
(see search/planning/roofline/__init__.py for the formulas and constants)."""
from __future__ import annotations

import dataclasses
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .chip import Hardware
from .hlo import (
    CallGraph,
    HloModule,
    Instr,
    balanced,
    called_computation,
    callees,
    collective_kind,
    operand_shape,
    parse_dims,
    prod,
    shape_bytes,
)
from .host import host_transfer

# ----------------------------------------------------------------------------- collectives

def _iota_groups(spec: str) -> list[list[int]]:
    m = re.fullmatch(r"\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", spec.strip())
    if not m:
        raise ValueError(f"not an iota replica group list: {spec!r}")
    shape, reshape = parse_dims(m.group(1)), parse_dims(m.group(2))
    arr = np.arange(prod(reshape)).reshape(reshape)
    if m.group(3):
        arr = arr.transpose([int(x) for x in m.group(3).split(",")])
    return arr.reshape(shape[0], -1).tolist()


def _device_array(spec: str | None, sizes: list[int]) -> np.ndarray:
    n = prod(sizes)
    if not spec:
        return np.arange(n).reshape(sizes)
    spec = spec.strip()
    if spec.startswith("["):
        m = re.fullmatch(r"\[([\d,]+)\](?:T\(([\d,]+)\))?", spec)
        if not m:
            raise ValueError(f"cannot read device_ids={spec!r}")
        arr = np.arange(n).reshape(parse_dims(m.group(1)))
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
    new_shape: list[int] = []
    per_axis: dict[int, list] = defaultdict(list)
    for k, (ax, pre, size) in enumerate(refs):
        per_axis[ax].append((pre, size, k))
    slot_of_ref: dict[int, int] = {}
    for ax, full in enumerate(sizes):
        subs = per_axis.get(ax, [])
        if not subs or all(p is None for p, _, _ in subs):
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
    group_size = prod(new_shape[i] for i in grouped)
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
        block = balanced(s, 0, "{", "}")
        groups = [[int(x) for x in g.split(",") if x.strip()] for g in re.findall(r"\{([\d,\s]*)\}", block[1:-1])]
        return groups or [list(range(num_devices))]
    if s.startswith("["):
        m = re.match(r"\[[\d,]+\]<=\[[\d,]+\](?:T\([\d,]+\))?", s)
        if m is not None:
            return _iota_groups(m.group(0))
    if s.startswith("mesh["):
        return _mesh_axes_groups(s)
    if s.startswith("maximal_mesh"):
        return [[0]]
    raise ValueError(f"cannot read replica_groups of {ins.name}: {s[:80]!r}")


@dataclass
class CollectiveCost:
    kind: str  # all-gather, reduce-scatter, all-reduce, all-to-all, collective-permute, ...
    name: str
    computation: str
    executions: float  # per step (loop trip counts included)
    operand_bytes: float
    group_size: int
    axes: tuple[str, ...]  # mesh axes the groups span
    link: str  # "ici" | "dcn" | "host" (a transfer to / from host memory, roofline/host.py) | "none"
    bytes_per_execution: float  # bytes each device moves per execution
    seconds: float  # per step, all executions
    key: str = ""  # one transfer: "<kind>:<channel_id>", or "<computation>/<instruction>" without a channel
    # what it occupies while in flight: "dcn", "ici" (a ring), "ici:<pairs>" (a permute) or
    # "host:d2h" / "host:h2d" (one direction of the chip's PCIe link)
    resource: str = "ici"
    exposed_s: float = 0.0  # per step: the part no scheduled work hides (set by the schedule analysis)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _ring_links(kind: str, dims: tuple[int, ...] | None, hw: Hardware) -> int:
    """One-way ICI links a device drives in a collective over `dims` (the physical torus dims its
    groups span; None: unknown, one): a permute one; a ring collective both directions of 2 links
    per dim that wraps, and one way on each of them along an open line (its end devices have one
    link along it: scaling-book, "Sharded Matrices", an AllGather over 4 v5e chips without
    wraparound, 560 us in theory and 680 us profiled against 377 us for a ring)."""
    if kind in ("collective-permute", "collective-broadcast"):
        return 1
    if not dims:
        return 2
    if hw.torus_wrap is None:
        return 2 * min(len(dims), max(hw.physical_dims, 1))
    return sum(2 if d >= len(hw.torus_wrap) or hw.torus_wrap[d] else 1 for d in dims)


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


def _hops(kind: str, n: int, ring_steps: int | None = None) -> int:
    """Dependent steps of one collective over n devices, each paying one hop's latency:
    `ring_steps` (DeviceLayout.ring_steps) or n - 1 for a ring collective, twice that for an
    all-reduce (reduce-scatter, then all-gather), 1 for a collective-permute."""
    if kind in ("collective-permute", "collective-broadcast"):
        return 1
    steps = max(n - 1, 0) if ring_steps is None else ring_steps
    return 2 * steps if kind == "all-reduce" else steps


def transfer_key(computation: str, ins: Instr) -> str:
    """The name of one transfer: the copies of a channel (a TPU async-collective chain, or
    the -start of an async pair) share "<kind>:<channel_id>"; a collective without a channel
    is "<computation>/<instruction>"."""
    kind = collective_kind(ins.opcode) or ins.opcode
    channel = ins.attr("channel_id")
    return f"{kind}:{channel}" if channel is not None else f"{computation}/{ins.name}"


def device_coords(devices: Sequence) -> list[tuple[int, ...]] | None:
    """The devices' physical torus coordinates (TPU `coords`), None unless every device has them."""
    coords = [tuple(c) for d in devices if (c := getattr(d, "coords", None)) is not None]
    return coords if coords and len(coords) == len(devices) else None


class DeviceLayout:
    """Logical device id -> mesh coordinates, slice and physical coordinates.

    Logical id i is mesh.devices.flat[i] (jax compiles a NamedSharding over the mesh's flat
    device order). On multi-slice TPU programs XLA compiles one program per slice
    (num_partitions = devices per slice) and ids count the devices of one slice, in the
    same flat order; cross-slice transfers are separate (megascale) operations."""

    def __init__(self, mesh_devices: np.ndarray | None, axis_names: Sequence[str] | None):
        self.axis_names = tuple(axis_names or ())
        self.local: list[int] | None = None
        self.shape: tuple[int, ...] | None = None  # None: no mesh given (then nothing below is read)
        self.slices: list[int] = []
        self.coords: list[tuple[int, ...]] | None = None  # None: some device has no physical coordinates
        if mesh_devices is None:
            return
        arr = np.asarray(mesh_devices, dtype=object)
        self.shape = arr.shape
        flat = list(arr.flat)
        self.slices = [getattr(d, "slice_index", 0) or 0 for d in flat]
        self.coords = device_coords(flat)

    @property
    def num_devices(self) -> int | None:
        return prod(self.shape) if self.shape is not None else None

    def use_partitions(self, num_partitions: int | None) -> None:
        """Map ids to the devices of the first slice when the program is per slice."""
        if self.shape is None or not num_partitions or num_partitions >= prod(self.shape):
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

    def span(self, groups: list[list[int]], kind: str) -> tuple[tuple[str, ...], str, tuple[int, ...] | None]:
        """(mesh axes spanned, link, the physical torus dims the groups span: None when the
        devices' coordinates are unknown)."""
        if self.shape is None:
            return (), "ici", None
        n = prod(self.shape)
        axes: set[int] = set()
        slices_cross = False
        phys: set[int] = set()
        for g in self._groups(groups, n):
            coords = np.array(np.unravel_index(g, self.shape)).T
            axes.update(int(i) for i in np.nonzero((coords != coords[0]).any(axis=0))[0])
            if len({self.slices[d] for d in g}) > 1:
                slices_cross = True
            if self.coords is not None:
                pc = np.array([self.coords[d] for d in g])
                phys.update(int(i) for i in np.nonzero((pc != pc[0]).any(axis=0))[0])
        names = tuple(self.axis_names[i] if i < len(self.axis_names) else f"axis{i}" for i in sorted(axes))
        if not axes:
            return (), "none", ()
        return names, ("dcn" if slices_cross else "ici"), tuple(sorted(phys)) if self.coords is not None else None

    def _groups(self, groups: list[list[int]], n: int):
        """The replica groups as device indices of this mesh (through `local` where set), those of 2+ devices."""
        for g in groups:
            if self.local is not None:
                g = [self.local[d] for d in g if d < len(self.local)]
            g = [d for d in g if d < n]
            if len(g) >= 2:
                yield g

    def ring_steps(self, groups: list[list[int]]) -> int | None:
        """Dependent steps of a ring collective over the groups on the torus, None when the
        devices' coordinates are unknown: a group laid out over the torus runs one ring per
        physical dimension, one after the other, so it takes sum over dimensions of (devices
        along it - 1) steps (a 16 x 16 v5e slice: 30, not 255), and never more than n - 1."""
        if self.shape is None or self.coords is None:
            return None
        n = prod(self.shape)
        steps = 0
        for g in self._groups(groups, n):
            pc = np.array([self.coords[d] for d in g])
            along = sum(len(set(pc[:, k].tolist())) - 1 for k in range(pc.shape[1]))
            steps = max(steps, min(len(g) - 1, along))
        return steps


def _runs(module: HloModule, name: str, memo: dict[str, set[str]]) -> set[str]:
    """The computations `name` runs, transitively: while bodies and conditions, calls,
    branches (not fusions: a fusion's ops run inside it)."""
    if name in memo:
        return memo[name]
    memo[name] = set()  # the call graph is a DAG; this only guards malformed text
    out: set[str] = set()
    comp = module.computations.get(name)
    for ins in comp.instrs if comp is not None else ():
        for kind, child in callees(ins):
            if kind != "fused" and child in module.computations:
                out.add(child)
                out |= _runs(module, child, memo)
    memo[name] = out
    return out


def chain_homes(module: HloModule, graph: CallGraph) -> dict[str, set[str]]:
    """TPU async-collective chains that reach into nested computations: channel key -> the
    computations the chain is started and done in (its homes).

    A chain is one channel's collective copied into several fusions (the fusions that carry
    it). When fusions of one channel lie in a computation and also in computations it runs
    (a while body: XLA's windowed-einsum loop `windowed_dot_general_body_*` between the
    chain's first and last fusion in the layer body), the chain is one transfer, issued and
    done in the outer computation; the fusions in the loop body carry its continuation steps
    while they compute (the collective in each of them is the whole collective, copied, not
    one more), so they neither start nor end it and its executions are the outer
    computation's, not the loop's trip count times. Only channels with such nested copies
    are listed."""
    holders: dict[str, set[str]] = defaultdict(set)
    for comp in module.computations.values():
        if comp.name in graph.fused or graph.multiplier.get(comp.name, 0.0) == 0:
            continue
        for ins in comp.instrs:
            if ins.opcode != "fusion":
                continue
            called = called_computation(module, ins)
            if called is None:
                continue
            for i in called.instrs:
                if collective_kind(i.opcode) and i.attr("channel_id") is not None:
                    holders[transfer_key(called.name, i)].add(comp.name)
    memo: dict[str, set[str]] = {}
    out: dict[str, set[str]] = {}
    for key, comps in holders.items():
        if len(comps) < 2:
            continue
        homes = {c for c in comps if not any(c in _runs(module, o, memo) for o in comps if o != c)}
        if homes and homes != comps:
            out[key] = homes
    return out


_MEGASCALE_KINDS = {"ALL_REDUCE": "all-reduce", "ALL_GATHER": "all-gather", "REDUCE_SCATTER": "reduce-scatter",
                    "ALL_TO_ALL": "all-to-all", "ONE_TO_ONE": "collective-permute"}


def megascale_transfer(ins: Instr) -> tuple[str, int] | None:
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


def _fusion_output_bytes(module: HloModule) -> dict[str, float]:
    """Fused computation -> bytes of the fusion that calls it (the smallest, if several do)."""
    out: dict[str, float] = {}
    for comp in module.computations.values():
        for ins in comp.instrs:
            if ins.opcode != "fusion":
                continue
            for kind, name in callees(ins):
                if kind == "fused":
                    out[name] = min(out.get(name, float("inf")), shape_bytes(ins.shape))
    return out


def _scatters(kind: str, operand_bytes: float, n: int, fusion_bytes: float | None) -> bool:
    """An all-reduce fused with the slice of its result each device keeps is a reduce-scatter:
    the TPU compiler writes reduce-scatters so (an `all-reduce-scatter` fusion whose output is
    1/n of the all-reduce). Each device then moves (n-1)/n of the operand once, not twice."""
    return (kind == "all-reduce" and n > 1 and fusion_bytes is not None and operand_bytes > 0
            and abs(fusion_bytes * n - operand_bytes) <= 0.01 * operand_bytes)


def collectives(module: HloModule, graph: CallGraph, layout: DeviceLayout, hw: Hardware,
                num_devices: int, homes: dict[str, set[str]] | None = None) -> list[CollectiveCost]:
    """Every collective's cost per step. `homes`: chain_homes of the module (computed when
    not given)."""
    out: list[CollectiveCost] = []
    seen_channels: dict[str, int] = {}
    layout.use_partitions(module.num_partitions)
    fused_out = _fusion_output_bytes(module)
    kind: str | None
    for comp in module.computations.values():
        mult = graph.multiplier.get(comp.name, 0.0)
        if mult == 0:
            continue
        for ins in comp.instrs:
            host = host_transfer(module, comp, ins)
            if host is not None and hw.host_bandwidth:
                direction, moved = host
                out.append(CollectiveCost(f"host-{direction}", ins.name, comp.name, mult, moved, 1, (), "host", moved,
                                          moved / hw.host_bandwidth * mult, key=f"{comp.name}/{ins.name}",
                                          resource=f"host:{direction}"))
                continue
            mega = megascale_transfer(ins)
            if mega is not None:
                kind, n = mega
                operand_bytes = shape_bytes(operand_shape(comp, ins.operands[0])) if ins.operands else 0.0
                per = _traffic(kind, operand_bytes, n)
                steps = _hops(kind, n)
                seconds = (per / hw.dcn_bandwidth + steps * hw.dcn_latency_s) * mult if per else 0.0
                out.append(CollectiveCost(kind, ins.name, comp.name, mult, operand_bytes, n, layout.dcn_axes(),
                                          "dcn", per, seconds, key=f"{comp.name}/{ins.name}", resource="dcn"))
                continue
            kind = collective_kind(ins.opcode)
            if kind is None:
                continue
            channel = ins.attr("channel_id")
            key = transfer_key(comp.name, ins)
            if channel is not None:
                if key in seen_channels:  # the same transfer, copied into async fusions
                    prev = out[seen_channels[key]]
                    if mult > prev.executions:
                        out[seen_channels[key]] = dataclasses.replace(
                            prev, executions=mult, seconds=prev.seconds / max(prev.executions, 1e-30) * mult)
                    continue
            operand_bytes = sum(shape_bytes(operand_shape(comp, o)) for o in ins.operands)
            if operand_bytes == 0:
                operand_bytes = shape_bytes(ins.shape)
            groups = replica_groups(ins, num_devices)
            n = max((len(g) for g in groups), default=1)
            if _scatters(kind, operand_bytes, n, fused_out.get(comp.name)):
                kind = "reduce-scatter"
            axes, link, dims = layout.span(groups, kind)
            if layout.shape is None and n > 1:
                link = "ici"
            per = _traffic(kind, operand_bytes, n)
            if link == "dcn":
                bw, lat = hw.dcn_bandwidth, hw.dcn_latency_s
            else:
                links = _ring_links(kind, dims, hw)
                bw, lat = hw.ici_link_bandwidth * links * hw.ici_efficiency, hw.ici_latency_s
            steps = _hops(kind, n, layout.ring_steps(groups) if link == "ici" else None)
            seconds = 0.0 if link == "none" or per == 0 else (per / bw + steps * lat) * mult
            if link == "dcn":
                resource = "dcn"
            elif kind in ("collective-permute", "collective-broadcast"):
                resource = "ici:" + ",".join(f"{a}>{b}" for a, b in sorted(tuple(g) for g in groups if len(g) == 2))
            else:
                resource = "ici"
            cost = CollectiveCost(kind, ins.name, comp.name, mult, operand_bytes, n, axes, link, per, seconds,
                                  key=key, resource=resource)
            if channel is not None:
                seen_channels[key] = len(out)
            out.append(cost)
    homes = chain_homes(module, graph) if homes is None else homes
    for k, c in enumerate(out):  # a chain reaching into a loop runs as often as the computation it is done in
        if c.key in homes:
            mult = max(graph.multiplier.get(h, 0.0) for h in homes[c.key])
            out[k] = dataclasses.replace(c, executions=mult, seconds=c.seconds / max(c.executions, 1e-30) * mult)
    return out



"""Communication overlap read from the compiled schedule (see search/planning/roofline/__init__.py,
"Combination"): every computation that runs on its own is replayed in its instruction order,
with one compute stream and the transfers in flight beside it."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from .chip import Hardware
from .collectives import CollectiveCost, chain_homes, megascale_transfer, transfer_key
from .cost import op_seconds
from .hlo import CallGraph, Computation, HloModule, Instr, call_graph, called_computation, collective_kind
from .host import DONE_OPCODES, host_transfer


@dataclass
class Timeline:
    """One execution of a computation, replayed."""

    duration_s: float = 0.0  # compute of its own and nested + stalls waiting for transfers
    stall_s: float = 0.0  # of its own instructions (nested computations keep theirs)
    stalls: dict[str, float] = field(default_factory=dict)  # transfer key -> its stall, per execution


def _carried_keys(module: HloModule, ins: Instr) -> list[str]:
    """Transfers a fusion carries: the collectives inside its fused computation."""
    called = called_computation(module, ins)
    if called is None:
        return []
    return [transfer_key(called.name, i) for i in called.instrs if collective_kind(i.opcode)]


def _start_of(comp: Computation, name: str) -> Instr | None:
    """The -start / async-start an async -done (or async-update) closes."""
    ins = comp.by_name.get(name)
    for _ in range(16):
        if ins is None:
            return None
        if ins.opcode == "async-update" or (ins.opcode.endswith("-done") and ins.operands):
            ins = comp.by_name.get(ins.operands[0]) if ins.operands else None
            continue
        return ins
    return None


def _host_start(module: HloModule, comp: Computation, operands: list[str]) -> str | None:
    """The name of the host transfer's start that a -done of `operands` closes (None when it
    closes another)."""
    start = _start_of(comp, operands[0]) if operands else None
    return start.name if start is not None and host_transfer(module, comp, start) is not None else None


def events(module: HloModule, comp: Computation,
           homes: dict[str, set[str]] | None = None) -> dict[str, tuple[str, list[str]]]:
    """Instruction name -> ("open" | "close" | "sync", transfer keys) in one computation.

    open/close: an async pair (`*-start`/`*-done`, `async-start`/`async-done`, a megascale
    `send`/`send-done`), or the first and last instruction of a computation that carry the
    same channel (TPU async-collective fusions: start, the fusions that compute while it
    moves, done). sync: a plain collective, or a channel carried by one instruction only.
    A chain that is started and done in a computation that runs this one (chain_homes, e.g.
    a windowed-einsum loop body between the layer's first and last fusion of the chain) has
    no event here: its fusions here compute while it moves. `homes`: chain_homes of the
    module (computed when not given)."""
    if homes is None:
        homes = chain_homes(module, call_graph(module))
    out: dict[str, tuple[str, list[str]]] = {}
    carried: dict[str, list[str]] = defaultdict(list)  # key -> instruction names, schedule order
    for ins in comp.instrs:
        op = ins.opcode
        if megascale_transfer(ins) is not None:
            out[ins.name] = ("open", [f"{comp.name}/{ins.name}"])
        elif op == "send-done":
            start = comp.by_name.get(ins.operands[0]) if ins.operands else None
            if start is not None and megascale_transfer(start) is not None:
                out[ins.name] = ("close", [f"{comp.name}/{start.name}"])
        elif host_transfer(module, comp, ins) is not None:  # async-start / copy-start to or from host memory
            out[ins.name] = ("open", [f"{comp.name}/{ins.name}"])
        elif op == "async-start":
            called = called_computation(module, ins)
            keys = [transfer_key(called.name, i) for i in called.instrs if collective_kind(i.opcode)] if called else []
            if keys:
                out[ins.name] = ("open", keys)
        elif op in DONE_OPCODES and (host := _host_start(module, comp, ins.operands)):
            out[ins.name] = ("close", [f"{comp.name}/{host}"])
        elif op == "async-done" or (op.endswith("-done") and collective_kind(op[:-5] + "-start")):
            start = _start_of(comp, ins.operands[0]) if ins.operands else None
            if start is None:
                continue
            if start.opcode == "async-start":
                called = called_computation(module, start)
                keys = ([transfer_key(called.name, i) for i in called.instrs if collective_kind(i.opcode)]
                        if called else [])
            else:
                keys = [transfer_key(comp.name, start)]
            if keys:
                out[ins.name] = ("close", keys)
        elif op.endswith("-start") and collective_kind(op):
            out[ins.name] = ("open", [transfer_key(comp.name, ins)])
        elif collective_kind(op):
            out[ins.name] = ("sync", [transfer_key(comp.name, ins)])
        elif op == "fusion":
            for key in _carried_keys(module, ins):
                if key not in homes or comp.name in homes[key]:
                    carried[key].append(ins.name)
    for key, names in carried.items():
        if len(names) == 1:
            _add(out, names[0], "sync", key)
        else:
            _add(out, names[0], "open", key)
            _add(out, names[-1], "close", key)
    return out


def _add(out: dict, name: str, what: str, key: str) -> None:
    prev = out.get(name)
    if prev is None:
        out[name] = (what, [key])
    elif prev[0] == what:
        prev[1].append(key)
    else:  # one instruction that closes one chain and opens another: treat both as its own
        out[name] = ("sync", prev[1] + [key])


class _Links:
    """When each link resource is free again. A ring collective ("ici") occupies every ICI
    link of the chip; a collective-permute ("ici:<pairs>") one direction of a ring, so
    permutes with different source-target pairs run side by side, and beside nothing else;
    "dcn" transfers queue on the chip's share of the host NICs; "host:d2h" / "host:h2d" each on
    one direction of the chip's PCIe link."""

    def __init__(self):
        self.ring_free = 0.0  # when the last ring collective ends
        self.ici_free = 0.0  # when the last ICI transfer of any kind ends
        self.permute_free: dict[str, float] = {}
        self.dcn_free = 0.0
        self.host_free: dict[str, float] = {}

    def reserve(self, resource: str, now: float, seconds: float) -> float:
        """Queue a transfer issued at `now`; returns when it ends."""
        if resource.startswith("host:"):
            end = max(now, self.host_free.get(resource, 0.0)) + seconds
            self.host_free[resource] = end
            return end
        if resource == "dcn":
            begin = max(now, self.dcn_free)
            self.dcn_free = begin + seconds
            return self.dcn_free
        if resource.startswith("ici:"):
            begin = max(now, self.ring_free, self.permute_free.get(resource, 0.0))
            end = begin + seconds
            self.permute_free[resource] = end
            self.ici_free = max(self.ici_free, end)
            return end
        begin = max(now, self.ici_free)
        end = begin + seconds
        self.ring_free = self.ici_free = end
        return end


class ScheduleReplay:
    """Replays the non-fused computations of a scheduled module (memoized per computation)."""

    def __init__(self, module: HloModule, graph: CallGraph, hw: Hardware, costs: list[CollectiveCost],
                 homes: dict[str, set[str]] | None = None):
        self.module, self.graph, self.hw = module, graph, hw
        self.per_execution = {c.key: (c.seconds / c.executions if c.executions else 0.0, c.resource) for c in costs}
        self.memo: dict[str, Timeline] = {}
        self.homes = chain_homes(module, graph) if homes is None else homes

    def transfer(self, key: str) -> tuple[float, str]:
        return self.per_execution.get(key, (0.0, "ici"))

    def nested_seconds(self, comp: Computation, ins: Instr) -> float:
        """Duration of the computations an instruction runs (loops with their trip count)."""
        m = self.module
        if ins.opcode == "while":
            n = self.graph.trip_counts.get(ins.name, 1)
            body = (ins.attr("body") or "").lstrip("%")
            cond = (ins.attr("condition") or "").lstrip("%")
            return n * self.replay(body).duration_s + (n + 1) * self.replay(cond).duration_s
        if ins.opcode == "call":
            return sum(self.replay(x.strip().lstrip("%")).duration_s
                       for x in (ins.attr("to_apply") or ins.attr("calls") or "").strip("{}").split(",") if x.strip())
        if ins.opcode == "conditional":
            names = ins.attr("branch_computations")
            branches = [x.strip().lstrip("%") for x in names.strip("{}").split(",")] if names else \
                [(ins.attr(k) or "").lstrip("%") for k in ("true_computation", "false_computation")]
            branches = [b for b in branches if b in m.computations]
            return sum(self.replay(b).duration_s for b in branches) / len(branches) if branches else 0.0
        if ins.opcode == "async-start":
            called = called_computation(m, ins)
            if called is not None and not any(collective_kind(i.opcode) for i in called.instrs):
                return self.replay(called.name).duration_s  # wrapped compute: counted where it starts
        return 0.0

    def replay(self, name: str) -> Timeline:
        if name in self.memo:
            return self.memo[name]
        self.memo[name] = Timeline()  # the call graph is a DAG; this only guards malformed text
        comp = self.module.computations.get(name)
        if comp is None:
            return self.memo[name]
        evs = events(self.module, comp, self.homes)
        links = _Links()
        now = 0.0
        stalls: dict[str, float] = defaultdict(float)
        in_flight: dict[str, float] = {}  # key -> when it ends

        def wait(key: str) -> None:
            nonlocal now
            end = in_flight.pop(key, None)
            if end is not None and end > now:
                stalls[key] += end - now
                now = end

        for ins in comp.instrs:
            what, keys = evs.get(ins.name, (None, ()))
            if what in ("close", "sync"):
                for key in keys:
                    if what == "sync":
                        seconds, resource = self.transfer(key)
                        if seconds > 0:  # a transfer that moves nothing (a group of one) waits for nothing
                            in_flight[key] = links.reserve(resource, now, seconds)
                    wait(key)
            cost = op_seconds(self.module, comp, ins, self.hw)
            if cost is not None:
                now += cost[2]
            now += self.nested_seconds(comp, ins)
            if what == "open":
                for key in keys:
                    seconds, resource = self.transfer(key)
                    if seconds > 0:
                        in_flight[key] = links.reserve(resource, now, seconds)
        for key in list(in_flight):  # a transfer never closed here ends before the computation does
            wait(key)
        t = Timeline(now, sum(stalls.values()), dict(stalls))
        self.memo[name] = t
        return t


def exposed_by_schedule(module: HloModule, graph: CallGraph, hw: Hardware, costs: list[CollectiveCost],
                        homes: dict[str, set[str]] | None = None) -> dict[str, float]:
    """Exposed seconds per step of each transfer (by key): its stalls in every computation
    that runs on its own, times that computation's executions per step. `homes`:
    chain_homes of the module (computed when not given)."""
    replay = ScheduleReplay(module, graph, hw, costs, homes)
    exposed: dict[str, float] = defaultdict(float)
    wrapped = {c.name for comp in module.computations.values() for i in comp.instrs if i.opcode == "async-start"
               for c in [called_computation(module, i)]
               if c is not None and any(collective_kind(x.opcode) for x in c.instrs)}
    for name in module.computations:
        mult = graph.multiplier.get(name, 0.0)
        if mult == 0 or name in graph.fused or name in wrapped:  # an async-wrapped collective: its pair prices it
            continue
        for key, s in replay.replay(name).stalls.items():
            exposed[key] += s * mult
    return dict(exposed)

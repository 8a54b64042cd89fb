"""The v5e chip's VPU cycles by kind of work, and what its HBM <-> VMEM DMAs cost a step, from the chip's own
profiled steps, and how the splash kernels ran there against their grid price (issue 41, section 2: the figure behind
trainer/hardware.py V5E_VPU_CYCLES).

Question: the roofline prices an op without a matmul by its HBM bytes; on the chip RoPE's sine / cosine fusions
ran 1.3 ms with no HBM bytes at all (their buffers in VMEM), and the DMAs that fill VMEM, priced at their bytes
on the compute stream, waited 8-46% of that. How many cycles per vector register does each kind of VPU work take
in a real step, and what share of the DMAs' price does the step pay?
Peer: the chip itself: every op of the steps in benchmarks/data/chip_steps_v5e_run5, _run6, _run6b and _run7
(`chip_profile --save-hlo`: the chip compiler's HLO and each op's measured self time per step; run 5's were
profiled for being planned slow, run 6's for being planned fast, 6b's and 7's as held-out checks).

    python -m paxsearch.benchmarks.fit_vpu [--steps DIR ...] [--json FILE]

The fit: cycles c_k >= 0 per 32-bit register of each kind (roofline/vpu.py KINDS) minimising, over the ops of the
"other on-chip" bucket (trace.bucket_of), sum n (max(roofline, sum_k c_k regs_k / clock) - measured)^2 (n: an op's
executions per step; the roofline at the v5e entry without a VPU term). The DMA share: the measured waits of the
DMAs' -done halves over the roofline's price of their bytes, summed over the steps. The splash kernels: each kind's
measured time over its price (V5E_SPLASH_GRID), summed over the steps. Prints both, and per step the
bucket and the step (the sum of measured op times) against the roofline before and after ("after": every kind at
its fitted cycles and the DMAs at the measured share; the v5e entry takes every kind's cycles and, for the DMAs,
the schedule's idle time instead of a share: benchmarks/RESULTS.md, 'On-chip run 6' and 'On-chip run 7').
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import gzip
import json
import os
import sys

import numpy as np

DEFAULT_STEPS = tuple(os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", f"chip_steps_v5e_{run}")
                      for run in ("run5", "run6", "run6b", "run7", "run8", "run8b"))


SPLASH_KINDS = ("_fwd", "_dq", "_dkv")  # the splash kernels' names: forward, dQ, dK / dV


@dataclasses.dataclass
class StepOps:
    name: str
    measured: float  # sum of every op's measured self seconds per step
    other: list  # (seconds per execution measured, roofline seconds, [registers by kind], executions per step)
    dma_wait: float  # measured seconds per step the DMAs' -done halves took
    dma_price: float  # the roofline's seconds per step for the DMAs' bytes
    rest: float  # roofline seconds per step of everything else (matmuls, kernels)
    splash: dict = dataclasses.field(default_factory=dict)  # kernel kind -> [measured, priced] seconds per step


def saved_steps(folder: str):
    """(name, parsed HLO module, {instruction: [measured seconds per step, executions per step]}) of each step
    `chip_profile --save-hlo` kept in `folder` (NAME.hlo.txt.gz beside NAME.ops.json)."""
    from paxsearch.search.planning.roofline import hlo

    for path in sorted(glob.glob(os.path.join(folder, "*.ops.json"))):
        name = os.path.basename(path)[: -len(".ops.json")]
        hlo_path = os.path.join(folder, name + ".hlo.txt.gz")
        if not os.path.exists(hlo_path):
            continue
        with gzip.open(hlo_path, "rt") as f:
            module = hlo.parse_module(f.read())
        with open(path) as f:
            yield name, module, json.load(f)


def read_steps(folder: str, hw) -> list[StepOps]:
    """Each step of `folder` (NAME.hlo.txt.gz beside NAME.ops.json) priced op by op at `hw`."""
    from paxsearch.search.planning.roofline import cost, dma, hlo, model, vpu
    from paxsearch.search.planning.roofline import trace as T

    steps = []
    for name, module, ops in saved_steps(folder):
        graph = hlo.call_graph(module)
        step = StepOps(name, sum(v[0] for v in ops.values()), [], 0.0, 0.0, 0.0)
        for comp, ins, mult in model._running_ops(module, graph):
            if dma.dma_start(module, comp, ins) is not None:
                step.dma_wait += ops.get(ins.name, [0.0])[0]
            price = cost.op_price(module, comp, ins, hw, estimate=False)
            if price is None:
                continue
            bucket = T.bucket_of(module, comp, ins)
            kind = next((k for k in SPLASH_KINDS if k in ins.name), None) if bucket == T.ATTENTION else None
            if kind is not None:
                pair = step.splash.setdefault(kind, [0.0, 0.0])
                pair[0] += ops.get(ins.name, [0.0])[0]
                pair[1] += price.seconds * mult
            if bucket == T.DMA:
                step.dma_price += price.seconds * mult
            elif bucket == T.OTHER and ops.get(ins.name, [0.0, 0.0])[1] > 0:
                seconds, n = ops[ins.name]
                regs = vpu.vpu_registers(module, comp, ins)
                step.other.append((seconds / n, price.seconds, [regs[k] for k in vpu.KINDS], n))
            else:
                step.rest += price.seconds * mult
        steps.append(step)
    return steps


def _arrays(steps: list[StepOps]):
    rows = [r for s in steps for r in s.other]
    return (np.array([r[0] for r in rows]), np.array([r[1] for r in rows]), np.array([r[2] for r in rows]),
            np.array([r[3] for r in rows]))


def fit_cycles(steps: list[StepOps], clock_hz: float) -> np.ndarray:
    """Cycles per register by kind (vpu.KINDS) that best fit the steps' ops without a matmul (see the docstring)."""
    from scipy.optimize import minimize

    t, roof, regs, n = _arrays(steps)

    def loss(c: np.ndarray) -> float:
        return float((n * (np.maximum(roof, regs @ np.abs(c) / clock_hz) - t) ** 2).sum()) * 1e6

    best = None
    for start in ([1.0, 0.5, 0.1, 0.1, 0.1, 1.0], [20.0, 2.0, 0.5, 1.0, 1.0, 4.0], [10.0, 1.0, 0.2, 0.5, 0.2, 2.0]):
        r = minimize(loss, np.array(start), method="Nelder-Mead",
                     options={"maxiter": 20000, "xatol": 1e-4, "fatol": 1e-12})
        if best is None or r.fun < best.fun:
            best = r
    return np.abs(best.x)


def other_seconds(step: StepOps, cycles: np.ndarray | None, clock_hz: float) -> float:
    """The step's "other on-chip" bucket priced per op: its roofline, or at least its VPU time at `cycles`."""
    total = 0.0
    for _, roof, regs, n in step.other:
        vpu = float(np.dot(regs, cycles)) / clock_hz if cycles is not None else 0.0
        total += max(roof, vpu) * n
    return total


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", action="append", default=None,
                    help=f"folder of NAME.hlo.txt.gz + NAME.ops.json (repeatable; default: {', '.join(DEFAULT_STEPS)})")
    ap.add_argument("--json", default=None, help="also write the figures and the per-step table here")
    args = ap.parse_args(argv)
    from paxsearch.search.planning.predict import hardware_for
    from paxsearch.search.planning.roofline import vpu

    # the entry before run 6: ops by their bytes, DMAs on the stream at their bytes, splash at its grid price
    # measured alone (since run 7 the entry prices splash inside the steps' shapes at its rate there: fit_splash.py)
    hw = dataclasses.replace(hardware_for([None], "v5e"), vpu_cycles=(), dma_overlap=False, attention_in_step=(),
                             attention_step_grid=())
    folders = args.steps or list(DEFAULT_STEPS)
    steps = [s for folder in folders for s in read_steps(folder, hw)]
    if not steps:
        print(f"fit_vpu: no NAME.hlo.txt.gz + NAME.ops.json pairs in {', '.join(folders)}; save some with "
              "`chip_profile --save-hlo`", file=sys.stderr)
        return 2
    cycles = fit_cycles(steps, hw.clock_hz)
    share = sum(s.dma_wait for s in steps) / sum(s.dma_price for s in steps)
    print(f"{sum(len(s.other) for s in steps)} ops without a matmul in {len(steps)} steps; clock {hw.clock_hz:.4g} Hz")
    print("cycles per register: " + ", ".join(f"{k} {c:.3f}" for k, c in zip(vpu.KINDS, cycles, strict=True)))
    print(f"DMA share: measured waits {sum(s.dma_wait for s in steps) * 1e3:.1f} ms over priced "
          f"{sum(s.dma_price for s in steps) * 1e3:.1f} ms = {share:.3f}")
    splash = {}
    for kind in SPLASH_KINDS:
        pairs = [s.splash[kind] for s in steps if kind in s.splash]
        if pairs:
            splash[kind.strip("_")] = sum(m for m, _ in pairs) / sum(p for _, p in pairs)
            ratios = [m / p for m, p in pairs]
            print(f"splash {kind.strip('_')} in the step: measured / priced {splash[kind.strip('_')]:.3f} over "
                  f"{len(pairs)} steps (per step {min(ratios):.3f}-{max(ratios):.3f})")
    print("\n| step | measured ms | other: measured | roofline | with VPU | DMA waits | DMA price | step before | "
          "step after |")
    print("|---|---|---|---|---|---|---|---|---|")
    table = []
    for s in steps:
        measured_other = sum(t * n for t, _, _, n in s.other)
        before_other, after_other = other_seconds(s, None, hw.clock_hz), other_seconds(s, cycles, hw.clock_hz)
        before = s.rest + before_other + s.dma_price
        after = s.rest + after_other + share * s.dma_price
        table.append({"step": s.name, "measured_s": s.measured, "other_measured_s": measured_other,
                      "other_roofline_s": before_other, "other_vpu_s": after_other, "dma_wait_s": s.dma_wait,
                      "dma_price_s": s.dma_price, "before_s": before, "after_s": after})
        print(f"| {s.name} | {s.measured * 1e3:.1f} | {measured_other * 1e3:.1f} | {before_other * 1e3:.1f} | "
              f"{after_other * 1e3:.1f} | {s.dma_wait * 1e3:.1f} | {s.dma_price * 1e3:.1f} | "
              f"{before / s.measured - 1:+.1%} | {after / s.measured - 1:+.1%} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cycles": dict(zip(vpu.KINDS, map(float, cycles), strict=True)), "dma_share": share,
                       "splash_in_step": splash, "steps": table}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

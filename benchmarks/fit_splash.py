"""The v5e splash kernels' rates inside the chip's own training steps, by shape, and whether they price unseen steps
better than the kernels measured alone (issue 41, section 2: the figures behind trainer/hardware.py
V5E_SPLASH_STEP_GRID).

Question: the splash kernels were measured alone on the chip (V5E_SPLASH_GRID, by kernel, block, head dim, query
heads per K/V head, seq and batch x K/V heads). In the profiled training steps the same kernels ran 0.78-1.45x that
price, and not by one factor per kind: dQ at head dim 64 and batch 2 took 1.45x, at batch 12 0.92x; at head dim 128
with 3 query heads per K/V head 0.78-1.04x; with 2, longer the longer the sequence. Are the kernels' rates measured
in the steps themselves, looked up the same way, a better price for a step none of them came from?
Peer: the chip itself: every splash kernel of the steps in benchmarks/data/chip_steps_v5e_run5, _run6, _run6b,
_run7 and _run8 (`chip_profile --save-hlo`: the chip compiler's HLO and each op's measured self time per step).

    python -m paxsearch.benchmarks.fit_splash [--steps DIR ...] [--json FILE]

Per kernel kind, block, head dim, group (query heads per K/V head, 1 filed as 2), seq and batch x K/V heads: the
share of peak its executions ran at in the steps (their FLOPs, the roofline's count, over their measured time),
pooled over the steps that ran that shape. Then, leaving out one run's steps at a time (and then one step at a
time) and setting the table from the rest, each left-out step's splash kernels priced four ways against their
measured time, as a share of the step: at the grid measured alone (V5E_SPLASH_GRID), at that times one in-step
factor per kernel kind (V5E_SPLASH_IN_STEP), at the in-step table everywhere (Hardware.grid_share over its rows:
log-linear in batch x K/V heads, then in seq, held outside them), and at the in-step table only inside its measured
shapes, the grid times the factor elsewhere (the v5e entry since run 7: Hardware.step_grid_share; read beyond the
steps' few seqs the table priced plans of unseen seqs 6-8% fast). Left out by run, a run of new shapes (run 8's)
tests the fallback; left out by step, a point among shapes the steps measured. Prints the table as
trainer/hardware.py keeps it.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import sys

import numpy as np

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
DEFAULT_STEPS = tuple(os.path.join(DATA, f"chip_steps_v5e_{run}")
                      for run in ("run5", "run6", "run6b", "run7", "run8", "run8b"))
KERNELS = ("splash_mha_fwd", "splash_mha_dq", "splash_mha_dkv")


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One splash kernel of a profiled step."""

    run: str  # the steps' folder
    step: str
    kernel: str  # one of KERNELS
    key: tuple  # (seq, block, head dim, group, batch x K/V heads): cost.splash_grid_key
    flops: float  # per execution, the roofline's count
    seconds: float  # measured, per execution
    executions: float  # per step


def read_kernels(folder: str) -> tuple[list[Kernel], dict[str, float]]:
    """Every splash kernel of `folder`'s steps (NAME.hlo.txt.gz beside NAME.ops.json), and each step's measured
    time (the sum of its ops' self times)."""
    from paxsearch.benchmarks.fit_vpu import saved_steps
    from paxsearch.search.planning.roofline import cost, hlo, model

    kernels, steps = [], {}
    run = os.path.basename(folder.rstrip("/"))
    for name, module, ops in saved_steps(folder):  # ops: instruction -> [seconds per step, executions per step]
        steps[f"{run}/{name}"] = sum(v[0] for v in ops.values())
        for comp, ins, _ in model._running_ops(module, hlo.call_graph(module)):
            kernel = next((k for k in KERNELS if k in ins.name), None) if cost.splash_matmuls(ins) else None
            key = cost.splash_grid_key(comp, ins) if kernel else None
            seconds, n = ops.get(ins.name, (0.0, 0.0))
            if key is None or n <= 0 or key[1] is None:
                continue
            kernels.append(Kernel(run, name, kernel, key, cost.splash_flops(comp, ins), seconds / n, n))
    return kernels, steps


def step_table(kernels: list[Kernel], peak: float) -> dict[tuple, float]:
    """(kernel, block, head dim, group, seq, batch x K/V heads) -> share of peak, pooled over the kernels."""
    sums: dict[tuple, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    for k in kernels:
        seq, block, d, group, rows = k.key
        acc = sums[(k.kernel, block, d, max(2, group), seq, rows)]
        acc[0] += k.flops * k.executions
        acc[1] += k.seconds * k.executions
    return {key: f / t / peak for key, (f, t) in sums.items()}


def by_shape(table: dict[tuple, float]) -> dict[tuple, tuple]:
    """The table as trainer/hardware.py keeps it: {(kernel, block, head dim, group): ((seq, batch x K/V heads,
    share), ...)}."""
    by: dict[tuple, list] = collections.defaultdict(list)
    for (kernel, block, d, group, seq, rows), share in sorted(table.items()):
        by[(kernel, block, d, group)].append((seq, rows, share))
    return {key: tuple(pts) for key, pts in by.items()}


def grid_rows(table: dict[tuple, float]) -> tuple:
    """The table in Hardware.attention_grid's form (trainer/hardware.py splash_grid_table)."""
    from paxsearch.trainer import hardware

    return hardware.splash_grid_table(hardware.splash_rates(by_shape(table), "fit_splash"))


def kernel_seconds(hw, k: Kernel, fallback=None) -> float:
    """One execution of `k` priced as cost.flop_rate does (cost.splash_grid_rate), at `fallback` where hw has no row
    for its kernel."""
    from paxsearch.search.planning.roofline import cost

    rate = cost.splash_grid_rate(hw, k.kernel, k.key)
    return k.flops / rate if rate is not None else kernel_seconds(fallback, k)


def left_out_errors(kernels: list[Kernel], steps: dict[str, float], alone,
                    by: str = "run") -> dict[str, dict[str, float]]:
    """Per way of pricing, per step: (priced - measured splash seconds) / the step's measured seconds, each run's
    steps (`by` "run"; each step, `by` "step") priced from a table (or factor) set from the other runs' (steps')
    kernels alone."""
    ways: dict[str, dict[str, float]] = {"alone": {}, "alone x in-step factor by kind": {}, "in-step table": {},
                                         "in-step table inside its shapes, else alone x factor": {}}
    group = (lambda k: k.run) if by == "run" else (lambda k: f"{k.run}/{k.step}")
    for left in sorted({group(k) for k in kernels}):
        rest = [k for k in kernels if group(k) != left]
        sums: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
        for k in rest:
            sums[k.kernel][0] += k.seconds * k.executions
            sums[k.kernel][1] += kernel_seconds(alone, k) * k.executions
        factored = dataclasses.replace(alone, attention_in_step=tuple((n, m / p) for n, (m, p) in sums.items()))
        table = grid_rows(step_table(rest, alone.peak_flops))
        in_step = dataclasses.replace(alone, attention_grid=table)
        inside = dataclasses.replace(factored, attention_step_grid=table)
        for label, hw in zip(ways, (alone, factored, in_step, inside), strict=True):
            for k in (k for k in kernels if group(k) == left):
                step = f"{k.run}/{k.step}"
                ways[label][step] = ways[label].get(step, 0.0) + (
                    (kernel_seconds(hw, k, alone) - k.seconds) * k.executions / steps[step])
    return ways


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", action="append", default=None,
                    help=f"folder of NAME.hlo.txt.gz + NAME.ops.json (repeatable; default: {', '.join(DEFAULT_STEPS)})")
    ap.add_argument("--json", default=None, help="also write the table and the left-out errors here")
    args = ap.parse_args(argv)
    from paxsearch.search.planning.predict import hardware_for
    from paxsearch.trainer import hardware

    folders = args.steps or list(DEFAULT_STEPS)
    kernels, steps = [], {}
    for folder in folders:
        k, s = read_kernels(folder)
        kernels += k
        steps.update(s)
    if not kernels:
        print(f"fit_splash: no splash kernel in the steps of {', '.join(folders)}; save some with "
              "`chip_profile --save-hlo`", file=sys.stderr)
        return 2
    # the kernels measured alone, no in-step factor: what the table replaces
    alone = dataclasses.replace(hardware_for([None], "v5e"), attention_in_step=(), attention_step_grid=(),
                                attention_grid=hardware.splash_grid_table(hardware.V5E_SPLASH_GRID))
    table = step_table(kernels, alone.peak_flops)
    print(f"{len(kernels)} splash kernels in {len({(k.run, k.step) for k in kernels})} steps; "
          f"{len(table)} shapes\n")
    print("# (kernel, block, head dim, group): ((seq, batch x K/V heads, share of peak in the steps), ...)")
    for key, pts in by_shape(table).items():
        print(f"{key!r}: {tuple((seq, rows, round(share, 3)) for seq, rows, share in pts)!r},")
    if len({k.run for k in kernels}) < 2:
        print("\nThe left-out check needs the steps of two or more runs (--steps folders): not run.")
        ways: dict[str, dict[str, float]] = {}
        by_step: dict[str, dict[str, float]] = {}
    else:
        ways = left_out_errors(kernels, steps, alone)
        by_step = left_out_errors(kernels, steps, alone, by="step")
    for what, errors_by_way in (("run's steps priced from the other runs'", ways),
                                ("step priced from the other steps'", by_step)):
        if not errors_by_way:
            continue
        print(f"\nEach {what} kernels (splash priced - measured, share of the step):")
        print("| pricing | steps | mean | max | bias |")
        print("|---|---|---|---|---|")
        for label, errors in errors_by_way.items():
            e = np.array(list(errors.values()))
            print(f"| {label} | {len(e)} | {np.mean(np.abs(e)):.2%} | {np.max(np.abs(e)):.2%} | {np.mean(e):+.2%} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"table": [[*k, v] for k, v in sorted(table.items())], "left_out": ways,
                       "left_out_step": by_step}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

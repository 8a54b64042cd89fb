"""Which hardware figure decides each published row (issue 20, section 2; a diagnostic): each row's
stored plan config is planned again (compile-only, through the HLO passes), and its compiled step is
re-priced with one figure of the chip's roofline changed at a time. Prints, per row and figure:
  - how much the predicted step moves when the figure is 10% lower (its leverage on the row);
  - the value the figure would need for the plan to give the published step (the published
    program's work, as bench_published.py's ratio "with the published programs' work"), and the
    ratio the row then plans at (a check of the solve: the step is not exactly linear in a figure).
A figure whose needed value is far outside what a chip could do is not what the row misses by.

Question: which hardware figure decides each published row, and can any per-chip figure bring the
rows within 3% / 8%?
Peer: the published steps of the rows bench_published.py planned (its stored plans).

    python benchmarks/bench_published.py --out /tmp/bp          # first: the rows' stored plans
    python benchmarks/diag_figures.py --from /tmp/bp            # every row planned there
    python benchmarks/diag_figures.py --from /tmp/bp --only "v4-128 22B"

Each row runs in a fresh process (its flag set's LIBTPU_INIT_ARGS), 5-20 s a row on 2 cores (37 rows: 7 minutes).
Needs the tpu extra (libtpu).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys

from paxsearch.benchmarks import bench_published, published

# (Hardware field, how the step depends on it: "inverse" for a rate or share, "linear" for a latency)
FIGURES = (("matmul_efficiency", "inverse"), ("attention_efficiency", "inverse"), ("hbm_efficiency", "inverse"),
           ("ici_efficiency", "inverse"), ("ici_latency_s", "linear"), ("dcn_bandwidth", "inverse"),
           ("dcn_latency_s", "linear"))


def _solve(kind: str, value: float, step: float, lower: float, target: float) -> float | None:
    """The figure's value that gives `target`, from the step at `value` and at 0.9 x `value`,
    taking step = a + b / figure ("inverse") or a + b x figure ("linear"); None where no value does."""
    x0, x1 = (1 / value, 1 / (0.9 * value)) if kind == "inverse" else (value, 0.9 * value)
    slope = (lower - step) / (x1 - x0)
    if abs(slope) < 1e-12:
        return None
    x = x0 + (target - step) / slope
    if x <= 0:
        return None
    return 1 / x if kind == "inverse" else x


def matmul_floor(rows: list[tuple[str, float, float, float, float, float]]) -> str:
    """Per chip, the one matmul rate that brings its rows nearest their published steps, and the mean
    and worst error it leaves: a floor for any per-chip matmul figure, fitted to the rows (which the issue
    rules out). rows: (chip, rate now, step at it, the step's change at 0.9 x it, published step, the
    published program's extra attention seconds); each row's step taken as a + b / rate through its
    two points, its error as bench_published.py's ratio with the published programs' work."""
    def errors(mine: list, rate: float) -> list[float]:
        out = []
        for _, now, step, leverage, published_step, extra in mine:
            b = 9 * step * leverage * now
            out.append(abs(published_step / (step - b / now + b / rate + extra) - 1))
        return out

    lines = []
    for chip in sorted({r[0] for r in rows}):
        mine = [r for r in rows if r[0] == chip]
        best = min((r / 1000 for r in range(500, 1201)), key=lambda r: sum(errors(mine, r)))
        now, e = errors(mine, mine[0][1]), errors(mine, best)
        lines.append(f"{chip} ({len(mine)} rows): the rate now {mine[0][1]:.3f}, mean error {sum(now) / len(now):.1%} "
                     f"(max {max(now):.1%}); the best single rate {best:.3f}, mean {sum(e) / len(e):.1%} "
                     f"(max {max(e):.1%})")
    return "\n".join(lines)


def child(config_path: str, target_text: str, target_step: float) -> dict:
    """Plan one row's config on its target and re-price its step per figure (runs in its own process)."""
    from paxsearch.search.planning.targets import parse_target
    from paxsearch.search.study import configio
    from paxsearch.trainer import flagsets

    cfg = configio.build(configio.load(config_path))
    os.environ.update(flagsets.env_for(cfg.flags, "tpu"))
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from paxsearch.search.planning import hlo_passes, roofline
    from paxsearch.search.planning import topology as topo
    from paxsearch.search.planning.predict import hardware_for

    target = parse_target(target_text)
    devices = topo.topology_devices(target.slice_name, target.num_slices)
    program = hlo_passes.build_plan_program(cfg, devices, target.slice_name, target.num_slices)
    hw = hardware_for(devices, target.chip)
    text, n = program.plan.hlo_text, program.plan.num_devices

    def step(h) -> float:
        return roofline.analyze(text, h, mesh=program.mesh, num_devices=n).step_time_s

    base = step(hw)
    out = {"step_s": base, "chip": hw.name, "figures": {}}
    for name, kind in FIGURES:
        value = getattr(hw, name)
        if name == "attention_efficiency" and value is None:
            value = hw.matmul_efficiency  # None prices the kernels at the matmul rate: vary that rate alone
        lower = step(dataclasses.replace(hw, **{name: 0.9 * value}))
        if abs(lower - base) < 1e-4 * base:  # the row does not depend on it (no DCN on one slice, ...)
            out["figures"][name] = {"value": value, "leverage": 0.0, "needed": None, "check": None}
            continue
        needed = _solve(kind, value, base, lower, target_step)
        check = step(dataclasses.replace(hw, **{name: needed})) if needed is not None else None
        out["figures"][name] = {"value": value, "leverage": lower / base - 1, "needed": needed,
                                "check": target_step / check if check else None}
    return out


def _fmt(f: dict) -> str:
    if f["leverage"] == 0.0:
        return "-"
    needed = "none" if f["needed"] is None else (f"{f['needed'] * 1e6:.2f} us" if f["value"] < 1e-3
                                                 else f"{f['needed']:.3g}")
    now = f"{f['value'] * 1e6:.2f} us" if f["value"] < 1e-3 else f"{f['value']:.3g}"
    check = f" (plans {f['check']:.2f})" if f["check"] else ""
    return f"{f['leverage'] * 100:+.1f}%; {now} -> {needed}{check}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--from", dest="src", required=True, help="a bench_published.py --out folder")
    ap.add_argument("--only", action="append", default=[], help="row name (repeatable); default every row")
    ap.add_argument("--child", nargs=3, metavar=("CONFIG", "TARGET", "STEP"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], float(args.child[2]))))
        return 0
    print("| row | plan / published | " + " | ".join(n for n, _ in FIGURES) + " |")
    print("|---|---|" + "---|" * len(FIGURES))
    floor = []
    for row in bench_published.selected_rows(args.only):
        config = os.path.join(args.src, bench_published.slug(row.name), "run", "trials", "0", "config.json")
        if not os.path.exists(config):
            print(f"| {row.name} | no stored trial in {args.src} |" + " |" * len(FIGURES))
            continue
        published_step, extra = published.published_step_time(row), published.noncausal_extra_seconds(row)
        target_step = published_step - extra  # the plan's step that gives the published MFU with that work added
        proc = subprocess.run([sys.executable, __file__, "--from", args.src, "--child", config, row.target,
                               repr(target_step)], capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"| {row.name} | failed: {(proc.stderr.strip().splitlines() or ['?'])[-1][:120]} |"
                  + " |" * len(FIGURES))
            continue
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        cells = " | ".join(_fmt(r["figures"][n]) for n, _ in FIGURES)
        ratio = published_step / (r["step_s"] + extra)  # as bench_published
        print(f"| {row.name} | {ratio:.2f} | {cells} |", flush=True)
        m = r["figures"]["matmul_efficiency"]
        group = r["chip"] + (", one slice" if row.slices == 1 else ", several slices")
        floor.append((group, m["value"], r["step_s"], m["leverage"], published_step, extra))
    print("\nEach cell: the step's change with the figure 10% lower; the figure now -> the value that plans "
          "the published step (the ratio it then plans at). '-': it moves the step by under 0.01%.")
    whole_chip = [(c.split(",")[0] + ", all rows", *rest) for c, *rest in floor]
    print("\n" + matmul_floor(floor + whole_chip))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A plan from the HLO passes against the full compile, on every published row and on
spaces/llama_plan.py (issue 20, section 1: "plans in seconds").

Question: does a plan from the HLO passes equal the full compile's, and how much sooner does it
come?
Peer: the full compile (`--plan-compile full`) of the same point, the two alternated.

Each case is planned twice through the user's command, `paxsearch run SPACE --trials 1
--plan-cache off --plan-compile passes|full` (a fresh process each, the modes alternating,
--repeat times), and the stored plans are compared:

  peak      the passes' peak / the full compile's (the passes count CODE_BYTES_BOUND for the
            generated code the full compile measures; the issue's bound: within 1%)
  step      predicted step time, passes / full (bound: within 2%)
  flops     the roofline's FLOPs per step, passes / full (bound: exact)
  wall      the whole command's seconds, full / passes (the speed-up)

Published rows: benchmarks/published.py ROWS (bench_published.plan_row writes each row's
one-point space). llama_plan: POINTS below, each a `--set` of every decision of
spaces/llama_plan.py; the ranking of the points by predicted MFU must be the same both ways.

    python benchmarks/bench_plan_method.py                      # every row and every point, --repeat 1
    python benchmarks/bench_plan_method.py --only "v5e-256 16B" --no-llama
    python benchmarks/bench_plan_method.py --report             # re-print from runs/bench_plan_method/
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from paxsearch.benchmarks import bench_published

ROOT = bench_published.ROOT
MODES = ("passes", "full")
# spaces/llama_plan.py points: (mesh, attention, rules, per_device_batch, remat)
POINTS = (
    ("1x64x1", "flash", "default", 1, "full"),
    ("1x64x1", "dot_product", "default", 2, "minimal"),
    ("4x16x1", "flash", "default", 2, "full"),
    ("1x16x4", "flash", "sequence_parallel", 1, "minimal"),
    ("1x16x4", "dot_product", "default", 2, "full"),
    ("1x8x8", "flash", "sequence_parallel", 2, "full"),
    ("1x8x8", "dot_product", "default", 1, "minimal"),
    ("4x16x1", "dot_product", "default", 1, "minimal"),
)


class _Point:
    """A llama_plan point in the shape bench_published.plan_row takes."""

    def __init__(self, point):
        self.point = point
        mesh, attention, rules, batch, remat = point
        self.name = f"llama_plan {mesh} {attention} {rules} b{batch} {remat}"
        self.target = "tpu:v5e-64"
        self.sets = [f"mesh={mesh}", f"attention={attention}", f"rules={rules}", f"per_device_batch={batch}",
                     f"remat={remat}", "quantization=none"]  # the points as planned before int8 was a decision


def _plan(case, out: str, mode: str, timeout: int) -> dict:
    extra = ["--plan-cache", "off", "--plan-compile", mode]
    if isinstance(case, _Point):
        with open(os.path.join(ROOT, "spaces", "llama_plan.py")) as f:
            text = f.read()
        for s in case.sets:
            extra += ["--set", s]
        return bench_published.plan_row(case, os.path.join(out, mode), timeout, text=text, extra_args=extra)
    return bench_published.plan_row(case, os.path.join(out, mode), timeout, extra_args=extra)


def _figures(result: dict) -> dict:
    from paxsearch.store.plan import Plan

    plan = Plan.from_stored(result.get("plan")) or Plan()  # the result file holds the stored plan
    return {"wall_s": result["wall_s"], "peak": plan.peak_bytes, "code": plan.generated_code_bytes,
            "step": plan.predicted_step_time, "flops": plan.xla_flops_per_step,
            "mfu": plan.predicted_mfu, "method": plan.plan_method,
            "compile_s": plan.compile_seconds, "failure": result.get("failure_kind")}


def _ratio(a, b):
    return a / b if a is not None and b else None


def _f(x, fmt="{:.4f}"):
    return "-" if x is None else fmt.format(x)


def report(results: dict) -> str:
    lines = ["| case | full: wall s (compile s) | passes: wall s (compile s) | full / passes wall | peak GiB full "
             "(code MB) | peak passes / full | step passes / full | FLOPs passes / full | predicted MFU full, passes |",
             "|---|---|---|---|---|---|---|---|---|"]
    worst = {"peak": 0.0, "step": 0.0, "flops": 0.0}
    for name, runs in results.items():
        full = [_figures(r) for r in runs.get("full", [])]
        passes = [_figures(r) for r in runs.get("passes", [])]
        if not full or not passes:
            continue
        f, p = full[-1], passes[-1]
        if f["failure"] or p["failure"]:
            lines.append(f"| {name} | {f['failure'] or '-'} | {p['failure'] or '-'} | | | | | | |")
            continue
        walls = sorted(x["wall_s"] for x in full), sorted(x["wall_s"] for x in passes)
        ratios = {k: _ratio(p[k], f[k]) for k in ("peak", "step", "flops")}
        for k, v in ratios.items():
            if v is not None:
                worst[k] = max(worst[k], abs(v - 1))
        lines.append(
            f"| {name} | {' '.join(f'{w:.0f}' for w in walls[0])} ({f['compile_s']:.0f}) | "
            f"{' '.join(f'{w:.0f}' for w in walls[1])} ({p['compile_s']:.0f}) | "
            f"{walls[0][len(walls[0]) // 2] / walls[1][len(walls[1]) // 2]:.1f} | "
            f"{f['peak'] / 2**30:.2f} ({f['code'] / 1e6:.0f}) | {_f(ratios['peak'])} | {_f(ratios['step'])} | "
            f"{_f(ratios['flops'], '{:.6f}')} | {100 * f['mfu']:.2f}%, {100 * p['mfu']:.2f}% |")
    lines.append(f"\nworst |passes / full - 1|: peak {100 * worst['peak']:.2f}%, step {100 * worst['step']:.2f}%, "
                 f"FLOPs {100 * worst['flops']:.4f}%")
    points = [n for n in results if n.startswith("llama_plan")]
    verdicts = {m: {n: _figures(results[n][m][-1])["failure"] or "fits" for n in points} for m in MODES}
    lines.append("llama_plan verdicts the same both ways: "
                 + ("yes" if verdicts["passes"] == verdicts["full"] else f"NO: {verdicts}"))
    for mode in MODES:  # the points that fit, by predicted MFU
        fits = [n for n in points if verdicts[mode][n] == "fits"]
        order = sorted(fits, key=lambda n: -_figures(results[n][mode][-1])["mfu"])
        lines.append(f"llama_plan points that fit, by predicted MFU ({mode}): "
                     + " > ".join(n.split(" ", 1)[1] for n in order))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    bench_published.add_row_args(ap, os.path.join(ROOT, "runs", "bench_plan_method"))
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--no-llama", action="store_true", help="published rows only")
    ap.add_argument("--no-rows", action="store_true", help="llama_plan points only")
    args = ap.parse_args(argv)
    store = os.path.join(args.out, "results.json")
    results: dict = {}
    if os.path.exists(store):
        with open(store) as f:
            results = json.load(f)
    if not args.report:
        cases = ([] if args.no_rows else bench_published.selected_rows(args.only)) + ([] if args.no_llama else
                                                                         [_Point(p) for p in POINTS])
        for case in cases:
            runs = results[case.name] = {m: [] for m in MODES}
            for _ in range(args.repeat):
                for mode in MODES:
                    t0 = time.time()
                    r = _plan(case, args.out, mode, args.timeout)
                    runs[mode].append(r)
                    print(f"[{case.name}] {mode}: {time.time() - t0:.0f} s {json.dumps(_figures(r))}", flush=True)
            with open(store, "w") as f:
                json.dump(results, f, indent=1, default=str)
    print(report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

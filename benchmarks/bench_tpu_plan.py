"""Wall time of planning a space for a TPU target: paxsearch's planner against a naive loop.

naive    one process compiles every point one by one with trainer.plan.plan() defaults
         (count_flops=True: the step plus two unrolled FLOP probes), feasible = compiled and
         peak <= the chip's usable HBM.
planned  search.targets.plan_points: analytic pre-screening, de-duplication of identical
         compiles, compiles in parallel worker processes (one per core), one compile per
         point (FLOPs from the optimized HLO with loop trip counts).
Both must find the same feasible set. Each mode runs in its own fresh process.

    python benchmarks/bench_tpu_plan.py                                # the whole space (long)
    python benchmarks/bench_tpu_plan.py --limit 12 --set model.seq_len=256 --set model.n_layers=4
    python benchmarks/bench_tpu_plan.py --mode planned                 # planner only

Prints one JSON line per mode and a Markdown summary (goal: planned / naive <= 0.33).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_configs(args):
    from paxsearch.search import configio
    from paxsearch.search.space import load_space

    space = load_space(args.space)
    space.apply_sets(args.set)
    points = list(space.points())
    if args.stride > 1:
        points = points[::args.stride]
    if args.limit:
        points = points[:args.limit]
    cfgs = [configio.build(space.config(p)) for p in points]
    return space, points, cfgs


def run_naive(cfgs, target) -> list[dict]:
    from paxsearch.search import targets as T
    from paxsearch.trainer import topology as topo
    from paxsearch.trainer.errors import ConfigError
    from paxsearch.trainer.plan import plan

    devices = T.target_devices(target)
    out = []
    for cfg in cfgs:
        t0 = time.perf_counter()
        try:
            p = plan(cfg, devices)  # defaults: count_flops=True
            status = "planned" if p.peak_bytes <= target.hbm_bytes_per_device else "predicted_oom"
            peak = p.peak_bytes
        except ConfigError:
            status, peak = "invalid", None
        except Exception as e:
            status, peak = ("predicted_oom" if topo.is_resource_exhausted(e) else "compile_error"), None
        out.append({"status": status, "peak_bytes": peak, "seconds": time.perf_counter() - t0})
        print(f"[naive] point {len(out) - 1}: {status} in {out[-1]['seconds']:.1f} s", file=sys.stderr, flush=True)
    return out


def run_planned(cfgs, target, workers: int) -> list[dict]:
    from paxsearch.search import targets as T

    def progress(i, r):
        print(f"[planned] point {i}: {r['status']} in {r['seconds']:.1f} s", file=sys.stderr, flush=True)

    res = T.plan_points(cfgs, target, workers=workers, on_result=progress)
    return [{"status": r["status"], "peak_bytes": (r["plan"] or {}).get("peak_bytes"), "seconds": r["seconds"],
             "prescreened": r.get("prescreened"), "duplicate_of": r.get("duplicate_of"),
             "predicted_mfu": (r["plan"] or {}).get("predicted_mfu"),
             "predicted_step_time": (r["plan"] or {}).get("predicted_step_time")} for r in res]


def child(args) -> None:
    from paxsearch.search import targets as T

    target = T.parse_target(args.target) if args.target else None
    space, points, cfgs = load_configs(args)
    target = target or T.parse_target(space.settings.target)
    T.apply_env(target)
    t0 = time.perf_counter()
    rows = run_naive(cfgs, target) if args.mode == "naive" else run_planned(cfgs, target, args.workers)
    wall = time.perf_counter() - t0
    print(json.dumps({"mode": args.mode, "target": target.name, "points": points, "wall_s": wall, "rows": rows}))


def summarize(results: dict) -> str:
    lines = []
    feas = {m: {i for i, r in enumerate(res["rows"]) if r["status"] == "planned"} for m, res in results.items()}
    for mode, res in results.items():
        n = len(res["rows"])
        statuses = {}
        for r in res["rows"]:
            statuses[r["status"]] = statuses.get(r["status"], 0) + 1
        cpu = f"{res['cpu_s']:.0f}" if "cpu_s" in res else "-"
        lines.append(f"| {mode} | {n} | {res['wall_s']:.1f} | {cpu} | {n / (res['wall_s'] / 60):.2f} | "
                     f"{len(feas[mode])} | {', '.join(f'{k} {v}' for k, v in sorted(statuses.items()))} |")
    head = ["| mode | points | wall s | CPU s | plans / min | feasible | outcomes |", "|---|---|---|---|---|---|---|"]
    text = "\n".join(head + lines)
    if set(results) == {"naive", "planned"}:
        ratio = results["planned"]["wall_s"] / results["naive"]["wall_s"]
        same = feas["naive"] == feas["planned"]
        text += f"\n\nplanned / naive wall time = {ratio:.3f} (goal <= 0.33); same feasible set: {same}"
        if "cpu_s" in results["planned"] and "cpu_s" in results["naive"]:
            text += f"\nplanned / naive CPU time = {results['planned']['cpu_s'] / results['naive']['cpu_s']:.3f}"
            text += (f"; load average before/after: naive {results['naive']['load_before']:.1f}/"
                     f"{results['naive']['load_after']:.1f}, planned {results['planned']['load_before']:.1f}/"
                     f"{results['planned']['load_after']:.1f} on {os.cpu_count()} cores")
        if not same:
            text += f" (naive {sorted(feas['naive'])}, planned {sorted(feas['planned'])})"
        pre = sum(1 for r in results["planned"]["rows"] if r.get("prescreened"))
        dup = sum(1 for r in results["planned"]["rows"] if r.get("duplicate_of") is not None)
        text += f"\nplanner: {pre} point(s) pre-screened without compiling, {dup} duplicate compile(s) skipped"
    return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--space", default=os.path.join(ROOT, "spaces", "tpu_v5e_plan.py"))
    ap.add_argument("--target", default=None, help="override the space's target (e.g. tpu:v5e-16)")
    ap.add_argument("--set", action="append", default=[], help="decision or config override (repeatable)")
    ap.add_argument("--limit", type=int, default=0, help="plan only the first N points")
    ap.add_argument("--stride", type=int, default=1, help="every k-th point of the grid")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--mode", choices=("both", "naive", "planned"), default="both")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", default=None, help="write the raw results here")
    args = ap.parse_args(argv)
    if args.child:
        child(args)
        return 0
    modes = ["naive", "planned"] if args.mode == "both" else [args.mode]
    results = {}
    for mode in modes:
        cmd = [sys.executable, os.path.abspath(__file__), "--child", "--mode", mode, "--space", args.space,
               "--limit", str(args.limit), "--stride", str(args.stride), "--workers", str(args.workers)]
        cmd += [x for s in args.set for x in ("--set", s)] + (["--target", args.target] if args.target else [])
        env = {k: v for k, v in os.environ.items() if not k.startswith("TPU_")}
        env["JAX_PLATFORMS"] = "cpu"
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        load = os.getloadavg()[0]
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=env)  # progress: stderr passes through
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode != 0:
            return proc.returncode
        results[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
        # CPU seconds of the mode's whole process tree (workers included): the work done,
        # independent of how busy the shared machine was; load = 1-minute load average before
        results[mode]["cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        results[mode]["load_before"] = load
        results[mode]["load_after"] = os.getloadavg()[0]
        print(json.dumps({k: v for k, v in results[mode].items() if k != "points"}), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    print(summarize(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

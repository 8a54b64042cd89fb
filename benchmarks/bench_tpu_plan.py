"""Wall time of planning a space for a TPU target: `paxsearch run` against a naive loop.

Question: how much sooner does `paxsearch run` plan a TPU space than compiling every point?
Peer: a naive loop compiling every point one by one; both must find the same feasible set.

naive    one process compiles every point of the space one by one with trainer.plan.plan()
         defaults (count_flops=True: the step plus two unrolled FLOP probes); feasible =
         compiled and peak <= the chip's usable HBM.
planned  `paxsearch run SPACE` in a fresh run folder (fresh XLA cache): points settled
         without compiling (analytic pre-screen, duplicates, larger batches of a refused
         point), the rest compiled once each (FLOPs from the optimized HLO) in the space's
         `workers` processes.
Both must find the same feasible set. Each mode runs in its own fresh process tree.

    python benchmarks/bench_tpu_plan.py                               # spaces/tpu_v5e_plan.py (~25 min)
    python benchmarks/bench_tpu_plan.py --set mesh=1x16x1             # a slice of the space
    python benchmarks/bench_tpu_plan.py --mode planned

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


def child_naive(args) -> None:
    from paxsearch.search.planning import targets
    from paxsearch.search.planning import topology as topo
    from paxsearch.search.planning.predict import hlo_cost
    from paxsearch.search.study import configio
    from paxsearch.search.study.space import decisions_key, load_space
    from paxsearch.trainer.errors import ConfigError
    from paxsearch.trainer.plan import plan

    space = load_space(args.space)
    space.apply_sets(args.set)
    target = targets.parse_target(args.target or space.settings.target)
    targets.apply_env(target)
    t0 = time.perf_counter()
    devices = targets.target_devices(target)
    rows = {}
    for point in space.points():
        t = time.perf_counter()
        try:
            p = plan(configio.build(space.config(point)), devices, hlo_flops=hlo_cost)  # count_flops=True
            status = "planned" if p.peak_bytes <= target.hbm_bytes_per_device else "predicted_oom"
        except ConfigError:
            status = "invalid"
        except Exception as e:
            status = "predicted_oom" if topo.is_resource_exhausted(e) else "compile_error"
        rows[decisions_key(point)] = {"status": status, "seconds": time.perf_counter() - t}
        print(f"[naive] {decisions_key(point)}: {status} in {rows[decisions_key(point)]['seconds']:.1f} s",
              file=sys.stderr, flush=True)
    print(json.dumps({"mode": "naive", "wall_s": time.perf_counter() - t0, "rows": rows}))


def run_planned(args, env) -> dict:
    from paxsearch.benchmarks.study_run import run_space
    from paxsearch.search.study.space import decisions_key
    from paxsearch.store.outcome import plan_of
    from paxsearch.store.plan import Plan

    extra = ["--trials", "100000", *[x for s in args.set for x in ("--set", s)]]
    extra += ["--target", args.target] if args.target else []
    extra += ["--workers", str(args.workers)] if args.workers else []
    wall, trials = run_space(args.space, extra, env)
    rows = {}
    for t in trials:
        a = t.user_attrs
        plan = plan_of(a) or Plan()
        rows[decisions_key(a["decisions"])] = {
            "status": a.get("failure_kind") or "planned", "screen": plan.screen,
            "seconds": (a.get("timings") or {}).get("total_s"), "predicted_mfu": plan.predicted_mfu,
            "predicted_step_time": plan.predicted_step_time, "peak_bytes": plan.peak_bytes}
    return {"mode": "planned", "wall_s": wall, "rows": rows}


def summarize(results: dict) -> str:
    lines = []
    feas = {m: {k for k, r in res["rows"].items() if r["status"] == "planned"} for m, res in results.items()}
    for mode, res in results.items():
        n = len(res["rows"])
        statuses: dict[str, int] = {}
        for r in res["rows"].values():
            statuses[r["status"]] = statuses.get(r["status"], 0) + 1
        lines.append(f"| {mode} | {n} | {res['wall_s']:.1f} | {res['cpu_s']:.0f} | {n / (res['wall_s'] / 60):.2f} | "
                     f"{len(feas[mode])} | {', '.join(f'{k} {v}' for k, v in sorted(statuses.items()))} |")
    head = ["| mode | points | wall s | CPU s | plans / min | feasible | outcomes |", "|---|---|---|---|---|---|---|"]
    text = "\n".join(head + lines)
    if set(results) == {"naive", "planned"}:
        ratio = results["planned"]["wall_s"] / results["naive"]["wall_s"]
        same = feas["naive"] == feas["planned"]
        text += f"\n\nplanned / naive wall time = {ratio:.3f} (goal <= 0.33); same feasible set: {same}"
        text += f"\nplanned / naive CPU time = {results['planned']['cpu_s'] / results['naive']['cpu_s']:.3f}"
        text += (f"; 1-min load average before/after: naive {results['naive']['load_before']:.1f}/"
                 f"{results['naive']['load_after']:.1f}, planned {results['planned']['load_before']:.1f}/"
                 f"{results['planned']['load_after']:.1f} on {os.cpu_count()} cores")
        if not same:
            text += f" (only naive: {sorted(feas['naive'] - feas['planned'])}, " \
                    f"only planned: {sorted(feas['planned'] - feas['naive'])})"
    if "planned" in results:
        screens: dict[str, int] = {}
        for r in results["planned"]["rows"].values():
            kind = (r.get("screen") or "compiled").split(" ")[0]
            screens[kind] = screens.get(kind, 0) + 1
        text += "\nplanner: " + ", ".join(f"{k} {v}" for k, v in sorted(screens.items()))
    return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--space", default=os.path.join(ROOT, "spaces", "tpu_v5e_plan.py"))
    ap.add_argument("--target", default=None, help="override the space's target (e.g. tpu:v5e-16)")
    ap.add_argument("--set", action="append", default=[], help="decision or config override (repeatable)")
    ap.add_argument("--workers", type=int, default=0, help="planner workers (default: the space's)")
    ap.add_argument("--mode", choices=("both", "naive", "planned"), default="both")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", default=None, help="write the raw results here")
    args = ap.parse_args(argv)
    if args.child:
        child_naive(args)
        return 0
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPU_")}
    env["JAX_PLATFORMS"] = "cpu"
    results = {}
    for mode in (["naive", "planned"] if args.mode == "both" else [args.mode]):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        load = os.getloadavg()[0]
        if mode == "naive":
            cmd = [sys.executable, os.path.abspath(__file__), "--child", "--space", args.space]
            cmd += [x for s in args.set for x in ("--set", s)] + (["--target", args.target] if args.target else [])
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=env)  # progress: stderr
            if proc.returncode != 0:
                return proc.returncode
            results[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
        else:
            results[mode] = run_planned(args, env)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        # CPU seconds of the mode's whole process tree: the work done, whatever else ran
        results[mode]["cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        results[mode]["load_before"], results[mode]["load_after"] = load, os.getloadavg()[0]
        print(json.dumps({k: v for k, v in results[mode].items() if k != "rows"}), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    print(summarize(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

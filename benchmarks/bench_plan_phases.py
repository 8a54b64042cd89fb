"""Where one TPU plan's seconds go, and what compiling once saves (issue 20, section 1).

Question: where do one TPU plan's seconds go, and what does compiling once save?
Peer: the method before (the text views, then a second compile with an XLA dump), alternated.

One config (default: llama2-70b on v5p-256, fsdp 128, 1 sequence per chip, full remat; the case
whose compiled.as_text() fails, so its optimized HLO comes from an XLA dump) is planned the way a
plan-only trial plans it (search/planning/compilation.plan_point: build_program with
count_flops=False, keep_hlo=True, then the roofline), by two methods, each in a fresh process:

  once    today's trainer/plan.py: the compile itself dumps its optimized module (compile-only
          devices), so a failing as_text costs no second compile
  twice   the method before: the text views, then a second compile of the lowered step with an
          XLA dump (trainer/plan._compile_only forced False in that process)

Modes alternate (once, twice, once, twice, ...) --repeat times. Each prints one JSON line: the
wall seconds of the whole plan, the phases (lower_s, compile_s, flop_probes_s, hlo_text_s,
predict_s), the HLO source, the peak bytes and predicted step time (which must agree).

    python benchmarks/bench_plan_phases.py                     # llama2-70b, tpu:v5p-256, --repeat 2
    python benchmarks/bench_plan_phases.py --preset llama3-8b --target tpu:v5e-64 --ici 1x64x1
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child(args) -> None:
    from paxsearch.search.planning import targets
    from paxsearch.search.planning.compilation import plan_point
    from paxsearch.search.planning.method import PLAN_COMPILE_ENV
    from paxsearch.trainer import plan as plan_lib
    from paxsearch.trainer import presets
    from paxsearch.trainer.config import MeshConfig, TrainConfig

    os.environ[PLAN_COMPILE_ENV] = "full"  # both modes are full compiles (the HLO passes: bench_plan_method.py)
    if args.child == "twice":
        plan_lib._compile_only = lambda devices: False  # the dump only from a second compile
    target = targets.parse_target(args.target)
    ici = tuple(int(x) for x in args.ici.split("x"))
    cfg = TrainConfig(model=presets.source(args.preset).model, mesh=MeshConfig(ici=ici),
                      per_device_batch=args.per_device_batch, remat=args.remat)
    devices = targets.target_devices(target)
    phases: dict = {}
    t0 = time.perf_counter()
    _, plan = plan_point(cfg, target, devices, phases)
    wall = time.perf_counter() - t0
    print(json.dumps({"mode": args.child, "wall_s": round(wall, 2), "phases": phases,
                      "hlo_source": plan.hlo_source, "peak_bytes": plan.peak_bytes,
                      "predicted_step_time": plan.predicted_step_time}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="llama2-70b")
    ap.add_argument("--target", default="tpu:v5p-256")
    ap.add_argument("--ici", default="1x128x1", help="data x fsdp x tensor within the slice")
    ap.add_argument("--per-device-batch", type=int, default=1)
    ap.add_argument("--remat", default="full")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--child", choices=["once", "twice"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    rows: dict[str, list[dict]] = {"once": [], "twice": []}
    for _ in range(args.repeat):
        for mode in ("once", "twice"):
            cmd = [sys.executable, __file__, "--child", mode, "--preset", args.preset, "--target", args.target,
                   "--ici", args.ici, "--per-device-batch", str(args.per_device_batch), "--remat", args.remat]
            out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
            if out.returncode != 0:
                sys.exit(f"bench_plan_phases: the {mode} plan failed:\n{out.stderr[-3000:]}")
            row = json.loads(out.stdout.strip().splitlines()[-1])
            print(json.dumps(row), flush=True)
            rows[mode].append(row)
    once, twice = (statistics.median(r["wall_s"] for r in rows[m]) for m in ("once", "twice"))
    same = {(r["peak_bytes"], r["predicted_step_time"]) for m in rows for r in rows[m]}
    print(f"\n| {args.preset} on {args.target} ({args.ici}) | median wall s | phases (median run) |\n|---|---|---|")
    for mode, wall in (("once", once), ("twice", twice)):
        mid = sorted(rows[mode], key=lambda r: r["wall_s"])[len(rows[mode]) // 2]
        print(f"| {mode} | {wall:.1f} | {mid['hlo_source']}: " +
              ", ".join(f"{k} {v:.1f}" for k, v in mid["phases"].items()) + " |")
    print(f"\nonce / twice = {once / twice:.2f}; identical plans in every run: {len(same) == 1}")


if __name__ == "__main__":
    main()

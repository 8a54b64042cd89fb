"""A plan from the HLO passes against the full compile, on every published row and on
spaces/llama_plan.py; with --phases, where one full compile's plan spends its seconds (issue 20,
section 1: "plans in seconds").

Question: does a plan from the HLO passes equal the full compile's, and how much sooner does it
come? With --phases: where do one TPU plan's seconds go, and what does compiling once save?
Peer: the full compile (`--plan-compile full`) of the same point, the two alternated. With
--phases: the method before (the text views, then a second compile with an XLA dump), alternated.

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

--phases: one config (default: llama2-70b on v5p-256, fsdp 128, 1 sequence per chip, full remat;
a case whose compiled.as_text() failed, so its optimized HLO came from an XLA dump) is planned
the way a plan-only trial plans it (search/planning/compilation.plan_point, full compile:
build_program with count_flops=False, keep_hlo=True, then the roofline), by two methods, each in
a fresh process:

  once    today's trainer/plan.py: the compile itself dumps its optimized module (compile-only
          devices), so a failing as_text costs no second compile
  twice   the method before: the text views, then a second compile of the lowered step with an
          XLA dump (trainer/plan.compile_only forced False in that process)

Modes alternate (once, twice, once, twice, ...) --repeat times (default 2). Each prints one JSON
line: the wall seconds of the whole plan, the phases (lower_s, compile_s, flop_probes_s,
hlo_text_s, predict_s), the HLO source, the peak bytes and predicted step time (which must agree).

    python benchmarks/bench_plan_method.py --phases             # llama2-70b, tpu:v5p-256, --repeat 2
    python benchmarks/bench_plan_method.py --phases --preset llama3-8b --target tpu:v5e-64 --ici 1x64x1
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
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


# --phases: the one config's options and their defaults (given without --phases, an error)
PHASE_DEFAULTS = {"preset": "llama2-70b", "target": "tpu:v5p-256", "ici": "1x128x1", "per_device_batch": 1,
                  "remat": "full"}
PHASE_MODES = ("once", "twice")


def force_second_compile() -> None:
    """The 'twice' method in this process: build_program takes every device for a real one, so
    its compile dumps nothing and the optimized HLO, where as_text fails, costs a second compile."""
    from paxsearch.trainer import plan as plan_lib

    if not callable(getattr(plan_lib, "compile_only", None)):
        raise SystemExit("bench_plan_method --phases: trainer/plan.py has no compile_only() to force False")
    plan_lib.compile_only = lambda devices: False


def phases_child(args) -> None:
    """One plan of the --phases config by method args.phases_child, as one JSON line."""
    from paxsearch.search.planning import targets
    from paxsearch.search.planning.compilation import plan_point
    from paxsearch.search.planning.method import PLAN_COMPILE_ENV
    from paxsearch.trainer import presets
    from paxsearch.trainer.config import MeshConfig, TrainConfig

    os.environ[PLAN_COMPILE_ENV] = "full"  # both methods compile in full (the HLO passes: the mode without --phases)
    if args.phases_child == "twice":
        force_second_compile()
    target = targets.parse_target(args.target)
    cfg = TrainConfig(model=presets.source(args.preset).model, mesh=MeshConfig(ici=args.ici),
                      per_device_batch=args.per_device_batch, remat=args.remat)
    devices = targets.target_devices(target)
    phases: dict = {}
    t0 = time.perf_counter()
    _, plan = plan_point(cfg, target, devices, phases)
    wall = time.perf_counter() - t0
    print(json.dumps({"mode": args.phases_child, "wall_s": round(wall, 2), "phases": phases,
                      "hlo_source": plan.hlo_source, "peak_bytes": plan.peak_bytes,
                      "predicted_step_time": plan.predicted_step_time}), flush=True)


def phases(args) -> None:
    """Plan the --phases config once and twice, alternated --repeat times, and print the table."""
    ici = "x".join(str(n) for n in args.ici)
    rows: dict[str, list[dict]] = {m: [] for m in PHASE_MODES}
    for _ in range(args.repeat):
        for mode in PHASE_MODES:
            cmd = [sys.executable, __file__, "--phases", "--phases-child", mode, "--preset", args.preset,
                   "--target", args.target, "--ici", ici, "--per-device-batch", str(args.per_device_batch),
                   "--remat", args.remat]
            out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
            if out.returncode != 0:
                sys.exit(f"bench_plan_method --phases: the {mode} plan failed:\n{out.stderr[-3000:]}")
            row = json.loads(out.stdout.strip().splitlines()[-1])
            print(json.dumps(row), flush=True)
            rows[mode].append(row)
    once, twice = (statistics.median(r["wall_s"] for r in rows[m]) for m in PHASE_MODES)
    same = {(r["peak_bytes"], r["predicted_step_time"]) for m in rows for r in rows[m]}
    print(f"\n| {args.preset} on {args.target} ({ici}) | median wall s | phases (median run) |\n|---|---|---|")
    for mode, wall in (("once", once), ("twice", twice)):
        mid = sorted(rows[mode], key=lambda r: r["wall_s"])[len(rows[mode]) // 2]
        print(f"| {mode} | {wall:.1f} | {mid['hlo_source']}: " +
              ", ".join(f"{k} {v:.1f}" for k, v in mid["phases"].items()) + " |")
    print(f"\nonce / twice = {once / twice:.2f}; identical plans in every run: {len(same) == 1}")


def parse(argv=None) -> argparse.Namespace:
    """The options of either mode; an option of the other mode is an error, and so are a --phases
    config's unknown preset or target and a malformed --ici, before any process starts."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    bench_published.add_row_args(ap, os.path.join(ROOT, "runs", "bench_plan_method"))
    ap.add_argument("--repeat", type=int, default=None, help="rounds of both methods (default 1; --phases 2)")
    ap.add_argument("--no-llama", action="store_true", help="published rows only")
    ap.add_argument("--no-rows", action="store_true", help="llama_plan points only")
    group = ap.add_argument_group("--phases", "one full compile's phases, compiled once against twice")
    group.add_argument("--phases", action="store_true", help="time the phases of one config's plan instead")
    group.add_argument("--preset", help=f"default {PHASE_DEFAULTS['preset']}")
    group.add_argument("--target", help=f"default {PHASE_DEFAULTS['target']}")
    group.add_argument("--ici", help=f"data x fsdp x tensor within the slice, default {PHASE_DEFAULTS['ici']}")
    group.add_argument("--per-device-batch", type=int, help=f"default {PHASE_DEFAULTS['per_device_batch']}")
    group.add_argument("--remat", help=f"default {PHASE_DEFAULTS['remat']}")
    group.add_argument("--phases-child", choices=PHASE_MODES, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    phase_given = [f"--{k.replace('_', '-')}" for k in PHASE_DEFAULTS if getattr(args, k) is not None]
    if not args.phases:
        if phase_given:
            ap.error(f"{', '.join(phase_given)} only with --phases")
        args.repeat = 1 if args.repeat is None else args.repeat
        return args
    row_given = [o for o, v in (("--only", args.only), ("--report", args.report), ("--fresh", args.fresh),
                                ("--no-llama", args.no_llama), ("--no-rows", args.no_rows)) if v]
    if row_given:
        ap.error(f"{', '.join(row_given)} not with --phases (it plans one config: --preset, --target, --ici)")
    for k, v in PHASE_DEFAULTS.items():
        setattr(args, k, v if getattr(args, k) is None else getattr(args, k))
    args.repeat = 2 if args.repeat is None else args.repeat
    from paxsearch.search.planning import targets
    from paxsearch.trainer import presets
    from paxsearch.trainer.errors import ConfigError

    try:
        presets.source(args.preset)
        targets.parse_target(args.target)
    except (ConfigError, targets.TargetError) as e:
        ap.error(str(e))
    ici = args.ici.split("x")
    if len(ici) != 3 or not all(n.isdigit() and int(n) > 0 for n in ici):
        ap.error(f"--ici {args.ici}: data x fsdp x tensor, three positive integers, e.g. 1x128x1")
    args.ici = tuple(int(n) for n in ici)
    return args


def main(argv=None) -> int:
    args = parse(argv)
    if args.phases_child:
        phases_child(args)
        return 0
    if args.phases:
        phases(args)
        return 0
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

"""Search benchmarks: time to the best-MFU config against a naive loop, and harness overhead.

1. Time to best. The naive loop launches one fresh process per config of the (reduced) mesh
   sweep, with no screening, no compilation cache and full-length training (--naive-steps),
   and keeps the best MFU. paxsearch runs the same space (TPE, its short trials, screening,
   compilation cache, workers reused) and we take the wall time until it first completed a
   trial with that best config. Goal: <= 0.3 of the naive time, the same best config.
2. Harness overhead per trial: timings.overhead_s of every paxsearch trial (wall time outside
   compilation and training: proposing, storage, worker round trip). Goal: median <= 1 s.

    python benchmarks/bench_search.py                      # reduced sweep (30 configs), ~30-40 min
    python benchmarks/bench_search.py --set remat=none     # other --set to shrink/grow the space
    python benchmarks/bench_search.py --overhead-only --trials 12

MFU on simulated CPU devices is noisy on a shared machine: near-ties between configs can swap.
Results go to stdout as JSON lines and to --out (default runs/bench_search/result.json).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPACE = os.path.join(REPO, "spaces", "mesh_sweep.py")
DEFAULT_SETS = ["model_size=small", "remat=none"]


def _naive_one(config_path: str, steps: int) -> None:
    """(child process) train one config for `steps` steps; print its MFU as JSON."""
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    os.environ["JAX_PLATFORMS"] = "cpu"
    import dataclasses

    from paxsearch.search import configio
    from paxsearch.trainer.train import train

    cfg = configio.build(configio.loads(open(config_path).read()))
    cfg = dataclasses.replace(cfg, steps=steps, run_dir=None)
    result = train(cfg)
    print(json.dumps({"mfu": result.final.mfu if result.final else None}))


def naive(sets: list[str], steps: int) -> dict:
    from paxsearch.search import configio
    from paxsearch.search.space import load_space

    space = load_space(SPACE)
    space.apply_sets(sets)
    points = list(space.points())
    t0 = time.perf_counter()
    best, rows = None, []
    with tempfile.TemporaryDirectory() as tmp:
        for i, point in enumerate(points):
            path = os.path.join(tmp, f"{i}.json")
            with open(path, "w") as f:
                f.write(configio.dumps(space.config(point)))
            proc = subprocess.run([sys.executable, __file__, "_naive_one", path, str(steps)],
                                  capture_output=True, text=True, cwd=REPO)
            mfu = None
            for line in proc.stdout.splitlines()[::-1]:
                if line.startswith("{"):
                    mfu = json.loads(line)["mfu"]
                    break
            rows.append({"decisions": point, "mfu": mfu, "elapsed_s": time.perf_counter() - t0})
            print(json.dumps({"naive": i + 1, "of": len(points), **rows[-1]}), flush=True)
            if mfu is not None and (best is None or mfu > best["mfu"]):
                best = rows[-1]
    return {"configs": len(points), "total_s": time.perf_counter() - t0, "best": best, "rows": rows}


def search(sets: list[str], trials: int | None, run_dir: str, tuner: str) -> dict:
    import optuna

    # the naive loop has no memory budget, so neither does this run (the sweep's own 10 MiB
    # budget would rule out configs the naive loop may find best)
    cmd = [sys.executable, "-m", "paxsearch.search.cli", "run", SPACE, "--run-dir", run_dir,
           "--tuner", tuner, "--no-progress", "--memory-budget", "1GiB"] + [a for s in sets for a in ("--set", s)]
    if trials:
        cmd += ["--trials", str(trials)]
    t0 = time.time()
    subprocess.run(cmd, check=True, cwd=REPO)
    total = time.time() - t0
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name="mesh_sweep", storage=f"sqlite:///{os.path.abspath(run_dir)}/study.db")
    rows = []
    for t in study.get_trials():
        m = t.user_attrs.get("measured") or {}
        rows.append({"number": t.number, "decisions": t.user_attrs.get("decisions"), "mfu": m.get("mfu"),
                     "done_s": t.datetime_complete.timestamp() - t0 if t.datetime_complete else None,
                     "overhead_s": (t.user_attrs.get("timings") or {}).get("overhead_s"),
                     "failure_kind": t.user_attrs.get("failure_kind")})
    return {"total_s": total, "rows": rows}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_naive_one":
        _naive_one(sys.argv[2], int(sys.argv[3]))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", dest="sets", action="append", default=None, help="decisions fixed (default: "
                    + " ".join(DEFAULT_SETS) + ")")
    ap.add_argument("--naive-steps", type=int, default=100, help="training steps per config in the naive loop")
    ap.add_argument("--trials", type=int, default=None, help="paxsearch trial budget (default: the space size)")
    ap.add_argument("--tuner", default="tpe")
    ap.add_argument("--overhead-only", action="store_true", help="only run paxsearch and report its overhead")
    ap.add_argument("--out", default=os.path.join("runs", "bench_search", "result.json"))
    args = ap.parse_args()
    sets = args.sets if args.sets is not None else DEFAULT_SETS
    run_dir = os.path.join(os.path.dirname(args.out), f"search-{int(time.time())}")
    result: dict = {"sets": sets}
    found = search(sets, args.trials or (12 if args.overhead_only else 1000), run_dir, args.tuner)
    overheads = [r["overhead_s"] for r in found["rows"] if r["overhead_s"] is not None]
    result["overhead"] = {"median_s": statistics.median(overheads) if overheads else None,
                          "max_s": max(overheads) if overheads else None, "trials": len(overheads), "goal_s": 1.0}
    result["search"] = found
    if not args.overhead_only:
        base = naive(sets, args.naive_steps)
        result["naive"] = base
        best = base["best"]["decisions"] if base["best"] else None
        hits = [r["done_s"] for r in found["rows"] if r["decisions"] == best and r["done_s"] is not None]
        searched = [r for r in found["rows"] if r["mfu"] is not None]
        search_best = max(searched, key=lambda r: r["mfu"])["decisions"] if searched else None
        result["time_to_best"] = {
            "naive_best": best, "search_best": search_best, "same_best": best == search_best,
            "search_s": min(hits) if hits else None, "naive_s": base["total_s"],
            "ratio": (min(hits) / base["total_s"]) if hits else None, "goal_ratio": 0.3}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2, default=str)
    summary = {k: v for k, v in result.items() if k in ("overhead", "time_to_best")}
    print(json.dumps(summary, indent=2, default=str))


if __name__ == "__main__":
    main()

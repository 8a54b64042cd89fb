"""Search benchmarks: time to the best-MFU config against a naive loop, with and without
steering by predictions, and harness overhead.

Question: does search reach the best-MFU config sooner than a naive loop, does steering by
predictions help, and what does the harness cost a trial?
Peer: a naive loop of one fresh process per config (time to best); unsteered TPE on the same orders
(steering).

1. Time to best. The naive loop launches one fresh process per config of the (reduced) mesh
   sweep, with no screening, no compilation cache and no tuner, and keeps the best MFU. Every
   config trains exactly as long as its search trial does: the sweep's token budget (8,192
   tokens, steps = tokens / (global batch x seq_len)), so both sides do the same training.
   paxsearch runs the same space for the single objective MFU in up to three arms, one after
   the other in this script: `tpe` (today's default tuner), `tpe+global` (`--steer global`: a
   trial predicted dominated is skipped after compiling, search/tuning/steer.py, with one global
   measured/predicted bound) and `tpe+steer` (`--steer predicted`: its bound per point from the
   correction model learned on the study's measured trials, store/correction.py). For each arm: the
   wall time, proposals and trained trials until it first completed a trial of the naive loop's
   best config, and the time until it first measured an MFU within 5% of that best (MFU on a
   loaded machine is noisy, and near-ties swap). Goal: <= 0.3 of the naive time, the same best
   config. `--reference tpe` takes the unsteered tpe arm's best instead of running the naive
   loop; `--replay N` replays no steering and both steering rules offline on the tpe arm's
   measurements (see replay()), scored on independent runs of the same configs with
   `--truth-from` (the best of one noisy run is its luckiest measurement).
2. Harness overhead per trial: timings.overhead_s of every paxsearch trial (wall time outside
   compilation and training: proposing, storage, worker round trip). Goal: median <= 1 s.

    python benchmarks/bench_search.py                      # 30 configs, 3 sides, ~15-20 min
    python benchmarks/bench_search.py --set remat=none     # other --set to shrink/grow the space
    python benchmarks/bench_search.py --arms tpe           # one search arm only
    python benchmarks/bench_search.py --seed 1 --naive-from runs/bench_search/result.json  # another tuner seed
    python benchmarks/bench_search.py --overhead-only --trials 12
    python benchmarks/bench_search.py --arms tpe,tpe+global,tpe+steer --reference tpe --replay 200
    python benchmarks/bench_search.py --replay-from runs/bench_search/result.json --replay 500
    python benchmarks/bench_search.py --replay-from RUN_A --truth-from RUN_B --replay 500  # scored on run B
    python benchmarks/bench_search.py --arms tpe+global,tpe+steer --reference tpe --tpe-from RESULT_JSON

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

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPACE = os.path.join(REPO, "spaces", "mesh_sweep.py")
DEFAULT_SETS = ["model_size=small", "remat=none", "attention=dot_product", "rules=default", "flags=default"]
ARMS = {"tpe": ["--tuner", "tpe"], "tpe+global": ["--tuner", "tpe", "--steer", "global"],
        "tpe+steer": ["--tuner", "tpe", "--steer", "predicted"]}
WITHIN = 0.05  # "near best": measured MFU >= (1 - WITHIN) x the naive loop's best


def _naive_one(config_path: str) -> None:
    """(child process) train one config (its steps already the token budget's); print its MFU."""
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    os.environ["JAX_PLATFORMS"] = "cpu"
    import dataclasses

    from paxsearch.search.study import configio
    from paxsearch.trainer.train import train

    cfg = configio.build(configio.loads(open(config_path).read()))
    result = train(dataclasses.replace(cfg, run_dir=None))
    print(json.dumps({"mfu": result.final.mfu if result.final else None, "steps": result.steps_run}))


def naive(sets: list[str]) -> dict:
    """Every config once, in a fresh process, trained for its token budget's steps."""
    from paxsearch.search.driver.prepare import token_budget
    from paxsearch.search.study import configio
    from paxsearch.search.study.space import load_space

    space = load_space(SPACE)
    space.apply_sets(sets)
    tokens, devices = space.settings.tokens, int(space.settings.target.split(":")[1])
    points = list(space.points())
    t0 = time.perf_counter()
    best, rows = None, []
    with tempfile.TemporaryDirectory() as tmp:
        for i, point in enumerate(points):
            cfg = space.config(point)
            if tokens:  # the same steps as the search trial of this config
                cfg.steps = token_budget(configio.build(cfg), tokens, devices)["steps"]
            path = os.path.join(tmp, f"{i}.json")
            with open(path, "w") as f:
                f.write(configio.dumps(cfg))
            proc = subprocess.run([sys.executable, __file__, "_naive_one", path],
                                  capture_output=True, text=True, cwd=REPO)
            mfu = steps = None
            for line in proc.stdout.splitlines()[::-1]:
                if line.startswith("{"):
                    out = json.loads(line)
                    mfu, steps = out["mfu"], out["steps"]
                    break
            rows.append({"decisions": point, "mfu": mfu, "steps": steps, "elapsed_s": time.perf_counter() - t0})
            print(json.dumps({"naive": i + 1, "of": len(points), **rows[-1]}), flush=True)
            if mfu is not None and (best is None or mfu > best["mfu"]):
                best = rows[-1]
    return {"configs": len(points), "total_s": time.perf_counter() - t0, "best": best, "rows": rows}


def space_with_tokens(tokens: int, folder: str) -> str:
    """A copy of the sweep's space (same name, so the same study name) training `tokens` tokens a
    trial instead of its 8,192: longer timed intervals, less noise in each measured MFU."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, os.path.basename(SPACE))
    with open(path, "w") as f:
        f.write(f"import runpy\n_base = runpy.run_path({SPACE!r})\n"
                "globals().update({k: v for k, v in _base.items() if not k.startswith('__')})\n"
                f"STUDY = dict(STUDY, tokens={int(tokens)})\n")
    return path


def search(sets: list[str], trials: int | None, run_dir: str, arm: list[str], seed: int,
           tokens: int | None = None) -> dict:
    # the naive loop has no memory budget, so neither does this run (the sweep's own 10 MiB
    # budget would rule out configs the naive loop may find best)
    space = space_with_tokens(tokens, os.path.join(run_dir, "space")) if tokens else SPACE
    cmd = [sys.executable, "-m", "paxsearch.search.cli", "run", space, "--run-dir", run_dir, "--objective", "mfu",
           "--no-progress", "--memory-budget", "1GiB", "--seed", str(seed), *arm]
    cmd += [a for s in sets for a in ("--set", s)]
    if trials:
        cmd += ["--trials", str(trials)]
    t0 = time.time()
    subprocess.run(cmd, check=True, cwd=REPO)
    return {"total_s": time.time() - t0, "rows": study_rows(run_dir, t0)}


def study_rows(run_dir: str, t0: float | None = None) -> list[dict]:
    """One row per trial of the arm's study (times from t0, else from its first trial's start)."""
    import optuna

    from paxsearch.store.outcome import plan_of
    from paxsearch.store.plan import Plan

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name="mesh_sweep", storage=f"sqlite:///{os.path.abspath(run_dir)}/study.db")
    rows = []
    trials = study.get_trials()
    if t0 is None:
        t0 = min(t.datetime_start.timestamp() for t in trials if t.datetime_start)
    for t in trials:
        m = t.user_attrs.get("measured") or {}
        rows.append({"number": t.number, "decisions": t.user_attrs.get("decisions"), "mfu": m.get("mfu"),
                     "steps": m.get("steps"), "predicted_mfu": (plan_of(t.user_attrs) or Plan()).predicted_mfu,
                     "skipped": bool(t.user_attrs.get("steered")), "plan": t.user_attrs.get("plan"),
                     "done_s": t.datetime_complete.timestamp() - t0 if t.datetime_complete else None,
                     "overhead_s": (t.user_attrs.get("timings") or {}).get("overhead_s"),
                     "failure_kind": t.user_attrs.get("failure_kind")})
    return rows


def time_to_best(found: dict, base: dict) -> dict:
    """When a search arm first measured the naive loop's best config, and a config within WITHIN of it."""
    best = base["best"]
    rows = [r for r in found["rows"] if r["done_s"] is not None]
    measured = [r for r in rows if r["mfu"] is not None]
    hits = [r["done_s"] for r in measured if r["decisions"] == best["decisions"]]
    order = sorted(rows, key=lambda r: r["number"])
    at = next((i for i, r in enumerate(order) if r["mfu"] is not None and r["decisions"] == best["decisions"]), None)
    near = [r["done_s"] for r in measured if r["mfu"] >= (1 - WITHIN) * best["mfu"]]
    own = max(measured, key=lambda r: r["mfu"]) if measured else None
    return {"naive_best": best["decisions"], "naive_best_mfu": best["mfu"],
            "search_best": own["decisions"] if own else None, "search_best_mfu": own["mfu"] if own else None,
            "same_best": bool(own) and own["decisions"] == best["decisions"],
            "best_skipped": any(r["skipped"] and r["decisions"] == best["decisions"] for r in rows),
            "search_s": min(hits) if hits else None, "naive_s": base["total_s"],
            "ratio": (min(hits) / base["total_s"]) if hits else None,
            "near_s": min(near) if near else None, "near_ratio": (min(near) / base["total_s"]) if near else None,
            "search_total_s": found["total_s"], "trained": len(measured),
            "trials_to_best": None if at is None else at + 1,  # proposals up to and including the best's
            "trained_to_best": None if at is None else sum(r["mfu"] is not None for r in order[:at + 1]),
            "skipped": sum(r["skipped"] for r in rows), "goal_ratio": 0.3}


RULES = ("none", "global", "learned")  # replayed: no steering, --steer global, --steer predicted (the model)
CURVE_AT = (3, 5, 8, 10, 15)  # trainings at which the replay reports the best true MFU found so far


def _key(decisions) -> str:
    return json.dumps(decisions, sort_keys=True)


def truth_of(runs: list[list[dict]]) -> dict[str, float]:
    """Each config's mean measured MFU over independent runs (study rows): the 'true' MFU the
    replay scores against, so that the best config is not the one whose measurement in the
    steered run was luckiest (the winner's curse of a single noisy measurement)."""
    values: dict[str, list[float]] = {}
    for rows in runs:
        for r in rows:
            if r["mfu"] is not None:
                values.setdefault(_key(r["decisions"]), []).append(float(r["mfu"]))
    return {k: float(np.mean(v)) for k, v in values.items()}


def replay(found: dict, orders: int, seed: int = 0, truth: dict[str, float] | None = None) -> dict:
    """Steering replayed offline on an unsteered arm's measurements (every config trained once):
    for `orders` random orders of its configs, walk each order, skipping a config when the rule
    (search/tuning/steer.py, objective MFU) finds its stored plan dominated by the configs trained
    before it: never ("none"), with the global ratio ("global", --steer global) or with the learned
    correction ("learned", --steer predicted). The rules see the arm's measurements; they are
    scored on `truth` (config -> MFU, independent runs of the same configs, truth_of) when
    given, else on the same measurements.
    Reports, per rule, the trainings until the best config (by truth) and the first near-best one
    (within WITHIN of it) were trained, how often each was never trained (skipped), how many
    configs were trained, and the mean best true MFU found after k trainings (CURVE_AT, as a
    fraction of the best's). Every rule walks the same orders over the same measurements, so a
    difference is the rule's alone (not the machine's noise, nor TPE's adaptation)."""
    from paxsearch.store.plan import Plan

    rows = [r for r in found["rows"]
            if r["mfu"] is not None and (Plan.from_stored(r.get("plan")) or Plan()).predicted_mfu]
    if truth is not None:
        rows = [r for r in rows if _key(r["decisions"]) in truth]
    score = [truth[_key(r["decisions"])] if truth is not None else float(r["mfu"]) for r in rows]
    best = max(range(len(rows)), key=lambda i: score[i])
    perms = [np.random.default_rng([seed, k]).permutation(len(rows)) for k in range(orders)]
    out: dict = {"configs": len(rows), "best": rows[best]["decisions"], "best_mfu": score[best],
                 "scored_on": "independent runs (truth)" if truth is not None else "the steered measurements",
                 "near_best": sum(v >= (1 - WITHIN) * score[best] for v in score)}
    for rule in RULES:
        w = [_walk(rows, score, perm, best, rule) for perm in perms]
        reached = [x["trained_to_best"] for x in w if x["trained_to_best"] is not None]
        near = [x["trained_to_near"] for x in w if x["trained_to_near"] is not None]
        out[rule] = {"orders": orders, "best_skipped": orders - len(reached),
                     "trained_to_best_mean": float(np.mean(reached)) if reached else None,
                     "near_missed": orders - len(near),
                     "trained_to_near_mean": float(np.mean(near)) if near else None,
                     "trained_mean": float(np.mean([x["trained"] for x in w])),
                     "best_found_after": {k: float(np.mean([x["curve"][min(k, len(x["curve"])) - 1] for x in w]))
                                          / score[best] for k in CURVE_AT}}
    return out


def _walk(rows: list[dict], score: list[float], perm, best: int, rule: str) -> dict:
    """One order of `rows` steered by `rule`: when the best row was trained, when the first row
    within WITHIN of it was, how many were, and the best score trained after each training."""
    from paxsearch.search.tuning import steer
    from paxsearch.store import correction
    from paxsearch.store.plan import Plan

    trained: list[int] = []
    curve: list[float] = []
    at = near = None
    for i in perm:
        job = None
        if rule != "none":  # what the driver sends a worker (steer.steer_job), from the rows trained so far
            done = [rows[j] for j in trained]
            plans = [Plan.from_stored(r["plan"]) or Plan() for r in done]  # the rows hold stored plans
            logs = [correction.log_ratio(r["mfu"], p.predicted_mfu) for r, p in zip(done, plans, strict=True)]
            refs = [{"number": j, "mfu": rows[j]["mfu"], "memory_bytes": 0} for j in trained]
            job = steer.steer_job(["mfu"], plans, logs, refs, rule)
        if steer.dominated(job, Plan.from_stored(rows[i]["plan"]) or Plan()) is None:
            trained.append(int(i))
            curve.append(max(curve[-1], score[i]) if curve else score[i])
            if i == best:
                at = len(trained)
            if near is None and score[i] >= (1 - WITHIN) * score[best]:
                near = len(trained)
    return {"trained_to_best": at, "trained": len(trained), "trained_to_near": near, "curve": curve}


def _tpe_rows(path: str) -> list[dict]:
    """The study rows of an unsteered arm: its run folder, or the tpe arm of a result file."""
    if os.path.isdir(path):
        return study_rows(path)
    with open(path) as f:
        earlier = json.load(f)
    if "tpe" not in earlier["arms"]:
        sys.exit(f"bench_search: {path} has no tpe arm; run it with --arms tpe,...")
    return earlier["arms"]["tpe"]["search"]["rows"]


def overhead(found: dict) -> dict:
    values = [r["overhead_s"] for r in found["rows"] if r["overhead_s"] is not None]
    return {"median_s": statistics.median(values) if values else None, "max_s": max(values) if values else None,
            "trials": len(values), "goal_s": 1.0}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_naive_one":
        _naive_one(sys.argv[2])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", dest="sets", action="append", default=None, help="decisions fixed (default: "
                    + " ".join(DEFAULT_SETS) + ")")
    ap.add_argument("--trials", type=int, default=None, help="paxsearch trial budget (default: the space size)")
    ap.add_argument("--arms", default=",".join(ARMS), help=f"search arms, comma-separated, of {', '.join(ARMS)}")
    ap.add_argument("--seed", type=int, default=0, help="tuner seed of both search arms")
    ap.add_argument("--naive-from", default=None, metavar="RESULT_JSON",
                    help="reuse the naive loop of an earlier result file of the same --set (it takes ~10 min)")
    ap.add_argument("--overhead-only", action="store_true", help="only run paxsearch (tpe) and report its overhead")
    ap.add_argument("--reference", default="naive", choices=("naive", "tpe"),
                    help="the best config to reach: the naive loop's (default), or the unsteered tpe arm's (no "
                         "naive loop run; the tpe arm trains every config once)")
    ap.add_argument("--replay", type=int, default=0, metavar="ORDERS",
                    help="also replay both steering rules offline on the tpe arm's measurements over this many "
                         "random orders (needs the tpe arm with a budget of the whole space)")
    ap.add_argument("--replay-from", default=None, metavar="RESULT_JSON",
                    help="only replay (--replay orders, default 200) on the tpe arm of an earlier result file, "
                         "or on the study in an unsteered arm's run folder")
    ap.add_argument("--tokens", type=int, default=None,
                    help="training tokens per search trial (default: the sweep's 8,192); more gives each measured "
                         "MFU a longer timed interval (search arms only, not the naive loop)")
    ap.add_argument("--tpe-from", default=None, metavar="RESULT_JSON",
                    help="take the unsteered tpe arm from an earlier result file of the same --set, --seed and "
                         "--tokens instead of running it again")
    ap.add_argument("--truth-from", action="append", default=[], metavar="RUN_OR_JSON",
                    help="score the replay on the mean MFU of these independent unsteered runs of the same configs "
                         "(run folders or result files; repeatable) instead of on the replayed measurements")
    ap.add_argument("--out", default=os.path.join("runs", "bench_search", "result.json"))
    args = ap.parse_args()
    sets = args.sets if args.sets is not None else DEFAULT_SETS
    arms = ["tpe"] if args.overhead_only else args.arms.split(",")
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        sys.exit(f"bench_search: unknown arm(s) {', '.join(unknown)}; choose from {', '.join(ARMS)}")
    truth = truth_of([_tpe_rows(path) for path in args.truth_from]) if args.truth_from else None
    if args.replay_from:
        found = {"rows": _tpe_rows(args.replay_from)}
        print(json.dumps(replay(found, args.replay or 200, args.seed, truth), indent=2, default=str))
        return
    if args.tokens and args.reference == "naive" and not args.overhead_only:
        sys.exit("bench_search: --tokens changes the search arms' training only; use it with --reference tpe")
    if args.reference == "tpe" and "tpe" not in arms and not args.tpe_from:
        sys.exit("bench_search: --reference tpe needs the tpe arm; add it to --arms, or give --tpe-from")
    stamp = int(time.time())
    result: dict = {"sets": sets, "seed": args.seed, "tokens": args.tokens, "arms": {}}
    if args.tpe_from:  # the unsteered arm of an earlier run of the same space, seed and tokens
        with open(args.tpe_from) as f:
            earlier = json.load(f)
        same = {k: earlier.get(k) for k in ("sets", "seed", "tokens")}
        if "tpe" not in earlier["arms"] or same != {"sets": sets, "seed": args.seed, "tokens": args.tokens}:
            sys.exit(f"bench_search: {args.tpe_from} has no tpe arm of --set {sets} --seed {args.seed} "
                     f"--tokens {args.tokens} (it has {same})")
        result["arms"]["tpe"] = earlier["arms"]["tpe"]
        arms = [a for a in arms if a != "tpe"]
    for arm in arms:
        run_dir = os.path.join(os.path.dirname(args.out), f"search-{arm}-{stamp}")
        found = search(sets, args.trials or (12 if args.overhead_only else 1000), run_dir, ARMS[arm], args.seed,
                       args.tokens)
        result["arms"][arm] = {"overhead": overhead(found), "search": found}
    if not args.overhead_only:
        if args.reference == "tpe":
            tpe = result["arms"]["tpe"]["search"]
            measured = [r for r in tpe["rows"] if r["mfu"] is not None]
            base = {"best": max(measured, key=lambda r: r["mfu"]) if measured else None, "total_s": tpe["total_s"],
                    "from": "the unsteered tpe arm"}
        elif args.naive_from:
            with open(args.naive_from) as f:
                earlier = json.load(f)
            if earlier["sets"] != sets:
                sys.exit(f"bench_search: {args.naive_from} ran --set {earlier['sets']}, not {sets}")
            base = {**earlier["naive"], "from": args.naive_from}
        else:
            base = naive(sets)
        result["naive"] = base
        for arm in result["arms"]:
            arm_result = result["arms"][arm]
            arm_result["time_to_best"] = time_to_best(arm_result["search"], base) if base["best"] else None
    if args.replay and "tpe" in result["arms"]:
        result["replay"] = replay(result["arms"]["tpe"]["search"], args.replay, args.seed, truth)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2, default=str)
    summary = {arm: {k: v for k, v in r.items() if k in ("overhead", "time_to_best")}
               for arm, r in result["arms"].items()}
    if "replay" in result:
        summary["replay"] = result["replay"]
    print(json.dumps(summary, indent=2, default=str))


if __name__ == "__main__":
    main()

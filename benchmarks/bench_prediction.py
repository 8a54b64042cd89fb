"""Predicted against measured step time on this machine's devices.

Question: how close is the roofline's predicted step time to the measured one on this machine?
Peer: the measured step times of the same compiled trials.

Runs `paxsearch run SPACE` (measured trials: compiled, then trained briefly) in a fresh run
folder; every completed trial carries both its measured step time and the roofline's
prediction of the same compiled step (search/planning/roofline/ with this host's figures: the
measured peak FLOP/s and copy bandwidth). Prints measured / predicted per trial and their
median, min and max, for step time and MFU.

    python benchmarks/bench_prediction.py                          # spaces/mesh_sweep.py, 16 trials
    python benchmarks/bench_prediction.py --space spaces/model_size.py --trials 8
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--space", default=os.path.join(ROOT, "spaces", "mesh_sweep.py"))
    ap.add_argument("--trials", type=int, default=16)
    ap.add_argument("--set", action="append", default=[], help="decision or config override (repeatable)")
    args = ap.parse_args(argv)
    from paxsearch.benchmarks.study_run import run_space
    from paxsearch.store.outcome import plan_of
    from paxsearch.store.plan import Plan

    _, trials = run_space(args.space, ["--trials", str(args.trials), *[x for s in args.set for x in ("--set", s)]])
    rows = []
    for t in trials:
        a = t.user_attrs
        plan, measured = plan_of(a) or Plan(), a.get("measured") or {}
        if a.get("failure_kind") or not measured.get("step_time") or not plan.predicted_step_time:
            continue
        rows.append({"trial": t.number, **(a.get("decisions") or {}), "device_kind": (a.get("env") or {}).get(
            "device_kind"), "measured_step_s": measured["step_time"], "predicted_step_s": plan.predicted_step_time,
            "step_ratio": measured["step_time"] / plan.predicted_step_time,
            "mfu_ratio": (measured["mfu"] / plan.predicted_mfu) if plan.predicted_mfu else None})
    if not rows:
        print("no completed trial with both a measured and a predicted step time", file=sys.stderr)
        return 1
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
    for r in rows:
        print("| " + " | ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in r.values()) + " |")
    for key in ("step_ratio", "mfu_ratio"):
        values = [r[key] for r in rows if r[key] is not None]
        print(f"\n{key} (measured / predicted) over {len(values)} trials: median {statistics.median(values):.3f}, "
              f"min {min(values):.3f}, max {max(values):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

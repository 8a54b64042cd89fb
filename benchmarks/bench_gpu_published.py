"""Plan MaxText's published GPU rows (benchmarks/published.py GPU_ROWS) on their GPU node without a GPU
and compare the predicted MFU with the published one, converted to our convention.

Question: how close is a GPU node's plan, made without a GPU, to MaxText's published GPU MFU?
Peer: the published MFU (benchmarks/published.py GPU_ROWS, converted to our convention).

    python benchmarks/bench_gpu_published.py                          # every row, on its own target
    python benchmarks/bench_gpu_published.py --target gpu:h200x8      # the same rows on another node

With the CUDA plugin (pip install 'paxsearch[gpu-plan]') each row is compiled for the node
(plan_method compiled, ~15 s for Llama2-7B on 2 cores); without it, planned analytically
(plan_method analytic) after one line saying so. Prints one JSON line per row.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # compile-only GPU devices need no GPU backend

from paxsearch.benchmarks import published as pub  # noqa: E402
from paxsearch.search.planning.compilation import plan_point  # noqa: E402
from paxsearch.search.planning.targets import parse_target, planning_notice  # noqa: E402

KEEP = ("target", "plan_method", "peak_bytes", "hbm_bytes", "fits", "predicted_step_time", "predicted_mfu",
        "model_flops_per_step", "xla_flops_per_step", "compile_seconds")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", help="plan every row on this target instead of its own (e.g. gpu:h200x8)")
    args = p.parse_args()
    for row in pub.GPU_ROWS:
        target = parse_target(args.target or row.target)
        notice = planning_notice(target)
        if notice:
            print(notice, file=sys.stderr)
        t0 = time.perf_counter()
        plan = plan_point(pub.gpu_config(row), target)[1]
        stored = plan.to_stored()  # the row's JSON: the plan's stored keys
        published = pub.gpu_converted_mfu(row)
        wall = round(time.perf_counter() - t0, 1)
        print(json.dumps({"row": row.name, **{k: stored.get(k) for k in KEEP}, "wall_s": wall,
                          "published_mfu_ours": round(published, 4),
                          "published_step_s": round(pub.gpu_step_time(row), 4),
                          "predicted_over_published": round(plan.predicted_mfu / published, 4)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

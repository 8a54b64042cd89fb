"""What a trial worker's imports cost with Python's eager symbol binding (RTLD_NOW) and with the
lazy binding paxsearch's processes use (search/native_libs.py), side by side.

Each sample is a fresh process that imports what a training worker imports (the trial module,
the trainer's data module with seqio/TensorFlow, JAX's CPU backend started), in that order;
its CPU seconds (user + system) come from the kernel. The two modes alternate, so a change in
the machine's speed falls on both.

    python benchmarks/bench_worker_imports.py [--pairs 5]
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys

IMPORTS = "import paxsearch.search.trial.execute, paxsearch.trainer.data, jax; jax.devices()"
LAZY = "from paxsearch.search.native_libs import bind_symbols_lazily; bind_symbols_lazily(); "


def cpu_seconds_of(code: str) -> float:
    """CPU seconds of one fresh `python -c code` (it must exit 0)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3"}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    args = parser.parse_args()
    eager, lazy = [], []
    for i in range(args.pairs):
        eager.append(cpu_seconds_of(IMPORTS))
        lazy.append(cpu_seconds_of(LAZY + IMPORTS))
        print(f"pair {i + 1}: RTLD_NOW {eager[-1]:.2f} CPU-s, RTLD_LAZY {lazy[-1]:.2f} CPU-s", flush=True)
    ratios = [b / a for a, b in zip(eager, lazy, strict=True)]
    print(f"median: RTLD_NOW {statistics.median(eager):.2f} CPU-s, RTLD_LAZY {statistics.median(lazy):.2f} "
          f"CPU-s; lazy / eager {statistics.median(ratios):.2f} (pairs {min(ratios):.2f}-{max(ratios):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`paxsearch run` of a space in a fresh run folder, for benchmarks that compare its results.

Not a benchmark: a helper of bench_prediction.py and bench_tpu_plan.py.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_space(space: str, args: list[str], env: dict | None = None) -> tuple[float, list]:
    """(wall seconds, trials) of `paxsearch run SPACE ARGS --no-progress` in a temporary run
    folder (fresh storage and XLA cache); its trial lines go to stderr. Exits on failure."""
    import optuna

    with tempfile.TemporaryDirectory(prefix="bench_run_") as run_dir:
        cmd = [sys.executable, "-m", "paxsearch.search.cli", "run", space, "--run-dir", run_dir, "--no-progress",
               *args]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, env=env, cwd=ROOT, stdout=sys.stderr)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise SystemExit(f"paxsearch run exited {proc.returncode}")
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        with open(os.path.join(run_dir, "study.json")) as f:
            name = json.load(f)["study_name"]
        trials = optuna.load_study(study_name=name, storage=f"sqlite:///{run_dir}/study.db").get_trials()
    return wall, trials

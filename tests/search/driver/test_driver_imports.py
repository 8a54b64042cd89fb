"""The driver never runs a step: importing its loop (and the modules around it) imports no JAX,
so that `run`, `worker` and `resume` start at once and JAX is imported by the workers only."""
import subprocess
import sys

from ...search_util import REPO

MODULES = ["loop", "takeover", "shutdown", "prepare", "budget"]


def test_importing_the_driver_loop_imports_no_jax():
    code = ("import sys; " + "; ".join(f"import paxsearch.search.driver.{m}" for m in MODULES) + "; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'jaxlib')))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"

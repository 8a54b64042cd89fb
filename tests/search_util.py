"""Helpers of the search tests: the CLI in a subprocess, studies read back with plain Optuna."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from unittest import mock

import optuna
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
TINY = os.path.join(HERE, "spaces", "tiny_space.py")
HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None


def needs_cuda_plugin(test):
    """A test that compiles for an NVIDIA GPU node without a GPU: skipped only where the optional
    CUDA plugin (the gpu-plan extra, which CI does not install) is missing."""
    from paxsearch.search.planning import gpu_topology
    return pytest.mark.skipif(not gpu_topology.plugin_available(),
                              reason=f"the CUDA plugin is not installed ({gpu_topology.GPU_PLAN_EXTRA})")(test)


def needs_libtpu(test):
    """A test of TPU targets: marked `tpu`, skipped only where the optional libtpu (the `tpu`
    extra, which CI installs) is missing."""
    skip = pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu is not installed (pip install 'paxsearch[tpu]')")
    return pytest.mark.tpu(skip(test))


# A command line prefix that starts the command with SIGINT ignored, as a shell starts `cmd &` in a
# script (through sh, not a preexec_fn: forking this multithreaded process to run Python can deadlock).
AS_BACKGROUND_JOB = ["/bin/sh", "-c", 'trap "" INT; exec "$0" "$@"']


def cli(*args, env=None, timeout=600, check=True, faults: str | None = None) -> subprocess.CompletedProcess:
    """`paxsearch ARGS` in a subprocess (its own driver, as a user would run it); `faults`
    ("1:hang,2:nan") injects faults into those trials through the test-only entry point."""
    full_env = {**os.environ, **(env or {})}
    entry = ["paxsearch.tests.fault_driver", faults] if faults else ["paxsearch.search.cli"]
    proc = subprocess.run([sys.executable, "-m", *entry, *map(str, args)], cwd=REPO,
                          env=full_env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"paxsearch {' '.join(map(str, args))} exited {proc.returncode}\n"
                             f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}")
    return proc


def load(run_dir: str, name: str = "tiny_space") -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.load_study(study_name=name, storage=f"sqlite:///{os.path.abspath(run_dir)}/study.db")


def active(study) -> list:
    """Trials that count towards the budget (not superseded by a requeued copy)."""
    return [t for t in study.get_trials(deepcopy=False) if not t.user_attrs.get("superseded")]


def decision_keys(trials) -> list:
    return [tuple(sorted(t.params.items())) for t in trials]


def in_process(*args) -> int:
    """`paxsearch ARGS` in this process (its exit status), where the process itself is not what a
    test checks: no second interpreter paying ~10 CPU-s of imports (seqio pulls TensorFlow).
    What the command sets in os.environ (train: XLA_FLAGS, the flag set's name) is undone after,
    so the next test and its subprocesses see the session's environment. This process's JAX
    started with the session's 8 CPU devices: a check of another --cpu-devices needs cli()."""
    from paxsearch.search import cli as cli_package

    with mock.patch.dict(os.environ):
        return cli_package.main([str(a) for a in args])


def refused(capsys, *args, words=()) -> str:
    """`paxsearch ARGS` in this process: exit 2 and one line `paxsearch: error: ...` holding `words`."""
    code = in_process(*args)
    out, err = capsys.readouterr()
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("paxsearch: error: "), (code, out, err)
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]

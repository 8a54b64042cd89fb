"""A worker killed mid-trial is typed by who killed it (issue 10, defects 2, 3 and 9):
Ctrl-C of the driver requeues the trial (`interrupted`), a SIGKILL from someone else is a
`crash`, a kill by the kernel's OOM killer (counted in the cgroup) is `runtime_oom`; crash
recovery requeues exactly once."""
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from optuna.trial import TrialState

from paxsearch.search.trial.oom_watch import MemoryWatch, kernel_kills

from ...search_util import AS_BACKGROUND_JOB, REPO, TINY, load

LONG = ["--set", "steps=100000", "--timeout", "600"]  # a trial that trains until it is stopped


def _start_run(run_dir, *extra):
    # PYTHONFAULTHANDLER: a driver that does not exit is sent SIGABRT and prints every thread's stack.
    # Started as a script's background job (SIGINT ignored at start): Ctrl-C (a SIGINT sent to it) must
    # still stop it, as it does one started from a terminal.
    return subprocess.Popen([*AS_BACKGROUND_JOB, sys.executable, "-m", "paxsearch.search.cli", "run", TINY,
                             "--run-dir", str(run_dir), "--trials", "2", "--no-progress", *LONG, *extra],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONFAULTHANDLER": "1"})


def _communicate(proc, timeout: float) -> str:
    """The driver's output once it exits; a driver still running after `timeout` is aborted
    and the test fails with its threads' stacks (faulthandler) and its output."""
    try:
        return proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        out = proc.communicate(timeout=60)[0]
        raise AssertionError(f"the driver did not exit within {timeout:.0f} s; its threads and output:\n"
                             f"{out[-8000:]}") from None


def _wait_training(proc, run_dir, timeout=300.0) -> int:
    """Poll the SQLite storage until trial 0 is RUNNING and its worker is past its first steps;
    returns the worker's pid."""
    deadline = time.time() + timeout
    tb = run_dir / "trials" / "0" / "tb"
    while time.time() < deadline:
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        try:
            trials = load(run_dir).get_trials(deepcopy=False)
        except Exception:
            trials = []
        if trials and trials[0].state == TrialState.RUNNING and tb.exists() and any(tb.rglob("*tfevents*")):
            children = psutil.Process(proc.pid).children(recursive=True)
            workers = [c for c in children if "workers.entry" in " ".join(c.cmdline())]
            assert len(workers) == 1
            time.sleep(2.0)  # a few training steps
            return workers[0].pid
        time.sleep(0.5)
    proc.kill()
    raise AssertionError(f"trial 0 never started training: {proc.communicate()[0][-3000:]}")


@pytest.mark.slow
@pytest.mark.parametrize("sig, code, why", [(signal.SIGINT, 130, "interrupted (Ctrl-C)"),
                                             (signal.SIGTERM, 143, "terminated (SIGTERM)")])
def test_ctrl_c_or_sigterm_during_training_requeues_the_trial(tmp_path, sig, code, why):
    """Ctrl-C, and SIGTERM as SLURM, Kubernetes and preemptible VMs send it before they kill."""
    run = tmp_path / "run"
    proc = _start_run(run)
    _wait_training(proc, run)
    proc.send_signal(sig)
    out = _communicate(proc, 120)
    assert proc.returncode == code, out[-3000:]
    trials = load(run).get_trials(deepcopy=False)
    first = trials[0]
    assert first.state == TrialState.FAIL
    assert first.user_attrs.get("failure_kind") == "interrupted", first.user_attrs
    assert why in first.user_attrs.get("failure_message", "")
    assert first.user_attrs.get("superseded") is True  # not counted against the budget
    copies = [t for t in trials if t.user_attrs.get("requeued_from") == 0]
    assert len(copies) == 1 and copies[0].state == TrialState.WAITING
    assert all(t.user_attrs.get("failure_kind") != "runtime_oom" for t in trials)
    assert "Traceback" not in out


@pytest.mark.slow
def test_sigkill_from_someone_else_is_a_crash_not_an_oom(tmp_path):
    run = tmp_path / "run"
    proc = _start_run(run, "--trials", "1")
    pid = _wait_training(proc, run)
    os.kill(pid, signal.SIGKILL)
    out = _communicate(proc, 300)
    assert proc.returncode == 0, out[-3000:]
    first = load(run).get_trials(deepcopy=False)[0]
    assert first.state == TrialState.FAIL
    assert first.user_attrs["failure_kind"] == "crash", first.user_attrs
    assert "SIGKILL" in first.user_attrs["failure_message"] and "OOM" in first.user_attrs["failure_message"]


def _memory_cgroup_root():
    root = "/sys/fs/cgroup/memory"
    try:
        with open("/proc/self/cgroup") as f:
            rel = next(line.split(":", 2)[2].strip() for line in f if line.split(":")[1] == "memory")
    except (OSError, StopIteration):
        return None
    here = os.path.join(root, rel.lstrip("/"))
    return here if os.access(here, os.W_OK) else None


def _cgroup(parent, name, limit=None):
    path = os.path.join(parent, f"{name}_{os.getpid()}")
    os.mkdir(path)
    if limit is not None:
        with open(os.path.join(path, "memory.limit_in_bytes"), "w") as f:
            f.write(str(limit))
    return path


def _join(cgroup, pid):
    with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
        f.write(str(pid))


def _remove(*cgroups):
    for cg in cgroups:
        for _ in range(50):
            try:
                os.rmdir(cg)
                break
            except OSError:
                time.sleep(0.2)


# Waits for a line on stdin, then allocates until the kernel stops it.
HOG = ("import sys, time\nsys.stdin.readline()\nx = []\n"
       "while True:\n    x.append(bytearray(2**20))\n    time.sleep(0.001)\n")


def test_an_oom_kill_of_another_process_in_the_cgroup_is_not_the_workers():
    """A worker's memory cgroup is often the whole container's or CI job's, and its oom_kill counter
    counts every kill in it: a kill of another process (here a memory hog in a child cgroup with
    a 16 MiB limit) raises the counter while the worker dies of a SIGKILL from someone else. The
    kernel log names the OOM killer's victim; it is not the worker, so the kill is not the worker's.
    The hog's own watch, read the same way, is named by the log."""
    parent = _memory_cgroup_root()
    if parent is None or kernel_kills() is None:
        pytest.skip("no writable cgroup v1 memory controller, or no readable kernel log")
    shared = _cgroup(parent, "paxsearch_shared")
    hog_cg = _cgroup(shared, "hog", limit=16 * 2**20)
    worker = subprocess.Popen(["sleep", "120"])
    hog = subprocess.Popen([sys.executable, "-c", HOG], stdin=subprocess.PIPE, text=True)
    try:
        _join(shared, worker.pid)
        _join(shared, hog.pid)
        watch, hog_watch = MemoryWatch([worker.pid]), MemoryWatch([hog.pid])
        _join(hog_cg, hog.pid)
        hog.stdin.write("go\n")
        hog.stdin.flush()
        assert hog.wait(timeout=60) == -signal.SIGKILL  # the kernel's OOM killer
        worker.kill()
        assert worker.wait() == -signal.SIGKILL
        assert watch._counter_evidence() is not None  # the shared counter did rise...
        assert watch.oom_evidence(worker.pid) is None  # ...for the hog, which the log names
        said = hog_watch.oom_evidence(hog.pid)
        assert said and "oom_kill" in said and f"Killed process {hog.pid}" in said
    finally:
        for p in (worker, hog):
            p.kill()
            p.wait()
        _remove(hog_cg, shared)


@pytest.mark.slow
def test_kernel_oom_kill_is_runtime_oom(tmp_path):
    """A real kernel OOM kill: the training worker is moved into a memory cgroup with a tiny
    limit; its next allocations make the kernel kill it, and the cgroup counts the kill."""
    parent = _memory_cgroup_root()
    if parent is None:
        pytest.skip("no writable cgroup v1 memory controller")
    cg = _cgroup(parent, "paxsearch_oom", limit=8 * 2**20)
    try:
        run = tmp_path / "run"
        proc = _start_run(run, "--trials", "1")
        pid = _wait_training(proc, run)
        _join(cg, pid)
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out[-3000:]
        first = load(run).get_trials(deepcopy=False)[0]
        with open(os.path.join(cg, "memory.oom_control")) as f:
            kills = int(next(line.split()[1] for line in f if line.startswith("oom_kill ")))
        assert kills >= 1  # the kernel did kill it
        assert first.user_attrs["failure_kind"] == "runtime_oom", first.user_attrs
        assert "oom_kill" in first.user_attrs["failure_message"]
        if kernel_kills() is not None:  # the kernel log names the worker
            assert f"Killed process {pid}" in first.user_attrs["failure_message"]
    finally:
        _remove(cg)


def test_recovery_requeues_once_after_a_kill_between_its_steps(tmp_path):
    """Defect 9: a recovery killed after it queued the copy, before it failed the original,
    leaves a RUNNING trial and its WAITING copy; the next recovery must not queue a second."""
    from paxsearch.search.driver.context import create_or_continue
    from paxsearch.search.driver.takeover import abandon, recover_stale
    from paxsearch.search.study.space import load_space

    space = load_space(TINY)
    ctx = create_or_continue(space, space.settings, str(tmp_path / "run"), None, None)
    trial = ctx.study.ask()
    trial.suggest_categorical("mesh", ["8x1x1", "2x2x2", "4x2x1"])
    trial.suggest_categorical("per_device_batch", [1, 2])
    trial.set_user_attr("owner", {"host": "x", "pid": 1, "started": 0.0})  # long dead, another host
    ctx.study.enqueue_trial(dict(trial.params), user_attrs={"requeued_from": trial.number})  # step 1 done
    assert recover_stale(ctx) == [trial.number]
    trials = ctx.study.get_trials(deepcopy=False)
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.WAITING]
    assert trials[0].user_attrs["superseded"] is True
    assert not abandon(ctx, trial.number, "again")  # finished: nothing more to do

"""Ctrl-C and SIGTERM are bounded (issue 22, defect 8): whatever blocks (a worker that ignores
signals and leaves a child holding its pipes, a study database locked by another process),
the driver kills its workers, queues again what it can, says what it left for `resume`, and
exits 130 within shutdown.SHUTDOWN_S (+ a few seconds of process exit). A trial it could not mark
stays RUNNING and `resume` types it `interrupted`.

And a driver whose trial another driver took over (after a stale heartbeat) drops it with one
line when it wakes; the study stays exact."""
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from optuna.trial import TrialState

from ...search_util import REPO, TINY, load

BOUND_S = 10.0 + 8.0  # shutdown.SHUTDOWN_S, plus the process's own start and end of its exit (on a busy machine)

LOCKER = '''
import fcntl, sqlite3, sys, time
path, mode = sys.argv[1], sys.argv[2]
if mode == "db":
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN EXCLUSIVE")
else:
    f = open(path, "a+")
    fcntl.flock(f, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(600)
'''


def _lock(path, mode: str) -> subprocess.Popen:
    """Another process holding `path` (mode "db": an exclusive SQLite transaction on it;
    "flock": an fcntl lock on it) until it is killed."""
    proc = subprocess.Popen([sys.executable, "-c", LOCKER, str(path), mode], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def _driver(faults: str, run_dir, *extra) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "paxsearch.tests.fault_driver", faults, "run", TINY, "--run-dir",
                             str(run_dir), "--no-progress", "--timeout", "600", *map(str, extra)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONFAULTHANDLER": "1"})


def _wait_file(proc, path, timeout=300.0) -> None:
    deadline = time.time() + timeout
    while not path.exists():
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            out, err = proc.communicate()
            raise AssertionError(f"{path} never appeared:\n{out[-3000:]}\n{err[-3000:]}")
        time.sleep(0.2)


def _stop(proc, sig) -> tuple[float, str, str]:
    """Send `sig`; (seconds until the driver exited, stdout, stderr)."""
    t0 = time.monotonic()
    proc.send_signal(sig)
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)  # faulthandler: every thread's stack
        out, err = proc.communicate(timeout=60)
        raise AssertionError(f"the driver did not exit within 120 s:\n{err[-8000:]}") from None
    took = time.monotonic() - t0
    print(f"signal {sig.name} -> exit {proc.returncode} in {took:.1f} s")  # benchmarks/RESULTS.md (pytest -s)
    return took, out, err


def _workers_of(proc) -> list[psutil.Process]:
    return [c for c in psutil.Process(proc.pid).children(recursive=True) if "workers.entry" in " ".join(c.cmdline())]


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.slow
def test_ctrl_c_with_a_worker_that_ignores_signals_and_leaves_a_child_holding_its_pipes(tmp_path):
    """The worker ignores SIGINT and SIGTERM and has a child in a session of its own holding
    its pipes open (so the driver never sees their end): the driver still exits 130 within
    the bound, its worker killed, trial 0 queued again."""
    run = tmp_path / "run"
    proc = _driver("0:stubborn", run, "--trials", 2)
    child_file = run / "trials" / "0" / "stubborn_child.pid"
    _wait_file(proc, child_file)
    while not child_file.read_text().strip():
        time.sleep(0.1)
    child = int(child_file.read_text())
    workers = [w.pid for w in _workers_of(proc)]
    try:
        took, out, err = _stop(proc, signal.SIGINT)
        assert proc.returncode == 130, err[-3000:]
        assert took < BOUND_S, (took, err[-3000:])
        assert err.strip().splitlines()[-1] == "paxsearch: interrupted (Ctrl-C); trial 0 queued again", err
        assert "Traceback" not in err
        assert psutil.pid_exists(child)  # it did hold the pipes open all along
        assert workers and all(_gone(pid) for pid in workers)
    finally:
        os.kill(child, signal.SIGKILL)
    trials = load(run).get_trials(deepcopy=False)
    assert trials[0].state == TrialState.FAIL and trials[0].user_attrs["failure_kind"] == "interrupted"
    assert [t.state for t in trials if t.user_attrs.get("requeued_from") == 0] == [TrialState.WAITING]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["db", "flock"])
def test_ctrl_c_while_another_process_locks_the_study(tmp_path, mode):
    """The study database (an exclusive SQLite transaction) or its study lock is held by
    another process at the moment of Ctrl-C: the driver exits 130 within the bound, saying
    that trial 0 is left RUNNING for `resume`; once the lock is gone, resume's recovery types
    it `interrupted` and queues it again, once."""
    from paxsearch.search.driver.context import reopen
    from paxsearch.search.driver.takeover import recover_stale

    run = tmp_path / "run"
    proc = _driver("0:hang", run, "--trials", 2)
    _wait_file(proc, run / "trials" / "0" / "log.txt")  # the worker is in trial 0 (hanging)
    db = run / "study.db"
    locker = _lock(db if mode == "db" else f"{db}.lock", mode)
    try:
        took, out, err = _stop(proc, signal.SIGINT)
    finally:
        locker.kill()
        locker.wait()
    assert proc.returncode == 130, err[-3000:]
    assert took < BOUND_S, (took, err[-3000:])
    line = err.strip().splitlines()[-1]
    assert line.startswith("paxsearch: interrupted (Ctrl-C); trial 0 left RUNNING ("), err
    assert ("database is locked" if mode == "db" else "the study lock is held elsewhere") in line, line
    assert line.endswith(f"`paxsearch resume {run}` queues it again"), line
    assert "Traceback" not in err
    trials = load(run).get_trials(deepcopy=False)
    assert [t.state for t in trials] == [TrialState.RUNNING]  # nothing half-written

    ctx = reopen(f"sqlite:///{db}", None, str(run), {})
    assert recover_stale(ctx) == [0]
    assert recover_stale(ctx) == []
    trials = load(run).get_trials(deepcopy=False)
    assert trials[0].state == TrialState.FAIL and trials[0].user_attrs["superseded"] is True
    assert trials[0].user_attrs["failure_kind"] == "interrupted", trials[0].user_attrs
    assert "interrupted (Ctrl-C)" in trials[0].user_attrs["failure_message"]
    assert [t.state for t in trials if t.user_attrs.get("requeued_from") == 0] == [TrialState.WAITING]


def test_the_study_lock_and_a_bounded_storage_give_up_within_their_bound(tmp_path):
    """The two waits a driver shutting down bounds: the study lock held by another process,
    and a study database locked by another process."""
    import optuna

    from paxsearch.search.study.storage import LockTimeout, StudyLock, open_bounded, open_storage

    url = f"sqlite:///{tmp_path / 'study.db'}"
    optuna.create_study(study_name="s", storage=open_storage(url))
    locker = _lock(tmp_path / "study.db.lock", "flock")
    try:
        t0 = time.monotonic()
        with pytest.raises(LockTimeout):
            with StudyLock(url, "s").hold(timeout=1.0):
                pass
        assert 0.9 < time.monotonic() - t0 < 5.0
    finally:
        locker.kill()
        locker.wait()
    with StudyLock(url, "s").hold(timeout=1.0):  # free again
        pass
    locker = _lock(tmp_path / "study.db", "db")
    try:
        t0 = time.monotonic()
        with pytest.raises(optuna.exceptions.StorageInternalError) as e:  # a read, on opening it
            storage = open_bounded(url, 1.0)
            storage.set_study_user_attr(storage.get_study_id_from_name("s"), "x", 1)
        assert "database is locked" in str(e.value.__cause__)
        assert time.monotonic() - t0 < 5.0, time.monotonic() - t0
    finally:
        locker.kill()
        locker.wait()


def test_recording_a_trial_and_taking_it_over_exclude_each_other(tmp_path):
    """Under the study lock, exactly one of them happens: the owner that records first keeps
    its trial (a later recovery finds nothing to take over, and queues no copy); a trial taken
    over first is not recorded by its owner (its result is dropped), whichever order."""
    from paxsearch.search.driver.context import create_or_continue
    from paxsearch.search.driver.loop import Driver
    from paxsearch.search.driver.takeover import abandon
    from paxsearch.search.study.space import load_space

    space = load_space(TINY)
    ctx = create_or_continue(space, space.settings, str(tmp_path / "run"), None, None)
    driver = Driver(ctx, progress=False)

    def running():
        trial = ctx.study.ask()
        trial.suggest_categorical("mesh", ["8x1x1", "2x2x2", "4x2x1"])
        trial.suggest_categorical("per_device_batch", [1, 2])
        return trial

    first, second = running(), running()
    assert driver._write_if_ours(first, {"note": "recorded"}, [1.0, 0.5, 10.0], TrialState.COMPLETE)
    with ctx.lock.hold():
        assert not abandon(ctx, first.number, "driver died")
        assert abandon(ctx, second.number, "driver died")
    assert not driver._write_if_ours(second, {"note": "recorded"}, [1.0, 0.5, 10.0], TrialState.COMPLETE)
    trials = ctx.study.get_trials(deepcopy=False)
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.FAIL, TrialState.WAITING]
    assert trials[0].user_attrs["note"] == "recorded" and "note" not in trials[1].user_attrs
    assert [t.user_attrs.get("requeued_from") for t in trials] == [None, None, second.number]


@pytest.mark.slow
def test_a_driver_whose_trial_was_taken_over_drops_it_with_one_line_when_it_wakes(tmp_path):
    """Driver A (owning its trials as another host, heartbeat stale after 4 s) is stopped
    (SIGSTOP) in trial 0 past that; driver B takes trial 0 over, runs its copy and the rest of
    the budget. When A wakes (SIGCONT) it kills its worker, says so in one line, records
    nothing on trial 0 and exits 0; the study is exact: 2 trials count, no config twice."""
    from ...search_util import active, decision_keys

    run = tmp_path / "run"
    a = _driver("0:hang,host:host-a,stale_after:4,heartbeat:2", run, "--trials", 2)
    _wait_file(a, run / "trials" / "0" / "log.txt")
    a_workers = [w.pid for w in _workers_of(a)]
    os.kill(a.pid, signal.SIGSTOP)
    try:
        time.sleep(6)
        b = subprocess.run([sys.executable, "-m", "paxsearch.tests.fault_driver", "stale_after:4,heartbeat:2", "run",
                            TINY, "--run-dir", str(run), "--no-progress", "--trials", "2"],
                           cwd=REPO, capture_output=True, text=True, timeout=600)
    finally:
        os.kill(a.pid, signal.SIGCONT)
    assert b.returncode == 0, b.stderr[-3000:]
    assert "resumed: trial(s) 0 left running" in b.stdout, b.stdout
    out, err = a.communicate(timeout=300)
    assert a.returncode == 0, err[-3000:]
    taken = [line for line in out.splitlines() if "taken over" in line]
    assert taken == ["trial 0: taken over by another driver while this one was stopped or cut off (no heartbeat for "
                     "over 4 s); its result here is dropped, the copy queued by the other driver counts"], out
    assert "Traceback" not in err
    assert a_workers and all(_gone(pid) for pid in a_workers)  # its hanging worker was killed
    study = load(run)
    trials = study.get_trials(deepcopy=False)
    first = trials[0]
    assert first.state == TrialState.FAIL and first.user_attrs["superseded"] is True
    assert first.user_attrs["failure_kind"] == "crash"
    assert first.user_attrs["failure_message"].startswith("driver on host-a silent for "), first.user_attrs
    assert "timings" not in first.user_attrs  # A stored nothing of its own outcome
    counted = active(study)
    assert [t.state for t in counted] == [TrialState.COMPLETE, TrialState.COMPLETE]
    assert counted[0].user_attrs["requeued_from"] == 0
    assert len(set(decision_keys(counted))) == 2
    assert not [t for t in trials if t.state == TrialState.RUNNING]

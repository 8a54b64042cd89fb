"""Slice gangs as separate hosts would run them: independent `paxsearch worker` processes that
share nothing but the storage URL and their gang's coordinator address. Two gangs of two
hosts (4 simulated CPU devices each) on one PostgreSQL study; one host killed mid-trial."""
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import optuna
import pytest
from optuna.trial import TrialState

from paxsearch.search.study.storage import driver_url
from paxsearch.search.workers.pool import free_port

from ...search_util import HERE, REPO, active, cli, decision_keys

GANG = os.path.join(HERE, "spaces", "gang_space.py")


def _host(tmp_path, pg_url, gang: int, index: int, port: int, tag: str = "") -> tuple[subprocess.Popen, str]:
    log = str(tmp_path / f"g{gang}h{index}{tag}.out")
    cmd = [sys.executable, "-m", "paxsearch.search.cli", "worker", "--storage", pg_url, "--study", "gang_space",
           "--run-dir", str(tmp_path / f"g{gang}h{index}"), "--coordinator", f"127.0.0.1:{port}", "--num-hosts", "2",
           "--host-index", str(index), "--join-timeout", "180", "--no-progress"]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, log


def _wait(predicate, timeout: float, what: str, procs=()) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def _read(path: str) -> str:
    try:
        return open(path).read()
    except OSError:
        return ""


@pytest.mark.slow
@pytest.mark.postgres
def test_two_slice_gangs_share_one_study_and_survive_a_lost_host(tmp_path, pg_url):
    cli("run", GANG, "--storage", pg_url, "--run-dir", tmp_path / "created", "--create-only")
    ports = [free_port(), free_port()]
    hosts = {(g, i): _host(tmp_path, pg_url, g, i, ports[g]) for g in (0, 1) for i in (0, 1)}
    storage = driver_url(pg_url)
    # the same config in one process (8 devices), compared below, runs meanwhile: it shares nothing with the gangs
    single = tmp_path / "single"
    reference = ThreadPoolExecutor(1)
    alone_run = reference.submit(cli, "run", GANG, "--run-dir", single, "--set", "ici_mesh=2x4x1", "--trials", "1",
                                 "--no-progress")
    try:
        # gang 1 loses its host 1 while that host runs its first trial
        _wait(lambda: "running" in _read(hosts[(1, 1)][1]), 400, "gang 1's first trial")
        time.sleep(3.0)
        os.killpg(hosts[(1, 1)][0].pid, signal.SIGKILL)
        hosts[(1, 1)][0].wait(timeout=30)

        def lost():
            trials = optuna.load_study(study_name="gang_space", storage=storage).get_trials(deepcopy=False)
            return [t for t in trials if t.user_attrs.get("failure_kind") == "host_lost"]

        _wait(lambda: lost(), 120, "the lost host's trial to be recorded")
        hosts[(1, 1)] = _host(tmp_path, pg_url, 1, 1, ports[1], tag="-again")  # restarted, as a JobSet would
        for (g, i), (proc, log) in hosts.items():
            try:
                proc.wait(timeout=900)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"host {i} of gang {g} did not finish:\n{_read(log)[-3000:]}") from None
            assert proc.returncode == 0, f"host {i} of gang {g}:\n{_read(log)[-3000:]}"
    finally:
        for proc, _ in hosts.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        reference.shutdown(wait=True)
    alone_run.result()

    study = optuna.load_study(study_name="gang_space", storage=storage)
    trials = study.get_trials()
    counted = active(study)
    assert len(counted) == 4 and all(t.state == TrialState.COMPLETE for t in counted), \
        [(t.number, t.state, t.user_attrs.get("failure_message")) for t in trials]
    assert len(set(decision_keys(counted))) == 4  # the budget is exact and no config ran twice
    (gone,) = lost()
    assert gone.state == TrialState.FAIL and gone.user_attrs["superseded"]
    assert "host 1 of 2 stopped answering" in gone.user_attrs["failure_message"]
    again = [t for t in counted if t.user_attrs.get("requeued_from") == gone.number]
    assert len(again) == 1 and again[0].params == gone.params  # its config ran again, to completion
    owners = {t.user_attrs["owner"]["pid"] for t in trials}
    assert len(owners) == 2, "both gangs ran trials, each recorded by its host 0 only"
    for t in counted:
        env = t.user_attrs["env"]
        assert env["process_count"] == 2 and env["num_devices"] == 8
        assert "xla_force_host_platform_device_count=4" in env["xla_flags"]
    for g in (0, 1):  # hosts 1 write no study; they keep their own logs of the trials they ran
        follower = tmp_path / f"g{g}h1"
        assert not (follower / "study.db").exists()
        assert list(follower.glob("trials/*/log.1.txt"))
    assert "joined the slice gang" in _read(hosts[(1, 1)][1])  # the restarted host re-formed the gang

    # the same config in one process (8 devices) trains to the same losses
    alone = optuna.load_study(study_name="gang_space", storage=f"sqlite:///{single}/study.db").get_trials()[0]
    (ganged,) = [t for t in counted if t.params["ici_mesh"] == "2x4x1"]
    assert alone.user_attrs["env"]["process_count"] == 1
    steps = [s for s, _ in alone.user_attrs["intermediate"]]
    assert steps == [s for s, _ in ganged.user_attrs["intermediate"]] and len(steps) >= 2
    for (_, a), (_, b) in zip(alone.user_attrs["intermediate"], ganged.user_attrs["intermediate"], strict=True):
        assert a == pytest.approx(b, rel=1e-5)
    assert alone.user_attrs["measured"]["loss"] == pytest.approx(ganged.user_attrs["measured"]["loss"], rel=1e-5)


@pytest.mark.slow
def test_a_gang_that_cannot_form_stops_each_host_with_one_line(tmp_path, tiny_grid_run):
    """Host 0 alone, and host 1 alone, each stop after --join-timeout naming the coordinator;
    host 1 of a study with nothing left to run leaves at once, exit 0. The two lonely hosts
    run at the same time, each on a coordinator of its own; the finished study is the session's
    tiny grid run (every point of its space tried), which host 1 only reads."""
    run = tmp_path / "study"
    cli("run", GANG, "--run-dir", run, "--create-only")
    url = f"sqlite:///{run}/study.db"

    def host(index: int, storage: str, folder: str):
        return cli("worker", "--storage", storage, "--run-dir", tmp_path / folder,
                   "--coordinator", f"127.0.0.1:{free_port()}", "--num-hosts", "2", "--host-index", str(index),
                   "--join-timeout", "3", "--no-progress", check=False, timeout=400)

    with ThreadPoolExecutor(2) as pool:
        alone0, alone1 = pool.map(lambda i: host(i, url, f"h{i}"), (0, 1))
    assert alone0.returncode == 2, alone0.stdout + alone0.stderr
    line = alone0.stderr.strip().splitlines()[-1]
    assert "the slice gang at 127.0.0.1:" in line and "did not form" in line and "--num-hosts 2" in line
    study = optuna.load_study(study_name="gang_space", storage=url)
    assert study.get_trials() == []  # no trial was asked for a gang that never formed

    assert alone1.returncode == 2, alone1.stdout + alone1.stderr
    line = alone1.stderr.strip().splitlines()[-1]
    assert "host 1 could not join the slice gang at 127.0.0.1:" in line and "within 3 s" in line

    finished, _ = tiny_grid_run
    before = optuna.load_study(study_name="tiny_space", storage=f"sqlite:///{finished}/study.db").get_trials()
    done = host(1, f"sqlite:///{finished}/study.db", "h1-done")  # host 0 would have nothing to hand out
    assert done.returncode == 0, done.stdout + done.stderr
    assert "the study has no trial left to run" in done.stdout
    after = optuna.load_study(study_name="tiny_space", storage=f"sqlite:///{finished}/study.db").get_trials()
    assert after == before  # the shared study is left as it was


def _gang_of_two(tmp_path, url: str) -> list[str]:
    """Hosts 0 and 1 of one gang on `url` until they end (both must exit 0); their outputs."""
    port = free_port()
    procs = []
    for index in (0, 1):
        with open(tmp_path / f"h{index}.out", "w") as out:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "paxsearch.search.cli", "worker", "--storage", url, "--run-dir",
                 str(tmp_path / f"h{index}"), "--coordinator", f"127.0.0.1:{port}", "--num-hosts", "2",
                 "--host-index", str(index), "--join-timeout", "120", "--no-progress"], cwd=REPO, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True))
    try:
        for p in procs:
            p.wait(timeout=600)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    logs = [_read(str(tmp_path / f"h{i}.out")) for i in (0, 1)]
    assert [p.returncode for p in procs] == [0, 0], logs
    return logs


@pytest.mark.slow
def test_the_gang_starts_again_with_each_flag_set_and_prunes_on_every_host_at_the_same_step(tmp_path):
    """One gang of two hosts over three queued trials. A trial with another compiler flag set
    restarts the whole gang with it. Host 0's reports drive the median pruner and the other
    host gets the same decision at each step, so the pruned trial (learning rate 1e-9, after
    the pruner's two startup trials) ends on both hosts: the gang would hang in its
    collectives otherwise."""
    space = os.path.join(HERE, "spaces", "gang_flags_space.py")
    run = tmp_path / "study"
    cli("run", space, "--run-dir", run, "--create-only")
    url = f"sqlite:///{run}/study.db"
    queued = optuna.load_study(study_name="gang_flags_space", storage=url)
    # one change of set (not several, as a shuffled grid may have it), then the trial that
    # does not learn, on the set the gang already runs
    for lr, flags in ((1e-2, "default"), (2e-2, "cpu_eigen_dots"), (1e-9, "cpu_eigen_dots")):
        queued.enqueue_trial({"lr": lr, "flags": flags})
    logs = _gang_of_two(tmp_path, url)
    trials = sorted(optuna.load_study(study_name="gang_flags_space", storage=url).get_trials(),
                    key=lambda t: t.number)
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 2 + [TrialState.PRUNED], \
        ([(t.state, t.user_attrs.get("failure_message")) for t in trials], logs)
    for t in trials:  # each ran on a gang started with its set
        assert t.user_attrs["env"]["flag_set"] == t.params["flags"] and t.user_attrs["env"]["process_count"] == 2
    # the gang starts with the first config's set (default); every change of set restarts it
    sets = ["default"] + [t.params["flags"] for t in trials]
    changes = [b for a, b in zip(sets, sets[1:], strict=False) if a != b]
    assert changes == ["cpu_eigen_dots"]
    assert all(f"the gang starts again with compiler flag set {c}" in logs[1] for c in changes)
    assert logs[1].count("joined the slice gang") == 1 + len(changes), logs[1]
    bad = trials[2]
    assert max(bad.intermediate_values) < 8  # stopped before its last step
    assert f"trial {bad.number} done" in logs[1]  # host 1 left the pruned trial too, without failing

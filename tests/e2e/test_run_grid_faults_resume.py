"""End-to-end `paxsearch run` on a tiny space: grid, screening, forced faults, kill and resume."""
import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest
from optuna.trial import TrialState

from paxsearch.search.trial.record import PLAN_PHASES

from ..search_util import REPO, TINY, active, cli, decision_keys, load

TRIAL_ATTRS = {"decisions", "config", "config_dict", "plan", "measured", "memory_bytes", "timings", "env",
               "predicted", "trial_dir", "counters"}


def test_grid_runs_each_point_once_and_stores_everything(tiny_grid_run):
    run, out = tiny_grid_run  # `run TINY --trials 50 --set per_device_batch=2`
    assert "nothing to run" not in out.stdout
    study = load(run)
    trials = study.get_trials()
    assert len(trials) == 3  # K = 3 meshes once per-device batch is fixed
    assert len(set(decision_keys(trials))) == 3
    assert {t.params["mesh"] for t in trials} == {"8x1x1", "2x2x2", "4x2x1"}
    for t in trials:
        assert t.state == TrialState.COMPLETE, t.user_attrs.get("failure_message")
        assert TRIAL_ATTRS <= set(t.user_attrs), TRIAL_ATTRS - set(t.user_attrs)
        assert "failure_kind" not in t.user_attrs
        assert t.user_attrs["decisions"] == {"mesh": t.params["mesh"], "per_device_batch": 2}
        assert t.values[2] == t.user_attrs["plan"]["peak_bytes"] == t.user_attrs["memory_bytes"]
        own = t.user_attrs["measured"]["loss"]
        group = t.user_attrs.get("loss_group")
        assert math.isclose(t.values[0], group["loss"] if group else own)
        assert t.user_attrs["measured"]["steps"] == 4 and t.user_attrs["counters"]["train_calls"] == 1
        timings = t.user_attrs["timings"]  # where the plan's seconds went, too (trial/record.py PLAN_PHASES)
        assert set(timings) == {"plan_s", "train_s", "total_s", "worker_start_s", "overhead_s", *PLAN_PHASES}
        assert timings["worker_start_s"] >= 0  # starting the worker (first trial), apart from the plan and training
        assert timings["lower_s"] + timings["compile_s"] + timings["hlo_text_s"] <= timings["plan_s"] + 1e-3
        env = t.user_attrs["env"]
        assert env["num_devices"] == 8 and env["platform"] == "cpu" and env["peak_flops_per_device"] > 0
        assert "xla_force_host_platform_device_count=8" in env["xla_flags"]
        tdir = t.user_attrs["trial_dir"]
        assert tdir == str(run / "trials" / str(t.number))
        assert os.path.exists(os.path.join(tdir, "config.json")) and os.path.exists(os.path.join(tdir, "log.txt"))
        assert os.listdir(os.path.join(tdir, "tb"))
    # loss is measured once per math group: meshes 8x1x1 and 4x2x1 both batch over 8 devices (global
    # batch 16, the same math), 2x2x2 over 4 (global batch 8). The later of the pair scores the
    # earlier's loss; its own loss, from another layout, reproduces it within LOSS_TOLERANCE.
    by_mesh = {t.params["mesh"]: t for t in trials}
    first, second = sorted([by_mesh["8x1x1"], by_mesh["4x2x1"]], key=lambda t: t.number)
    assert first.user_attrs["math_key"] == second.user_attrs["math_key"] != by_mesh["2x2x2"].user_attrs["math_key"]
    group = second.user_attrs["loss_group"]
    assert group["from_trial"] == first.number and group["loss"] == first.values[0] == second.values[0]
    assert group["own_loss"] == second.user_attrs["measured"]["loss"] and group["deviation"] <= 1e-3
    assert "loss_group" not in first.user_attrs and "loss_group" not in by_mesh["2x2x2"].user_attrs
    attrs = study.user_attrs
    assert [o["name"] for o in attrs["objectives"]] == ["loss", "mfu", "memory"]
    assert attrs["target"] == "cpu:8" and attrs["plan_only"] is False and "MFU" in attrs["mfu_convention"]
    assert attrs["space_file"] == TINY
    meta = json.loads((run / "study.json").read_text())
    assert meta == {"study_name": "tiny_space", "storage": None, "space_file": TINY}
    # the trial workers compiled into the suite's shared cache (JAX_COMPILATION_CACHE_DIR, tests/conftest.py)
    # instead of the run folder's xla_cache/ (tests/search/workers/test_compilation_cache.py)
    assert os.listdir(os.environ["JAX_COMPILATION_CACHE_DIR"]) and not (run / "xla_cache").exists()
    # the grid is used up: running again starts nothing
    again = cli("run", TINY, "--run-dir", run, "--trials", 50, "--set", "per_device_batch=2", "--no-progress")
    assert "nothing to run" in again.stdout and len(load(run).trials) == 3
    listing = cli("ls", run.parent)
    assert "tiny_space" in listing.stdout and "3 complete" in listing.stdout


@pytest.mark.slow  # quick-loop budget (issue 18): a full compile or a whole CLI run; CI runs it
def test_rejected_trial_runs_no_training_step(tmp_path):
    run = tmp_path / "tight"
    cli("run", TINY, "--run-dir", run, "--trials", 2, "--memory-budget", "1KiB", "--no-progress")
    trials = load(run).get_trials()
    assert len(trials) == 2
    for t in trials:
        a = t.user_attrs
        assert a["failure_kind"] == "predicted_oom" and "exceeds the budget" in a["failure_message"]
        assert a["counters"] == {"train_calls": 0, "steps_run": 0}
        assert a["measured"]["steps"] == 0 and a["measured"]["loss"] is None
        assert a["constraint"][0] > 0 and t.constraints["memory"] > 0  # the sampler sees it as infeasible
        assert t.state == TrialState.COMPLETE and t.values[0] == math.inf and t.values[2] == a["plan"]["peak_bytes"]
        assert not os.path.exists(os.path.join(a["trial_dir"], "tb"))


@pytest.mark.slow
def test_forced_faults_are_typed_and_the_study_goes_on(tmp_path):
    run = tmp_path / "faults"
    out = cli("run", TINY, "--run-dir", run, "--trials", 5, "--timeout", 40, "--no-progress",
              faults="1:hang,2:nan,3:segfault")
    trials = {t.number: t for t in load(run).get_trials()}
    assert len(trials) == 5, out.stdout
    kinds = {n: t.user_attrs.get("failure_kind") for n, t in trials.items()}
    assert kinds == {0: None, 1: "timeout", 2: "nan_loss", 3: "crash", 4: None}, kinds
    assert "SIGSEGV" in trials[3].user_attrs["failure_message"]
    for n in (1, 2, 3):
        assert trials[n].state == TrialState.FAIL and trials[n].user_attrs["failure_message"]
    for n in (0, 4):
        assert trials[n].state == TrialState.COMPLETE
    assert trials[2].user_attrs["counters"]["train_calls"] == 1


def _wait_for(predicate, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.5)
    return False


@pytest.mark.slow
def test_sigkill_of_the_driver_then_resume(tmp_path):
    run = tmp_path / "killed"
    driver = subprocess.Popen([sys.executable, "-m", "paxsearch.search.cli", "run", TINY, "--run-dir", str(run),
                               "--trials", "4", "--no-progress"], cwd=REPO, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    db = run / "study.db"

    def one_done_one_running():
        if not db.exists():
            return False
        try:
            trials = load(run).get_trials()
        except Exception:
            return False
        states = [t.state for t in trials]
        return TrialState.COMPLETE in states and any(
            t.state == TrialState.RUNNING and "trial_dir" in t.user_attrs for t in trials)

    try:
        assert _wait_for(one_done_one_running, 300), "the driver did not get going"
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    before = {t.number: t.params for t in load(run).get_trials() if t.state == TrialState.COMPLETE}
    cli("resume", run, "--no-progress")
    study = load(run)
    trials = study.get_trials()
    for number, params in before.items():  # no completed trial lost
        assert trials[number].state == TrialState.COMPLETE and trials[number].params == params
    died = [t for t in trials if t.user_attrs.get("failure_message") == "driver died"]
    assert died and all(t.state == TrialState.FAIL and t.user_attrs["failure_kind"] == "crash" for t in died)
    counted = active(study)
    assert len(counted) == 4
    assert all(t.state == TrialState.COMPLETE for t in counted)
    assert len(set(decision_keys(counted))) == 4  # none duplicated
    requeued = {t.user_attrs.get("requeued_from") for t in counted} - {None}
    assert requeued == {t.number for t in died}

"""Shared studies: two `paxsearch worker`s on PostgreSQL; multi-host trials over 2 processes."""
import os
import subprocess
import sys
import time

import optuna
import pytest
from optuna.trial import TrialState

from paxsearch.search.study.storage import driver_url

from ..search_util import HERE, REPO, TINY, active, cli, decision_keys

MULTIHOST = os.path.join(HERE, "spaces", "multihost_space.py")


@pytest.mark.slow
@pytest.mark.postgres
def test_two_workers_share_one_study_without_duplicates(tmp_path, pg_url):
    budget = 4
    base = [sys.executable, "-m", "paxsearch.search.cli"]
    first = subprocess.Popen(base + ["run", TINY, "--storage", pg_url, "--run-dir", str(tmp_path / "a"),
                                     "--tuner", "random", "--trials", str(budget), "--no-progress"],
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            if "tiny_space" in optuna.get_all_study_names(driver_url(pg_url)):
                break
        except Exception:
            pass
        time.sleep(0.5)
    second = subprocess.Popen(base + ["worker", "--storage", pg_url, "--study", "tiny_space",
                                      "--run-dir", str(tmp_path / "b"), "--no-progress"],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out_a, _ = first.communicate(timeout=600)
    out_b, _ = second.communicate(timeout=600)
    assert first.returncode == 0, out_a[-3000:]
    assert second.returncode == 0, out_b[-3000:]
    study = optuna.load_study(study_name="tiny_space", storage=driver_url(pg_url))
    trials = study.get_trials()
    assert len(trials) == budget == len(active(study))
    assert len(set(decision_keys(trials))) == budget  # no config twice
    assert all(t.state == TrialState.COMPLETE for t in trials)
    owners = {t.user_attrs["owner"]["pid"] for t in trials}
    assert len(owners) == 2, "both workers should have run trials"
    assert "postgres@" in out_a and "***" not in out_a  # no password in this URL; nothing to hide


@pytest.mark.slow
def test_multihost_trial_runs_on_two_processes(tmp_path):
    run = tmp_path / "mh"
    cli("run", MULTIHOST, "--run-dir", run, "--no-progress")
    study = optuna.load_study(study_name="multihost_space", storage=f"sqlite:///{run}/study.db")
    trials = study.get_trials()
    assert len(trials) == 2 and len(set(decision_keys(trials))) == 2
    for t in trials:
        assert t.state == TrialState.COMPLETE, t.user_attrs.get("failure_message")
        env = t.user_attrs["env"]
        assert env["process_count"] == 2 and env["num_devices"] == 8
        assert "xla_force_host_platform_device_count=4" in env["xla_flags"]
        plan = t.user_attrs["plan"]
        assert plan["mesh_shape"]["data"] in (2, 4) and plan["global_batch"] == 8
        tdir = t.user_attrs["trial_dir"]
        assert os.path.exists(os.path.join(tdir, "log.txt")) and os.path.exists(os.path.join(tdir, "log.1.txt"))

"""The flagship: `paxsearch run spaces/mesh_sweep.py` as shipped, 12 of its 16 trials (~2-4 minutes on 2 cores)."""
import os
import time

import optuna
import pytest
from optuna.trial import TrialState

from paxsearch.store import FAILURE_KINDS

from ..search_util import REPO, cli, decision_keys


@pytest.mark.slow
def test_mesh_sweep_finishes_with_every_trial_complete_or_typed(tmp_path):
    run = tmp_path / "mesh_sweep"
    t0 = time.time()
    # the shipped space and settings with 12 of its 16 trials (TPE's random start-up points, then its
    # proposals): every check below holds at 12, and a trial is ~1/16 of the test
    cli("run", os.path.join(REPO, "spaces", "mesh_sweep.py"), "--run-dir", run, "--trials", 12, "--no-progress",
        timeout=1500)
    elapsed = time.time() - t0
    study = optuna.load_study(study_name="mesh_sweep", storage=f"sqlite:///{run}/study.db")
    trials = study.trials
    assert len(trials) >= 12
    assert len(set(decision_keys(trials))) == len(trials)
    assert all({"attention", "rules", "flags"} <= set(t.params) for t in trials)  # the new choices
    for t in trials:
        assert t.state == TrialState.COMPLETE or t.user_attrs.get("failure_kind") in FAILURE_KINDS, (t.number, t.state)
    trained = [t for t in trials if t.state == TrialState.COMPLETE and not t.user_attrs.get("failure_kind")]
    assert len(trained) >= len(trials) // 2
    assert elapsed < 20 * 60, f"the sweep took {elapsed / 60:.1f} minutes"

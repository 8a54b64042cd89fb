"""Tuners and pruners exercised for real: the nsga2 tuner, a pruner that prunes (gp is
refused in one line: it needs PyTorch)."""
import os

import pytest

from ...search_util import HERE, TINY, active, cli, decision_keys, load

PRUNE = os.path.join(HERE, "spaces", "prune_space.py")


@pytest.mark.slow  # a 3-trial study
def test_nsga2_proposes_and_completes_distinct_trials(tmp_path):
    run = tmp_path / "run"
    cli("run", TINY, "--run-dir", run, "--tuner", "nsga2", "--trials", "3", "--no-progress")
    study = load(run)
    trials = active(study)
    assert study.user_attrs["settings"]["tuner"] == "nsga2"
    assert len(trials) == 3 and all(t.state.name == "COMPLETE" and not t.user_attrs.get("failure_kind")
                                    for t in trials), [(t.state, t.user_attrs) for t in trials]
    assert all(len(t.values) == 3 for t in trials)  # loss, mfu, memory
    assert len(set(decision_keys(trials))) == 3
    assert not any(t.system_attrs.get("fixed_params") for t in trials)  # proposed by the sampler, not enqueued


def test_gp_tuner_is_refused_in_one_line(tmp_path):
    run = tmp_path / "run"
    proc = cli("run", TINY, "--run-dir", run, "--tuner", "gp", check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "tuner gp" in lines[0] and "nsga2" in lines[0] and "tpe" in lines[0]
    assert not run.exists()


@pytest.mark.slow
def test_median_pruner_prunes_a_trial_that_does_not_learn(tmp_path):
    """Grid order is seeded: the seed is chosen so that the learning rate that does not train
    comes after the pruner's two startup trials."""
    from paxsearch.search.study.space import load_space
    from paxsearch.search.tuning.tuners import GridProposer

    space = load_space(PRUNE)
    seed = next(s for s in range(100)
                if [p["lr"] for p in GridProposer(space, s).order].index(1e-9) >= 2)
    run = tmp_path / "run"
    cli("run", PRUNE, "--run-dir", run, "--seed", seed, "--no-progress", timeout=900)
    trials = active(load(run, "prune_space"))
    by_lr = {t.params["lr"]: t for t in trials}
    assert len(trials) == 4, [(t.state, t.params) for t in trials]
    bad = by_lr[1e-9]
    assert bad.state.name == "PRUNED", (bad.state, bad.user_attrs, bad.intermediate_values)
    assert max(bad.intermediate_values) < 8  # stopped before its last step
    assert all(by_lr[lr].state.name == "COMPLETE" for lr in (1e-2, 2e-2, 3e-2))

"""What the search offers, exercised for real: the nsga2 tuner, a pruner that prunes,
`--workers 2` training trials side by side (gp is refused in one line: it needs PyTorch)."""
import os
import re

import pytest

from .search_util import TINY, active, cli, decision_keys, load

HERE = os.path.dirname(os.path.abspath(__file__))
PRUNE = os.path.join(HERE, "spaces", "prune_space.py")


def _worker_pid(run, number: int) -> str:
    text = (run / "trials" / str(number) / "log.txt").read_text()
    return re.search(rf"== trial {number} on worker pid (\d+)", text).group(1)


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


@pytest.mark.slow
def test_two_workers_train_distinct_trials_side_by_side(tmp_path):
    run = tmp_path / "run"
    cli("run", TINY, "--run-dir", run, "--workers", "2", "--trials", "4", "--no-progress", timeout=900)
    trials = active(load(run))
    assert len(trials) == 4 and all(t.state.name == "COMPLETE" and not t.user_attrs.get("failure_kind")
                                    for t in trials), [(t.state, t.user_attrs) for t in trials]
    assert len(set(decision_keys(trials))) == 4  # no config twice
    assert all(t.user_attrs["measured"]["step_time"] > 0 and t.values[1] > 0 for t in trials)  # measured MFU
    assert len({_worker_pid(run, t.number) for t in trials}) == 2  # both workers trained trials
    spans = sorted((t.datetime_start, t.datetime_complete) for t in trials)
    assert any(b[0] < a[1] for a, b in zip(spans, spans[1:], strict=False))  # at least two ran at the same time

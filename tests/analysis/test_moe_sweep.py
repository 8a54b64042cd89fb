"""spaces/moe_sweep.py end to end on the 8 CPU devices: real trials of the moe-tiny mixture of experts
(dropless and capacity 1.0 on expert 2 x fsdp 4), real storage, `paxsearch report` and `best`: the
dropped share is stored, and the report puts it beside MFU (~2-3 minutes on 2 cores)."""
import os

import optuna
import pandas as pd
import pytest

from ..search_util import REPO, cli


@pytest.mark.slow
def test_moe_sweep_trains_scores_and_reports_the_dropped_share(tmp_path):
    run = tmp_path / "moe_sweep"
    # the shipped space, two of its points: the grid over dropless / capacity at factor 1.0
    cli("run", os.path.join(REPO, "spaces", "moe_sweep.py"), "--run-dir", run, "--tuner", "grid", "--trials", 2,
        "--set", "mesh=2x4", "--set", "per_device_batch=1", "--set", "capacity_factor=1.0", "--no-progress",
        timeout=900)
    study = optuna.load_study(study_name="moe_sweep", storage=f"sqlite:///{run}/study.db")
    trials = {t.params["expert_compute"]: t for t in study.trials}
    assert set(trials) == {"dropless", "capacity"}
    for t in trials.values():
        assert t.state == optuna.trial.TrialState.COMPLETE and "failure_kind" not in t.user_attrs, t.user_attrs
        assert t.user_attrs["measured"]["steps"] == 16  # 16,384 tokens / (8 rows x 128)
        assert t.user_attrs["measured"]["load_balance_loss"] > 0
    assert trials["dropless"].user_attrs["measured"]["dropped_fraction"] == 0.0
    share = trials["capacity"].user_attrs["measured"]["dropped_fraction"]
    assert 0.0 < share < 1.0  # factor 1.0: any imbalance between the 8 experts drops routes

    report = cli("report", run, "--no-tensorboard")
    assert "markdown" in report.stdout
    csv = pd.read_csv(run / "trials.csv").set_index("d.expert_compute")
    assert csv.loc["capacity", "dropped_fraction"] == pytest.approx(share)
    markdown = (run / "report.md").read_text()
    header = next(line for line in markdown.splitlines() if line.startswith("| choice |"))  # best per objective
    cells = [c.strip() for c in header.split("|")]
    assert cells[cells.index("MFU") + 1] == "dropped tokens"
    page = (run / "report.html").read_text()
    assert f">{100 * share:.2f}%<" in page[page.index('id="trials"'):]

    best = cli("best", run, "--objective", "mfu").stdout
    assert "dropped tokens" in best
    best_mfu = max(trials.values(), key=lambda t: t.user_attrs["measured"]["mfu"])
    # the capacity trial drops routes: when it has the best MFU, `best` says so; the dropless one never drops
    assert ("note:      drops" in best) == (best_mfu is trials["capacity"]), best

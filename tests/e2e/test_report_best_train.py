"""Issue 4 end to end on a real (tiny) study (the shared tiny_grid_run): report, best --export,
train the exported config, and train straight from the run folder."""
import json
import os

import optuna
import pytest

from paxsearch.search.study import configio

from ..search_util import cli


@pytest.mark.slow  # report, export and two CLI trains
def test_report_best_export_and_train(tmp_path, tiny_grid_run):
    run, _ = tiny_grid_run  # 3 trials of the tiny space by the grid tuner
    study = optuna.load_study(study_name="tiny_space", storage=f"sqlite:///{run}/study.db")
    complete = [t for t in study.get_trials() if t.state == optuna.trial.TrialState.COMPLETE]
    assert complete

    rep = cli("report", run)
    for name in ("report.html", "report.md", "trials.csv", "trials.parquet"):
        assert (run / name).exists(), (name, rep.stdout)
    html = (run / "report.html").read_text()
    assert 'id="pareto-plot"' in html and "MFU" in html

    best = cli("best", run, "--objective", "mfu", "--export", tmp_path / "best.json")
    number = int(best.stdout.split()[1])
    chosen = max(complete, key=lambda t: t.user_attrs["measured"]["mfu"])
    assert number == chosen.number
    # the decisions, the scores and how to reuse them, not just a number
    lines = best.stdout.splitlines()
    assert lines[0] == f"trial {number} (best mfu)"
    assert lines[1] == "  decisions: " + " ".join(f"{k}={v}" for k, v in chosen.user_attrs["decisions"].items())
    assert lines[2].startswith("  scores:    loss ") and "MFU " in lines[2] and "memory/device " in lines[2]
    # the compiler of its plan, which the driver names from the worker that compiled and trained it
    assert lines[3].startswith("  compiler:  planned with jax ") and "jaxlib " in lines[3]
    assert f"paxsearch train {tmp_path / 'best.json'} --steps N" in lines[4]
    knee = cli("best", run)
    assert f"run it with: paxsearch train {run} --trial " in knee.stdout and "(knee of the Pareto front)" in knee.stdout
    exported = configio.loads((tmp_path / "best.json").read_text())
    stored = configio.loads(chosen.user_attrs["config"])
    assert exported == stored
    assert configio.build(exported) == configio.build(stored)

    out = cli("train", tmp_path / "best.json", "--steps", "20", "--run-dir", tmp_path / "full")
    assert "steps 0->20" in out.stdout
    assert any(p.isdigit() for p in os.listdir(tmp_path / "full" / "checkpoints"))
    saved = json.loads((tmp_path / "full" / "config.json").read_text())
    assert saved

    direct = cli("train", run, "--trial", str(number), "--steps", "2", "--run-dir", tmp_path / "direct")
    assert "steps 0->2" in direct.stdout

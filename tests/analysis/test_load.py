"""Loading stored studies into a DataFrame."""
from __future__ import annotations

import math
from pathlib import Path

import optuna
import pytest

from paxsearch.analysis import load

from .study_builder import grid_specs, make_run, trial_spec


@pytest.fixture(scope="module")
def grid_run(tmp_path_factory) -> Path:
    return make_run(tmp_path_factory.mktemp("grid") / "run", grid_specs()[::3])


def test_load_run_folder_one_row_per_trial(grid_run):
    specs = grid_specs()[::3]
    frame = load.load_trials(grid_run)
    assert len(frame) == len(specs)
    assert list(frame["number"]) == list(range(len(specs)))
    for column in ["d.mesh", "d.per_device_batch", "d.remat", "d.model_size", "loss", "mfu",
                   "memory_bytes", "hfu", "tokens_per_sec", "eval_loss",
                   "measured_peak_bytes", "step_time", "plan.peak_bytes",
                   "plan.predicted_step_time", "failure_kind", "failure_message",
                   "timing.total_s", "env.device_kind", "env.jax", "predicted", "state"]:
        assert column in frame, column
    ok = frame[frame["state"] == "COMPLETE"]
    first = specs[int(ok["number"].iloc[0])]
    assert ok["loss"].iloc[0] == pytest.approx(first["values"][0])
    assert ok["mfu"].iloc[0] == pytest.approx(first["values"][1])
    assert ok["memory_bytes"].iloc[0] == pytest.approx(first["values"][2])
    failed = frame[frame["state"] == "FAIL"]
    assert failed["loss"].isna().all() and failed["failure_kind"].notna().all()
    invalid = failed[failed["failure_kind"] == "invalid"]
    assert invalid["plan.peak_bytes"].isna().all()


def test_load_from_storage_url_needs_name_when_ambiguous(tmp_path):
    run = make_run(tmp_path / "run", grid_specs()[:6])
    url = f"sqlite:///{run / 'study.db'}"
    assert len(load.load_trials(url)) == 6  # the only study in the storage
    optuna.create_study(storage=url, study_name="other")
    with pytest.raises(ValueError, match="pass study_name"):
        load.load_trials(url)
    assert len(load.load_trials(url, study_name="sweep")) == 6
    assert load.open_study(url, "sweep").run_dir is None  # never derived from the stored trial_dir


def test_list_decision_values_become_text(tmp_path):
    spec = trial_spec(0, {"mesh": "1x8x1", "per_device_batch": 1, "remat": "none",
                          "model_size": "tiny"}, values=(3.0, 0.2, 1e9))
    spec["attrs"]["decisions"] = {**spec["attrs"]["decisions"], "ici_mesh": [1, 8, 1]}
    frame = load.load_trials(make_run(tmp_path / "run", [spec]))
    assert frame["d.ici_mesh"].iloc[0] == "[1,8,1]"


def test_study_info_for_headers(tmp_path):
    run = make_run(tmp_path / "run", grid_specs()[:8])
    info = load.study_info(run)
    assert [o["name"] for o in info["objectives"]] == ["loss", "mfu", "memory"]
    assert info["target"] == "cpu:8"
    assert "3 x forward" in info["mfu_convention"]
    assert info["peak_flops_per_device"] == 5.0e10
    assert info["device_kind"] == "cpu" and info["jax"] == "0.10.2"
    assert info["plan_only"] is False and info["predicted"] is False
    assert info["n_trials"] == 8 and info["states"] == {"COMPLETE": 7, "FAIL": 1}


@pytest.mark.parametrize("url, shown", [
    ("postgresql://bob:s3cr@t@db.example:5432/test", "postgresql://bob:***@db.example:5432/test"),
    ("postgresql+psycopg2://bob:pw@127.0.0.1/test?sslmode=off",
     "postgresql+psycopg2://bob:***@127.0.0.1/test?sslmode=off"),
    ("postgresql://127.0.0.1/test?user=bob&password=pw",
     "postgresql://127.0.0.1/test?user=bob&password=***"),
    ("sqlite:////tmp/run/study.db", "sqlite:////tmp/run/study.db"),
    ("postgresql://bob@127.0.0.1/test", "postgresql://bob@127.0.0.1/test"),
])
def test_mask_url_hides_passwords(url, shown):
    assert load.mask_url(url) == shown


def test_missing_run_folder_or_database_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load.load_trials(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no study database"):
        load.load_trials(tmp_path / "empty")
    assert not (tmp_path / "empty" / "study.db").exists()  # nothing created by looking


def test_no_nan_leaks_into_objective_of_complete_trials(grid_run):
    frame = load.load_trials(grid_run)
    ok = frame[frame["state"] == "COMPLETE"]
    assert all(math.isfinite(v) for v in ok[["loss", "mfu", "memory_bytes"]].to_numpy().ravel())

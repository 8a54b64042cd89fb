"""`paxsearch train --resume` never corrupts its run folder (issue 10, defect 7), and bad
overrides are one line (defect 10). The command runs in this process (search_util.in_process):
what is checked is its refusals and its writes, not its process."""
import pytest

from ...search_util import in_process, refused
from ...space_factory import write_config


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The tiny config trained for 2 steps, with a checkpoint."""
    root = tmp_path_factory.mktemp("train")
    path = write_config(root / "tiny.py")
    run = root / "run"
    assert in_process("train", path, "--run-dir", run, "--steps", "2", "--checkpoint-every", "1") == 0
    return path, run


def test_resume_with_a_changed_config_is_refused_and_writes_nothing(trained, capsys):
    path, run = trained
    before = {p.relative_to(run): p.stat().st_mtime_ns for p in run.rglob("*")}
    config_text = (run / "config.json").read_text()
    refused(capsys, "train", path, "--run-dir", run, "--resume", "--set", "model.d_model=64", "--steps", "4",
            words=("model.d_model", "32", "64"))
    assert (run / "config.json").read_text() == config_text
    assert {p.relative_to(run): p.stat().st_mtime_ns for p in run.rglob("*")} == before


def test_resume_without_a_checkpoint_is_refused(tmp_path, tiny_config_file, capsys):
    path = tiny_config_file
    refused(capsys, "train", path, "--run-dir", tmp_path / "fresh", "--resume", words=("no checkpoint",))
    assert not (tmp_path / "fresh").exists()


def test_bad_override_values_are_one_line(tmp_path, tiny_config_file, capsys):
    path = tiny_config_file
    refused(capsys, "train", path, "--run-dir", tmp_path / "x", "--set", "steps=ten", words=("steps", "ten"))
    assert not (tmp_path / "x").exists()


def test_a_malformed_xla_flags_setting_is_one_line(tmp_path, tiny_config_file, capsys, monkeypatch):
    """An XLA flag XLA does not know aborts the process (a fatal log) after the run folder was
    written; it is probed first (in a process of its own, flagsets.validate) and refused in one
    line, with nothing written."""
    path = tiny_config_file
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8 --xla_no_such_flag_paxsearch=1")
    refused(capsys, "train", path, "--run-dir", tmp_path / "x", words=("XLA_FLAGS", "xla_no_such_flag_paxsearch"))
    assert not (tmp_path / "x").exists()


def test_each_trial_of_a_run_trains_into_its_own_folder():
    from paxsearch.search.cli.train import default_run_dir

    assert default_run_dir("runs/mesh_sweep", 3) == "runs/train-mesh_sweep-trial3"
    assert default_run_dir("runs/mesh_sweep/", 4) == "runs/train-mesh_sweep-trial4"
    assert default_run_dir("configs/best.json", None) == "runs/train-best"
    assert default_run_dir("postgresql://u@h/db", 0) == "runs/train-db-trial0"

"""`paxsearch train --resume` never corrupts its run folder (issue 10, defect 7), and bad
overrides are one line (defect 10)."""
import pytest

from ...search_util import cli

CONFIG = '''
import fiddle as fdl
from paxsearch.trainer.config import EvalConfig, LogConfig, MeshConfig, ModelConfig, TrainConfig


def config():
    return fdl.Config(
        TrainConfig,
        model=fdl.Config(ModelConfig, d_model=32, n_layers=1, n_heads=2, head_dim=16, d_ff=64, seq_len=32,
                         scan_layers=False),
        mesh=fdl.Config(MeshConfig, ici=(8, 1, 1)),
        per_device_batch=1, steps=2,
        eval=fdl.Config(EvalConfig, enabled=False),
        log=fdl.Config(LogConfig, every_steps=1),
    )
'''


def _one_line_error(proc, *words):
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    for w in words:
        assert w in lines[0], lines[0]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A config trained for 2 steps, with a checkpoint."""
    root = tmp_path_factory.mktemp("train")
    path = root / "tiny.py"
    path.write_text(CONFIG)
    run = root / "run"
    cli("train", path, "--run-dir", run, "--steps", "2", "--checkpoint-every", "1", timeout=900)
    return path, run


def test_resume_with_a_changed_config_is_refused_and_writes_nothing(trained):
    path, run = trained
    before = {p.relative_to(run): p.stat().st_mtime_ns for p in run.rglob("*")}
    config_text = (run / "config.json").read_text()
    proc = cli("train", path, "--run-dir", run, "--resume", "--set", "model.d_model=64", "--steps", "4",
               check=False, timeout=600)
    _one_line_error(proc, "model.d_model", "32", "64")
    assert (run / "config.json").read_text() == config_text
    assert {p.relative_to(run): p.stat().st_mtime_ns for p in run.rglob("*")} == before


def test_resume_without_a_checkpoint_is_refused(tmp_path):
    path = tmp_path / "tiny.py"
    path.write_text(CONFIG)
    proc = cli("train", path, "--run-dir", tmp_path / "fresh", "--resume", check=False, timeout=600)
    _one_line_error(proc, "no checkpoint")
    assert not (tmp_path / "fresh").exists()


def test_bad_override_values_are_one_line(tmp_path):
    path = tmp_path / "tiny.py"
    path.write_text(CONFIG)
    proc = cli("train", path, "--run-dir", tmp_path / "x", "--set", "steps=ten", check=False, timeout=600)
    _one_line_error(proc, "steps", "ten")
    assert not (tmp_path / "x").exists()


def test_a_malformed_xla_flags_setting_is_one_line(tmp_path):
    """An XLA flag XLA does not know aborts the process (a fatal log) after the run folder was
    written; it is probed first and refused in one line, with nothing written."""
    path = tmp_path / "tiny.py"
    path.write_text(CONFIG)
    proc = cli("train", path, "--run-dir", tmp_path / "x", check=False, timeout=600,
               env={"XLA_FLAGS": "--xla_force_host_platform_device_count=8 --xla_no_such_flag_paxsearch=1"})
    _one_line_error(proc, "XLA_FLAGS", "xla_no_such_flag_paxsearch")
    assert not (tmp_path / "x").exists()

"""Bad input and broken storage give one line, a non-zero exit and nothing half-written
(issue 10, defect 10)."""
import json
import os

import pytest

from ...search_util import TINY, cli


def _one_line_error(proc, *words, code=2):
    assert proc.returncode == code, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = [line for line in proc.stderr.strip().splitlines() if line.startswith("paxsearch")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def _corrupt_run(path):
    path.mkdir(parents=True)
    (path / "study.db").write_bytes(b"this is not a SQLite database, just bytes" * 100)
    (path / "study.json").write_text(json.dumps({"study_name": "x", "storage": None, "space_file": "s.py"}))
    return path


def _unreachable_run(path):
    path.mkdir(parents=True)
    (path / "study.json").write_text(json.dumps({"study_name": "x", "space_file": "s.py",
                                                 "storage": "postgresql://postgres@127.0.0.1:1/nodb"}))
    return path


@pytest.mark.parametrize("make", [_corrupt_run, _unreachable_run])
@pytest.mark.parametrize("command", ["report", "best", "ls"])
def test_report_best_ls_on_a_broken_database(tmp_path, make, command):
    run = make(tmp_path / "run")
    proc = cli(command, run, check=False, timeout=300)
    _one_line_error(proc, "run", code=2 if command != "ls" else 1)
    assert not (run / "report.html").exists()


def test_ls_goes_on_past_an_unreadable_run_folder(tmp_path):
    _corrupt_run(tmp_path / "runs" / "a_broken")
    good = tmp_path / "runs" / "b_good"
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    optuna.create_study(study_name="good", storage=f"sqlite:///{good}/study.db") if good.mkdir() is None else None
    proc = cli("ls", tmp_path / "runs", check=False)
    assert "good" in proc.stdout, proc.stdout + proc.stderr
    _one_line_error(proc, "a_broken", code=1)


def test_a_wrongly_typed_value_in_space_is_one_line(tmp_path, make_space):
    space = make_space("typed", steps="ten")  # the tiny space with steps="ten"
    proc = cli("run", space, "--run-dir", tmp_path / "run", "--trials", 1, "--no-progress", check=False, timeout=300)
    _one_line_error(proc, "steps", "ten")
    dry = cli("run", space, "--dry-run", check=False, timeout=300)  # the dry run shows why, point by point
    assert "'ten' is a str, but steps must be int" in dry.stdout and "Traceback" not in dry.stderr
    assert not (tmp_path / "run" / "study.db").exists()


@pytest.mark.slow  # quick-loop budget (issue 18): a full compile or a whole CLI run; CI runs it
def test_a_failed_run_leaves_no_empty_study(tmp_path):
    """A malformed environment setting (an XLA flag XLA does not know) stops the run before any
    trial: one line, and the new study is not left behind."""
    run = tmp_path / "run"
    proc = cli("run", TINY, "--run-dir", run, "--trials", 1, "--no-progress", check=False, timeout=600,
               env={"XLA_FLAGS": "--xla_no_such_flag_paxsearch=1"})
    _one_line_error(proc, "worker")
    assert not (run / "study.db").exists() and not (run / "study.json").exists()
    assert os.listdir(run / "logs")  # the worker's log, which the error line points to, stays

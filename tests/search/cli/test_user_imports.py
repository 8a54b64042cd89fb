"""A user's own seqio task reaches the search workers: `--import MODULE` (or STUDY imports=)
is imported by the driver and by every worker before a trial's config is built, and is
stored in the study by name only."""
import os
import re
import sys

import pytest

from ...search_util import TINY, cli, in_process, load, refused

MODULE = "paxsearch.tests.user_task_module"


@pytest.mark.slow
def test_imported_user_task_trains_in_a_search_worker(tmp_path):
    marker = tmp_path / "reads.txt"
    run = tmp_path / "run"
    out = cli("run", TINY, "--run-dir", run, "--trials", "1", "--no-progress", "--import", MODULE,
              "--set", "data.task=user_test_task", env={"PAXSEARCH_TEST_TASK_MARKER": str(marker)})
    (trial,) = load(run).get_trials(deepcopy=False)
    assert trial.state.name == "COMPLETE" and not trial.user_attrs.get("failure_kind"), (trial.user_attrs, out.stdout)
    assert load(run).user_attrs["settings"]["imports"] == [MODULE]
    readers = {line.split()[0] for line in marker.read_text().splitlines() if line.endswith(" train")}
    worker = re.search(r"== trial 0 on worker pid (\d+)", (run / "trials" / "0" / "log.txt").read_text()).group(1)
    assert worker in readers, (worker, readers)  # the worker that trained trial 0 read the user's task
    # a later driver (resume, with no --import) imports the module the study names
    cli("resume", run, "--trials", "2", "--no-progress")
    second = load(run).get_trials(deepcopy=False)[1]
    assert second.state.name == "COMPLETE" and not second.user_attrs.get("failure_kind"), second.user_attrs


@pytest.mark.slow  # quick-loop budget (issue 18): a full compile or a whole CLI run; CI runs it
def test_without_the_import_the_task_is_refused_before_any_trial(tmp_path):
    """The case --import fixes: refused up front in one line naming the unknown task and the way
    out; no trial is spent and nothing is written (it used to fail every trial as invalid)."""
    run = tmp_path / "run"
    proc = cli("run", TINY, "--run-dir", run, "--trials", "1", "--no-progress", "--set", "data.task=user_test_task",
               check=False)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()  # TensorFlow's native start-up lines silenced (trainer/quiet.py)
    assert len(lines) == 1 and "unknown seqio task 'user_test_task'" in lines[0], proc.stderr
    assert "import the module that registers it" in lines[0]
    assert not run.exists()


def test_unimportable_module_is_one_line_and_nothing_written(tmp_path, capsys):
    """In this process (the command's refusal, not its process, is under test)."""
    for bad, words in (("no_such_module_paxsearch", "cannot import module 'no_such_module_paxsearch'"),
                       ("os;rm -rf", "is not a module name")):
        run = tmp_path / "run"
        refused(capsys, "run", TINY, "--run-dir", run, "--import", bad, words=[words])
        assert not run.exists()


@pytest.mark.slow  # a CLI train on a seqio task
def test_train_imports_a_user_module(tmp_path, tiny_config_file, capsys, monkeypatch):
    """`paxsearch train --import MODULE --set data.task=NAME` trains on the user's task; an
    unimportable module is one line, exit 2, and no run folder. In this process (the command,
    not its process, is under test): the module is not imported here before the command runs."""
    path = tiny_config_file
    marker = tmp_path / "reads.txt"
    monkeypatch.setenv("PAXSEARCH_TEST_TASK_MARKER", str(marker))
    assert MODULE not in sys.modules
    code = in_process("train", path, "--import", MODULE, "--set", "data.task=user_test_task", "--steps", "1",
                      "--run-dir", tmp_path / "run")
    out, err = capsys.readouterr()
    assert code == 0, err[-3000:]
    assert "steps 0->1" in out and f"{os.getpid()} train" in marker.read_text()
    refused(capsys, "train", path, "--import", "no_such_module_paxsearch", "--run-dir", tmp_path / "bad",
            words=["cannot import module 'no_such_module_paxsearch'"])
    assert not (tmp_path / "bad").exists()

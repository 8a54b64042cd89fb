"""Fault injection is a test seam, never live in production (issue 10, defect 11)."""
import os

import pytest

from ...search_util import TINY, cli, load


@pytest.mark.slow
def test_a_stale_fault_variable_does_not_sabotage_a_real_study(tmp_path):
    """PAXSEARCH_FAULTS in the environment is ignored by `paxsearch run`: the trial runs
    normally."""
    run = tmp_path / "run"
    cli("run", TINY, "--run-dir", run, "--trials", 1, "--no-progress", env={"PAXSEARCH_FAULTS": "0:nan"})
    trial = load(run).get_trials()[0]
    assert trial.user_attrs.get("failure_kind") is None, trial.user_attrs.get("failure_message")


def test_faults_in_a_study_are_refused_and_never_stored(tmp_path, make_space):
    space = make_space(study=dict(extra={"faults": {"0": "segfault"}}))  # the tiny space, faults in STUDY
    run = tmp_path / "run"
    proc = cli("run", space, "--run-dir", run, "--trials", 1, "--no-progress", check=False)
    assert proc.returncode == 2 and "extra" in proc.stderr, proc.stdout + proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (run / "study.db").exists()


@pytest.mark.slow
def test_the_test_entry_point_injects_faults(tmp_path):
    """A segfault, and XLA's own abort (a collective past the timeout the user's XLA_FLAGS set,
    1 s here): each a crash, the second naming XLA's fatal log line from the worker's log."""
    run = tmp_path / "run"
    flags = {"XLA_FLAGS": os.environ["XLA_FLAGS"] + " --xla_cpu_collective_call_warn_stuck_timeout_seconds=1"
                                                    " --xla_cpu_collective_call_terminate_timeout_seconds=1"}
    cli("run", TINY, "--run-dir", run, "--trials", 2, "--no-progress", faults="0:segfault,1:xla_abort", env=flags)
    segfault, xla_abort = sorted(load(run).get_trials(), key=lambda t: t.number)
    assert segfault.user_attrs["failure_kind"] == "crash"
    assert segfault.user_attrs["failure_message"] == "worker died of SIGSEGV"
    assert xla_abort.user_attrs["failure_kind"] == "crash"
    message = xla_abort.user_attrs["failure_message"]
    assert message.startswith("worker died of SIGABRT; its last fatal log line: rendezvous.cc:"), message
    assert "Termination timeout for `all reduce" in message and len(message) < 400

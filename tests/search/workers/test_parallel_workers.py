"""`--workers 2`: two worker processes train distinct trials side by side."""
import re

import pytest

from ...search_util import TINY, active, cli, decision_keys, load


def _worker_pid(run, number: int) -> str:
    text = (run / "trials" / str(number) / "log.txt").read_text()
    return re.search(rf"== trial {number} on worker pid (\d+)", text).group(1)


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

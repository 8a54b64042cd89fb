"""A trial's outcome as stored: state and objective values of a result (no JAX run)."""
import math

from optuna.trial import TrialState

from paxsearch.search import records


def test_records_outcomes():
    objectives = ["loss", "mfu", "memory"]
    plan = {"peak_bytes": 1000}
    ok = {"plan": plan, "measured": {"loss": 2.0, "mfu": 0.1}}
    assert records.outcome(objectives, ok)[:2] == (TrialState.COMPLETE, [2.0, 0.1, 1000.0])
    oom = {"plan": plan, "failure_kind": "predicted_oom", "memory_budget": {"bytes": 10, "source": "setting"}}
    state, values, _ = records.outcome(objectives, oom)
    assert state == TrialState.COMPLETE and values == [math.inf, 0.0, 1000.0]
    assert records.trial_attrs(oom, None, {})["constraint"] == [990.0]
    assert records.outcome(objectives, {"failure_kind": "nan_loss"})[0] == TrialState.FAIL
    assert records.outcome(["loss"], {"pruned": True})[0] == TrialState.PRUNED

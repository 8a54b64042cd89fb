"""A trial's outcome as stored: state and objective values of a TrialOutcome (no JAX run)."""
import math

from optuna.trial import TrialState

from paxsearch.search.trial import record
from paxsearch.store import Kind, Measured, TrialOutcome


def test_records_outcomes():
    objectives = ["loss", "mfu", "memory"]
    plan = {"peak_bytes": 1000}
    ok = TrialOutcome(plan=plan, measured=Measured(loss=2.0, mfu=0.1))
    assert record.settle(objectives, ok)[:2] == (TrialState.COMPLETE, [2.0, 0.1, 1000.0])
    oom = TrialOutcome.failure(Kind.PREDICTED_OOM, "", plan=plan, memory_budget={"bytes": 10, "source": "setting"})
    state, values, _ = record.settle(objectives, oom)
    assert state == TrialState.COMPLETE and values == [math.inf, 0.0, 1000.0]
    assert oom.to_user_attrs()["constraint"] == [990.0]
    assert record.settle(objectives, TrialOutcome.failure(Kind.NAN_LOSS, ""))[0] == TrialState.FAIL
    assert record.settle(["loss"], TrialOutcome(pruned=True))[0] == TrialState.PRUNED
    # a trial that ends without a score is a crash, said so
    state, _, unscored = record.settle(objectives, TrialOutcome(plan=plan))
    assert state == TrialState.FAIL and unscored.kind is Kind.CRASH and "without a score" in unscored.message

"""A trial's outcome as stored: state and objective values of a TrialOutcome (no JAX run)."""
import math

from optuna.trial import TrialState

from paxsearch.search.trial import record
from paxsearch.store import Kind, Measured, TrialOutcome
from paxsearch.store.plan import Plan


def test_records_outcomes():
    objectives = ["loss", "mfu", "memory"]
    plan = Plan.make(peak_bytes=1000)
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


def test_a_plan_with_a_host_round_trip_says_so_and_names_the_flag_set():
    """The trial line of a plan whose compiled step copies offloaded buffers from host memory to HBM
    and back for a relayout (search/planning/roofline/host.host_round_trips) names them and the set that
    removes them; a plan without them (or stored before the field existed) says nothing more."""
    plan = Plan.make(peak_bytes=2**30, predicted_mfu=0.3, predicted_step_time=6.5, plan_method="hlo_passes",
                     roofline={"host_round_trips": 2, "host_round_trip_bytes": 2 * 8.589934592e9})
    line = record.trial_line(3, TrialState.COMPLETE, {"flags": "v6e_llama3"}, TrialOutcome(plan=plan, predicted=True),
                             9.0)
    assert "PREDICTED mfu 30.0%" in line and "host round trip 2 x 8.6 GB" in line
    assert "+no_collective_pipeliner" in line
    for roof in ({"host_round_trips": 0, "host_round_trip_bytes": 0.0}, {}):
        quiet = record.trial_line(3, TrialState.COMPLETE, {}, TrialOutcome(plan=plan.with_(roofline=roof),
                                                                           predicted=True), 9.0)
        assert "round trip" not in quiet and "PREDICTED mfu 30.0%" in quiet

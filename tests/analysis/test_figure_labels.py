"""Figures that say what they are (issue 10, defect 12): no predicted-vs-measured ratio for a
trial that never ran, the CPU's measured peak labelled as process RSS, objective names on the
study for optuna-dashboard and optuna.visualization."""
import math

from optuna.trial import TrialState

from paxsearch.analysis import load
from paxsearch.analysis.tables import predicted_vs_measured
from paxsearch.search.trial import record
from paxsearch.store import Counters, Kind, Plan, TrialOutcome

from ..search_util import TINY
from .study_builder import ENV, make_run, trial_spec

OBJECTIVES = ["loss", "mfu", "memory"]


def _screened_out_spec(decisions: dict, plan: dict) -> dict:
    """A trial stored exactly as the driver stores a predicted_oom (record.settle, to_user_attrs)."""
    outcome = TrialOutcome.failure(Kind.PREDICTED_OOM, "predicted 9 bytes exceeds the budget",
                                   plan=Plan.from_stored(plan),
                                   memory_budget={"bytes": 1, "source": "setting"}, counters=Counters())
    state, values, outcome = record.settle(OBJECTIVES, outcome)
    attrs = outcome.replace(timings=record.driver_timings(outcome, 1.0)).with_env(ENV).to_user_attrs()
    attrs.update(decisions=decisions, config="{}", config_dict={}, trial_dir=None)
    assert state == TrialState.COMPLETE and values[1] == 0.0
    return {"state": state, "values": values, "attrs": attrs}


def test_no_ratio_for_a_trial_that_never_ran(tmp_path):
    ran = trial_spec(0, {"mesh": "1x8x1", "per_device_batch": 1, "remat": "none", "model_size": "tiny"},
                     values=(2.0, 0.25, 2**30))
    never = _screened_out_spec({"mesh": "2x4x1", "per_device_batch": 4, "remat": "none", "model_size": "tiny"},
                               dict(ran["attrs"]["plan"]))
    run = make_run(tmp_path / "run", [ran, never])
    table = predicted_vs_measured(load.load_trials(run))
    assert list(table["number"]) == [0], table
    assert math.isclose(table["ratio mfu"].iloc[0], 0.25 / 0.3)


def test_cpu_measured_peak_is_labelled_process_rss(tmp_path):
    ran = trial_spec(0, {"mesh": "1x8x1", "per_device_batch": 1, "remat": "none", "model_size": "tiny"},
                     values=(2.0, 0.25, 2**30))
    frame = load.load_trials(make_run(tmp_path / "run", [ran]))
    assert frame["measured_peak_source"][0] == load.CPU_PEAK_SOURCE
    assert "RSS" in load.CPU_PEAK_SOURCE


def test_study_names_its_objectives(tmp_path):
    from paxsearch.search.driver.context import create_or_continue
    from paxsearch.search.study.space import load_space

    space = load_space(TINY)
    ctx = create_or_continue(space, space.settings, str(tmp_path / "run"), None, None)
    assert ctx.study.metric_names == OBJECTIVES


def test_pipeline_bubble_column_only_where_a_trial_is_pipelined():
    """The trial table shows the pipeline bubble (as a percentage) when some trial has one, and
    no such column for studies without a stage axis (earlier studies stay as they were)."""
    import pandas as pd

    from paxsearch.analysis import fmt
    from paxsearch.analysis.tables import trial_table

    frame = pd.DataFrame({"number": [0, 1], "outcome": ["ok"] * 2, "predicted": [False] * 2,
                          "d.mesh": ["1x2x4", "1x8x1"], "loss": [5.0, 5.1], "plan.pipeline_bubble": [0.25, 0.0]})
    on_front = pd.Series([True, True])
    assert "plan.pipeline_bubble" in trial_table(frame, on_front).columns
    assert fmt.title("plan.pipeline_bubble") == "pipeline bubble"
    assert fmt.value("plan.pipeline_bubble", 0.25) == "25.00%"
    flat = frame.assign(**{"plan.pipeline_bubble": [0.0, 0.0]})
    assert "plan.pipeline_bubble" not in trial_table(flat, on_front).columns
    assert "plan.pipeline_bubble" not in trial_table(frame.drop(columns="plan.pipeline_bubble"), on_front).columns


def test_memory_axes_read_in_the_unit_the_values_reach(tmp_path):
    """MiB-sized trials plot in MiB (not as 0.004 GiB), GiB-sized ones in GiB; failures share
    the unit of the points beside them."""
    from paxsearch.analysis import pareto, plots

    decisions = {"mesh": "1x8x1", "per_device_batch": 1, "remat": "none", "model_size": "tiny"}
    for size, unit in ((5 * 2**20, "MiB"), (3 * 2**30, "GiB")):
        specs = [trial_spec(i, dict(decisions, per_device_batch=i + 1), values=(2.0, 0.2, size * (i + 1)))
                 for i in range(2)]
        frame = load.load_trials(make_run(tmp_path / unit, specs))
        figure = plots.effect_figure(frame, "d.per_device_batch", ["memory"], predicted=False)
        axes = figure.axes[0]
        assert axes.get_ylabel() == f"memory per device ({unit})"
        assert sorted(round(y, 6) for y in axes.collections[0].get_offsets()[:, 1]) == [5.0 if unit == "MiB"
                                                                                         else 3.0]
        front = pareto.pareto_mask(frame, ["mfu", "memory"])
        assert plots.pareto_figure(frame, front, None, False).axes[0].get_xlabel() == f"memory per device ({unit})"

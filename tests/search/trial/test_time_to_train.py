"""The objective time_to_train (issue 21, section 1): how long the full run would take on the
target, its tokens over the trial's throughput (tokens per step / step time)."""
import math
import os

import optuna
import pytest
from optuna.trial import TrialState

from paxsearch.search.study.settings import OBJECTIVES, TOKENS_PER_PARAM, SettingsError, StudySettings
from paxsearch.search.trial import record
from paxsearch.store import Kind, Measured, TrialOutcome
from paxsearch.store.plan import Plan

from ...search_util import HERE, cli, needs_libtpu

PLAN_SPACE = os.path.join(HERE, "spaces", "tpu_tiny_plan.py")

# a plan with the fields time_to_train reads
PLAN = Plan.make(peak_bytes=3 * 2**20, param_count=50_000, global_batch=16, tokens_per_step=16 * 32,
                 predicted_step_time=0.02, predicted_mfu=0.4)


def test_time_to_train_is_full_run_tokens_over_throughput():
    trained = TrialOutcome(plan=PLAN, measured=Measured(loss=2.0, mfu=0.1, step_time=0.05,
                                                        tokens_per_sec=16 * 32 / 0.05, steps=4))
    loss, seconds, memory = record.objective_values(["loss", "time_to_train", "memory"], trained)
    # default full run: 20 tokens per parameter (Chinchilla), at 512 tokens per 0.05 s step
    assert seconds == pytest.approx(TOKENS_PER_PARAM * 50_000 / (16 * 32 / 0.05))
    assert (loss, memory) == (2.0, 3 * 2**20)
    # a full run of the study's train_tokens
    assert record.objective_values(["time_to_train"], trained, train_tokens=10**9) == \
        [pytest.approx(10**9 * 0.05 / 512)]
    # a plan-only trial: the plan's predicted step time
    predicted = TrialOutcome(plan=PLAN, predicted=True)
    assert record.objective_values(["time_to_train", "mfu"], predicted) == \
        [pytest.approx(TOKENS_PER_PARAM * 50_000 * 0.02 / 512), 0.4]
    # never runs: infinitely long (even an analytic screen's plan, which has no step figures)
    oom = TrialOutcome.failure(Kind.PREDICTED_OOM, "", plan=Plan.make(peak_bytes=10**12, screen="analytic"))
    assert record.objective_values(["time_to_train", "mfu", "memory"], oom) == [math.inf, 0.0, 10**12]
    # no step time: no score, and the trial is a crash that says so
    state, _, unscored = record.settle(["time_to_train"], TrialOutcome(plan=PLAN, measured=Measured(loss=2.0)))
    assert state == TrialState.FAIL and "without a score" in unscored.message


def test_settle_stores_the_full_run_figures():
    trained = TrialOutcome(plan=PLAN, measured=Measured(loss=2.0, mfu=0.1, step_time=0.05, steps=4))
    state, values, stored = record.settle(["loss", "mfu"], trained, train_tokens=2 * 10**6)
    assert state == TrialState.COMPLETE and values == [2.0, 0.1]  # stored though not an objective
    attrs = stored.to_user_attrs()
    assert attrs["full_run"] == {"tokens": 2 * 10**6, "tokens_source": "train_tokens setting",
                                 "tokens_per_sec": pytest.approx(512 / 0.05),
                                 "seconds": pytest.approx(2 * 10**6 * 0.05 / 512), "step_time": "measured"}
    assert TrialOutcome.from_user_attrs(attrs).full_run == attrs["full_run"]
    line = record.trial_line(0, state, {"mesh": "8x1x1"}, stored, 1.0)
    assert "full run 3.3 min" in line  # 195 s
    failed = record.settle(["loss"], TrialOutcome.failure(Kind.NAN_LOSS, "nan", plan=PLAN))[2]
    assert "full_run" not in failed.to_user_attrs()


def test_time_to_train_setting():
    assert OBJECTIVES["time_to_train"] == "minimize"
    s = StudySettings.from_dict({"objectives": ["time_to_train", "memory"], "train_tokens": "300G"})
    assert s.train_tokens == 300 * 10**9 and s.directions == ["minimize", "minimize"]
    assert StudySettings().train_tokens is None and StudySettings().to_dict()["train_tokens"] is None
    with pytest.raises(SettingsError, match="train_tokens"):
        StudySettings.from_dict({"train_tokens": "many"})
    with pytest.raises(SettingsError, match="time_to_train has none"):
        StudySettings.from_dict({"objectives": ["time_to_train"], "pruner": "median"})
    with pytest.raises(SettingsError, match="does not predict time_to_train"):
        StudySettings.from_dict({"objectives": ["loss", "time_to_train"], "steer": "predicted"})


@pytest.mark.slow
def test_a_study_scores_time_to_train(tmp_path, make_space):
    """A real study with time_to_train among its objectives: each trial's value is the full
    run's tokens (the study's train_tokens, which the driver passes on) over the throughput it
    measured. The default count (20 per parameter) is the plan-only test's below."""
    space = make_space("ttt_space", study=dict(objectives=["loss", "time_to_train", "memory"], trials=2,
                                               train_tokens="5M"),
                       decisions=dict(per_device_batch=[1, 2]), mesh="8x1x1")
    run = tmp_path / "run"
    out = cli("run", space, "--run-dir", run, "--no-progress")
    assert out.stdout.count("full run ") == 2, out.stdout
    study = optuna.load_study(study_name="ttt_space", storage=f"sqlite:///{run}/study.db")
    trials = study.get_trials()
    assert len(trials) == 2 and all(t.state == TrialState.COMPLETE for t in trials)
    for t in trials:
        plan, measured = t.user_attrs["plan"], t.user_attrs["measured"]
        tokens = 5 * 10**6
        assert plan["tokens_per_step"] == 8 * t.params["per_device_batch"] * 32  # global batch x seq_len
        assert t.values[1] == pytest.approx(tokens / measured["tokens_per_sec"], rel=1e-9)
        assert t.user_attrs["full_run"]["seconds"] == t.values[1]
        assert t.user_attrs["full_run"]["tokens"] == tokens


@pytest.mark.slow
@needs_libtpu
def test_a_plan_only_study_scores_time_to_train_from_the_predicted_step_time(tmp_path):
    """A TPU target planned on this CPU: time_to_train from the roofline's predicted step time."""
    run = tmp_path / "run"
    cli("run", PLAN_SPACE, "--run-dir", run, "--objective", "time_to_train", "--trials", 1, "--set", "model_size=small",
        "--set", "per_device_batch=1", "--set", "peak_lr=0.001", "--no-progress", env={"JAX_PLATFORMS": "cpu"})
    (t,) = optuna.load_study(study_name="tpu_tiny_plan", storage=f"sqlite:///{run}/study.db").get_trials()
    plan = t.user_attrs["plan"]
    assert t.state == TrialState.COMPLETE and t.user_attrs["predicted"]
    assert t.values == [pytest.approx(TOKENS_PER_PARAM * plan["param_count"] * plan["predicted_step_time"]
                                      / plan["tokens_per_step"])]
    assert t.user_attrs["full_run"]["step_time"] == "predicted"


def test_progress_bar_shows_the_best_time_to_train_in_its_unit():
    import io

    from paxsearch.search.driver.progress import Progress

    stream = io.StringIO()
    progress = Progress(2, 0, ["time_to_train", "memory"], stream=stream)
    progress.finished("#0", [5400.0, 2**20])
    progress.finished("#1", [9000.0, 2**30])
    assert progress.best == {"time_to_train": 5400.0, "memory": 2**20}
    progress.bar.refresh()
    assert "time_to_train 1.5 h" in stream.getvalue() and "memory 1.0 MiB" in stream.getvalue()

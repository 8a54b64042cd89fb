"""`paxsearch run` on a TPU target without TPUs: plan-only trials (compiled for the topology,
never run), settled without compiling where the study already knows the answer, and
reported as predictions. Needs libtpu (the `tpu` extra, which CI installs)."""
import json
import math
import os

import pytest
from optuna.trial import TrialState

from paxsearch.analysis import tables

from ...search_util import HERE, cli, load, needs_libtpu

PLAN_SPACE = os.path.join(HERE, "spaces", "tpu_tiny_plan.py")


@pytest.mark.slow  # a 12-trial study compiled for v5e-16
@needs_libtpu
def test_plan_only_study_compiles_two_of_twelve_points_and_reports_predictions(tmp_path):
    run = tmp_path / "plan"
    out = cli("run", PLAN_SPACE, "--run-dir", run, "--no-progress", "--workers", 1)
    assert "PREDICTED" in out.stdout
    # libtpu stays quiet on a machine without TPUs (no metadata-server or backend warnings)
    assert "metadata" not in out.stderr.lower() and "Unable to initialize backend 'tpu'" not in out.stderr
    study = load(run, "tpu_tiny_plan")
    attrs = study.user_attrs
    assert attrs["plan_only"] is True and attrs["target"] == "tpu:v5e-16"
    trials = study.get_trials()
    assert len(trials) == 12 and all(t.state == TrialState.COMPLETE for t in trials)
    by = {(t.params["model_size"], t.params["per_device_batch"], t.params["peak_lr"]): t for t in trials}
    compiled = [t for t in trials if "compile_seconds" in t.user_attrs["plan"]
                and not t.user_attrs["plan"].get("screen")]
    assert sorted((t.params["model_size"], t.params["per_device_batch"]) for t in compiled) == \
        [("small", 1), ("small", 64)]
    for t in trials:
        a = t.user_attrs
        assert a["predicted"] is True and a["counters"] == {"train_calls": 0, "steps_run": 0}
        assert a["env"]["device_kind"] == "TPU v5 lite" and a["env"]["num_devices"] == 16
        assert a["measured"]["loss"] is None  # nothing ran
        assert t.values[1] == a["plan"]["peak_bytes"] == a["memory_bytes"]
    # feasible: the predicted MFU is the objective, in (0, 1]; memory is XLA's TPU figure
    for lr in (1e-3, 3e-3):
        t = by[("small", 1, lr)]
        assert "failure_kind" not in t.user_attrs
        plan = t.user_attrs["plan"]
        assert 0 < t.values[0] == plan["predicted_mfu"] <= 1 and plan["predicted_step_time"] > 0
        assert plan["peak_bytes"] <= 256 * 2**20 and plan["roofline"]["predicted"] is True
    # the two learning rates compile to one step: one compile, one reuse
    screens = [by[("small", 1, lr)].user_attrs["plan"].get("screen") for lr in (1e-3, 3e-3)]
    assert screens.count(None) == 1 and any(str(s).startswith("duplicate of trial") for s in screens)
    # huge: parameters + AdamW state alone exceed the budget, nothing compiled
    for (size, _, _), t in by.items():
        if size == "huge":
            assert t.user_attrs["failure_kind"] == "predicted_oom"
            assert t.user_attrs["plan"]["screen"] == "analytic" and "analytic" in t.user_attrs["failure_message"]
            assert t.user_attrs["plan"]["compiler"] is None  # nothing compiled
            assert t.values[0] == 0.0 and t.values[1] > 256 * 2**20
    # small, batch 64: compiled, over the budget, with the numbers
    oom = [by[("small", 64, lr)] for lr in (1e-3, 3e-3)]
    assert all(t.user_attrs["failure_kind"] == "predicted_oom" for t in oom)
    assert any("compiled peak" in t.user_attrs["failure_message"] and "GiB" in t.user_attrs["failure_message"]
               for t in oom)
    # small, batch 256: ruled out by batch 64's failure, not compiled
    big = [by[("small", 256, lr)] for lr in (1e-3, 3e-3)]
    assert all(t.user_attrs["failure_kind"] == "predicted_oom" for t in big)
    assert sorted(t.user_attrs["plan"]["screen"].split(" of ")[0].split(" by ")[0] for t in big) == \
        ["dominated", "duplicate"]  # the first ruled out by batch 64, the second the same step as the first
    assert all(t.values[1] >= oom[0].user_attrs["memory_bytes"] for t in big)
    # the report labels every score as predicted
    cli("report", run, "--no-tensorboard")
    md = (run / "report.md").read_text()
    assert "Predicted figures" in md and "MFU (predicted)" in md and "TPU v5 lite" in md
    # the compiler of the plans: libtpu compiled two, the analytic pre-screen none
    assert all(t.user_attrs["plan"]["compiler"]["libtpu"] for t in compiled)
    assert "- **compiler**: planned with jax " in md and "analytic plans compiled nothing" in md
    # where the compiled step's predicted time goes: the parts of its stored roofline add up to it
    assert "## Where the predicted step goes" in md
    for lr in (1e-3, 3e-3):
        plan = by[("small", 1, lr)].user_attrs["plan"]
        parts = tables.step_parts(json.dumps(plan["roofline"]))
        assert parts["step.on_chip_s"] > 0 and parts["step.exposed_dcn_s"] == 0  # one slice: nothing over DCN
        assert sum(parts[k] for k in ("step.on_chip_s", "step.exposed_ici_s", "step.exposed_dcn_s",
                                      "step.exposed_host_s")) == pytest.approx(plan["predicted_step_time"], rel=1e-9)


def test_plan_only_target_refuses_objectives_it_cannot_score(tmp_path):
    out = cli("run", PLAN_SPACE, "--run-dir", tmp_path / "r", "--objective", "loss", check=False)
    assert out.returncode == 2 and not (tmp_path / "r").exists()
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "planned, never run" in lines[0] and "--objective mfu,memory" in lines[0]


def test_without_libtpu_a_tpu_target_fails_with_one_line_naming_the_extra(tmp_path, monkeypatch):
    from paxsearch.search.driver import context as study_setup
    from paxsearch.search.planning import topology
    from paxsearch.search.study.settings import StudySettings
    from paxsearch.search.study.space import load_space

    monkeypatch.setattr(topology, "libtpu_available", lambda: False)
    space = load_space(PLAN_SPACE)
    with pytest.raises(study_setup.SetupError, match=r"pip install 'paxsearch\[tpu\]'"):
        study_setup.check_settings(StudySettings(objectives=("mfu", "memory"), target="tpu:v5e-16"), space)


def test_measured_trials_carry_the_roofline_prediction(tiny_grid_run):
    """CPU trials are measured and predicted: the report sets the two side by side."""
    run, _ = tiny_grid_run  # the tiny space's 3 meshes at per-device batch 2, measured on cpu:8
    study = load(run)
    assert len(study.get_trials()) == 3
    for t in study.get_trials():
        a = t.user_attrs
        assert a["predicted"] is False and a["measured"]["step_time"] > 0
        assert a["plan"]["predicted_step_time"] > 0 and math.isfinite(a["plan"]["predicted_mfu"])
    cli("report", run, "--no-tensorboard")
    md = (run / "report.md").read_text()
    assert "ratio step_time" in md or "ratio step time" in md

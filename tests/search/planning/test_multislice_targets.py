"""Multi-slice planning searched: the target `tpu:<slice>,slices=auto` plans each trial on
prod(mesh.dcn) slices of that slice type, so the DCN shape is a decision of one study
(search/planning/targets.py Target.for_config; spaces/multislice_plan.py)."""
import csv
import dataclasses
import os

import pytest
from optuna.trial import TrialState

from paxsearch.search.planning import topology
from paxsearch.search.planning.keys import plan_keys
from paxsearch.search.planning.targets import TargetError, check_auto_slices, parse_target, target_devices
from paxsearch.trainer.config import MeshConfig, ModelConfig, TrainConfig
from paxsearch.trainer.errors import ConfigError

from ...search_util import HERE, TINY, cli, load, needs_libtpu

SPACE = os.path.join(HERE, "spaces", "tpu_multislice_tiny.py")
NO_TPUS = pytest.mark.skipif(topology.has_tpu_hardware(),
                             reason="slices=auto plans on compile-only devices; with TPUs attached it is refused "
                                    "(that refusal: test_slices_auto_errors_are_one_line)")


def _cfg(dcn, ici=(1, 256, 1)) -> TrainConfig:
    return TrainConfig(model=ModelConfig(d_model=256), mesh=MeshConfig(ici=ici, dcn=dcn), per_device_batch=1)


@NO_TPUS
def test_slices_auto_gives_each_config_its_own_slice_count():
    study = parse_target("tpu:v5e-256, slices=AUTO")
    assert study.name == "tpu:v5e-256,slices=auto" and study.slices_auto and study.plan_only
    for dcn, name, devices in (((1, 1, 1), "tpu:v5e-256", 256), ((2, 1, 1), "tpu:v5e-256,slices=2", 512),
                               ((4, 1, 1), "tpu:v5e-256,slices=4", 1024), ((2, 2, 1), "tpu:v5e-256,slices=4", 1024)):
        trial = study.for_config(_cfg(dcn))
        assert (trial.name, trial.num_devices, trial.num_slices, trial.slices_auto) == \
            (name, devices, devices // 256, False)
        # the concrete target is what `slices=N` gives for the same count
        assert trial == parse_target(name)
    # a fixed target stays what it is, whatever the config's DCN shape
    fixed = parse_target("tpu:v5e-16,slices=2")
    assert fixed.for_config(_cfg((4, 1, 1))) is fixed


@NO_TPUS
def test_slices_auto_keys_plans_by_the_trial_slice_count():
    study = parse_target("tpu:v5e-4,slices=auto")
    one, two = (plan_keys(_cfg(dcn, ici=(1, 4, 1)), study) for dcn in ((1, 1, 1), (2, 1, 1)))
    assert one[0] != two[0] and one[1] != two[1]  # neither a duplicate nor the same shape
    assert (one[2], two[2]) == (4, 8)  # global batch: per-chip batch x the trial's batch devices
    assert one == plan_keys(_cfg((1, 1, 1), ici=(1, 4, 1)), parse_target("tpu:v5e-4"))


def test_slices_auto_errors_are_one_line():
    for text in ("cpu:8,slices=auto", "gpu:2,slices=auto"):
        with pytest.raises(TargetError, match="slices=auto applies to TPU targets planned without TPUs") as e:
            parse_target(text)
        assert "\n" not in str(e.value)
    with pytest.raises(TargetError, match="slices=N or slices=auto"):
        parse_target("tpu:v5e-16,slices=many")
    # with TPUs attached a trial runs on the slices the job has: auto is refused
    auto = dataclasses.replace(parse_target("tpu:v5e-16"), name="tpu:v5e-16,slices=auto", slices_auto=True)
    with pytest.raises(TargetError, match="TPUs attached.*slices=N") as e:
        check_auto_slices(dataclasses.replace(auto, plan_only=False))
    assert "\n" not in str(e.value)
    check_auto_slices(dataclasses.replace(auto, plan_only=True))  # planned: fine
    with pytest.raises(ConfigError, match="mesh.dcn"):
        auto.for_config(_cfg((0, 1, 1)))
    with pytest.raises(ConfigError, match="for_config"):
        target_devices(auto)  # no devices of its own


def test_slices_auto_on_a_measured_target_is_refused_by_the_cli(tmp_path):
    out = cli("run", TINY, "--run-dir", tmp_path / "r", "--target", "cpu:8,slices=auto", check=False)
    assert out.returncode == 2 and not (tmp_path / "r").exists()
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "slices=auto" in lines[0], out.stderr


@pytest.mark.slow  # a plan-only study compiled for 1 and 2 v5e-4 slices
@needs_libtpu
@NO_TPUS
def test_a_study_compiles_each_trial_for_its_own_slice_count(tmp_path):
    dry = cli("run", SPACE, "--dry-run")
    assert "2 point(s): 2 pass the static checks" in dry.stdout, dry.stdout
    run = tmp_path / "ms"
    cli("run", SPACE, "--run-dir", run, "--no-progress", "--workers", 1)
    study = load(run, "tpu_multislice_tiny")
    assert study.user_attrs["target"] == "tpu:v5e-4,slices=auto" and study.user_attrs["plan_only"] is True
    trials = study.get_trials()
    assert len(trials) == 2 and all(t.state == TrialState.COMPLETE for t in trials)
    by = {t.params["slices"]: t for t in trials}
    assert sorted(by) == [1, 2]
    for slices, t in by.items():
        a, plan = t.user_attrs, t.user_attrs["plan"]
        assert "failure_kind" not in a and "compile_seconds" in plan and not plan.get("screen")  # compiled
        name = "tpu:v5e-4" + (f",slices={slices}" if slices > 1 else "")
        assert plan["target"] == a["plan_target"] == name and plan["num_slices"] == slices
        # compiled for this trial's own devices: 4 chips a slice
        assert plan["num_devices"] == a["env"]["num_devices"] == 4 * slices
        assert a["env"]["device_kind"] == "TPU v5 lite"
        # shapes over the named axes (data, stage, fsdp, context, tensor, expert), whatever form the config wrote
        assert plan["mesh_axes"] == ["data", "stage", "fsdp", "context", "tensor", "expert"]
        assert plan["dcn_mesh"] == [slices, 1, 1, 1, 1, 1] and plan["ici_mesh"] == [1, 1, 4, 1, 1, 1]
        assert plan["mesh_shape"] == {"data": slices, "stage": 1, "fsdp": 4, "context": 1, "tensor": 1}
        assert plan["global_batch"] == 2 * 4 * slices  # per-chip batch fixed: the global batch grows
        assert 0 < plan["predicted_mfu"] <= 1 and plan["predicted_step_time"] > 0
        dcn = [c for c in plan["roofline"]["collectives"] if c["link"] == "dcn"]
        if slices == 1:
            assert dcn == []
        else:  # the gradients are reduced across the slices, over the data axis, on DCN
            assert dcn and all(c["axes"] == ["data"] for c in dcn) and sum(c["seconds"] for c in dcn) > 0
    # the report's trial table carries each trial's concrete target
    cli("report", run, "--no-tensorboard")
    with open(run / "trials.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted(r["plan.target"] for r in rows) == ["tpu:v5e-4", "tpu:v5e-4,slices=2"]

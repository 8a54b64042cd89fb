"""A study made by the previous release (commit 0941877, 3-entry meshes over data, fsdp,
tensor; tests/fixtures/legacy_mesh_0941877/README.md says how) loads, reports and reruns
unchanged now that the mesh has named axes (data, stage, fsdp, context, tensor)."""
import dataclasses
import gzip
import json
from pathlib import Path

import pytest

from paxsearch.analysis.load import load_trials, open_study
from paxsearch.analysis.report import write_report
from paxsearch.search.study import configio
from paxsearch.search.study.trial_config import trial_config_json
from paxsearch.store.outcome import Kind, TrialOutcome
from paxsearch.trainer import mesh as mesh_lib
from paxsearch.trainer.config import TrainConfig, from_dict, to_dict

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "legacy_mesh_0941877"
MESHES = {0: "2x2x2", 1: "4x2x1"}


@pytest.fixture(scope="module")
def legacy_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("legacy") / "run"
    run.mkdir()
    with gzip.open(FIXTURE / "study.db.gz") as f:
        (run / "study.db").write_bytes(f.read())
    (run / "study.json").write_text(json.dumps(
        {"study_name": "legacy_mesh", "storage": None, "space_file": str(FIXTURE / "legacy_mesh.py")}))
    return run


def trial_fiddle_config(run: str, trial: str):
    """The stored trial's config as `paxsearch train RUN --trial N` reads it."""
    return configio.loads(trial_config_json(run, trial)[1])


def _within(old, new) -> bool:
    """Every field of `old` is in `new` with the same value (recursively)."""
    if isinstance(old, dict):
        return isinstance(new, dict) and all(k in new and _within(v, new[k]) for k, v in old.items())
    return old == new


def _added(old: dict, new: dict) -> dict:
    """The fields of `new` that `old` lacks (recursively), with their values."""
    out = {}
    for k, v in new.items():
        if k not in old:
            out[k] = v
        elif isinstance(v, dict) and isinstance(old[k], dict) and (sub := _added(old[k], v)):
            out[k] = sub
    return out


def _trials(run: Path) -> dict:
    return {t.number: t for t in open_study(str(run)).study.get_trials(deepcopy=False)}


def test_trials_read_with_their_three_entry_meshes(legacy_run):
    trials = _trials(legacy_run)
    assert sorted(trials) == [0, 1]
    for n, t in trials.items():
        outcome = TrialOutcome.from_user_attrs(t.user_attrs)
        assert outcome.kind is Kind.OK and t.params == {"mesh": MESHES[n]}
        stored = t.user_attrs["config_dict"]
        assert stored["mesh"]["ici"] == [int(x) for x in MESHES[n].split("x")]  # the old 3-entry form
        cfg = configio.build(trial_fiddle_config(str(legacy_run), str(n)))
        # the stored Fiddle config and the stored dict build the same config, which writes back as stored
        assert cfg == from_dict(stored)
        # it writes back as stored; fields added since (e.g. pipeline) hold their defaults
        written = json.loads(json.dumps(to_dict(cfg)))
        assert _within(stored, written)
        defaults = json.loads(json.dumps(to_dict(TrainConfig())))
        assert _added(stored, written) == _added(stored, defaults)
        data, fsdp, tensor = (int(x) for x in MESHES[n].split("x"))
        assert mesh_lib.axis_sizes(cfg.mesh, 8) == dict(data=data, stage=1, fsdp=fsdp, context=1, tensor=tensor,
                                                         expert=1)
        # the stored plan kept its old mesh figure
        assert t.user_attrs["plan"]["mesh_shape"] == dict(data=data, fsdp=fsdp, tensor=tensor)


def test_exported_config_file_loads_unchanged():
    cfg = configio.build(configio.loads((FIXTURE / "trial0_config.json").read_text()))
    assert cfg.mesh.ici == (2, 2, 2) and cfg.mesh.dcn == (1, 1, 1)
    assert mesh_lib.axis_sizes(cfg.mesh, 8)["tensor"] == 2


def test_report_reads_the_old_study(legacy_run, tmp_path):
    frame = load_trials(str(legacy_run))
    assert len(frame) == 2 and set(frame["d.mesh"]) == set(MESHES.values())
    written = write_report(str(legacy_run), tmp_path / "report")
    markdown = Path(written["markdown"]).read_text()
    assert all(mesh in markdown for mesh in MESHES.values())


@pytest.mark.slow
@pytest.mark.parametrize("number", [0, 1])
def test_trial_reruns_to_the_same_losses(legacy_run, tmp_path, number):
    """Rerun a stored trial's config with today's trainer: the same training losses and eval
    loss as the previous release measured (float32 on CPU, relative 1e-5)."""
    from paxsearch.trainer.train import train

    t = _trials(legacy_run)[number]
    cfg = configio.build(trial_fiddle_config(str(legacy_run), str(number)))
    cfg = dataclasses.replace(cfg, run_dir=str(tmp_path))
    result = train(cfg, resume=False)
    losses = {m.step: m.loss for m in result.history}
    for step, loss in t.user_attrs["intermediate"]:
        assert losses[step] == pytest.approx(loss, rel=1e-5)
    assert result.eval_loss == pytest.approx(t.user_attrs["measured"]["eval_loss"], rel=1e-5)

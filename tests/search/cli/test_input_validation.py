"""Every input is checked before the first write and the first trial (issue 22, defect 4):
`--set` values through the space's type checks (whole sections included), data tasks the
trainer cannot find, numeric flags and STUDY settings (type, range, finiteness), overrides and
settings read back from storage, and Fiddle JSON configs. Each refusal is one line, exit 2,
and leaves no run folder behind."""
from __future__ import annotations

import math

import fiddle as fdl
import optuna
import pytest
from fiddle.experimental import serialization

from paxsearch.search import cli
from paxsearch.search.study import configio
from paxsearch.search.study.settings import SettingsError, StudySettings
from paxsearch.search.study.space import SpaceError, load_space

from ...search_util import TINY, refused
from ...space_factory import tiny_config


@pytest.mark.parametrize("sets,words", [
    ("optimizer=5", ("optimizer", "OptimizerConfig")),       # a whole section replaced by a number
    ("data=None", ("data", "DataConfig")),
    ("optimizer.peak_lr=1e400", ("peak_lr", "finite")),      # a literal that parses to inf
    ("mesh.ici=(8, 1.5, 1)", ("ici",)),
])
@pytest.mark.parametrize("dry_run", [True, False])
def test_a_set_value_of_the_wrong_type_is_refused_before_anything(capsys, tmp_path, sets, words, dry_run):
    run = tmp_path / "run"
    refused(capsys, "run", TINY, "--run-dir", run, "--set", sets, *(["--dry-run"] if dry_run else []), words=words)
    assert not run.exists()


def test_a_float_decision_fixed_to_a_word_is_one_line(tmp_path):
    path = tmp_path / "lr_space.py"
    path.write_text("import pyglove as pg\nfrom paxsearch.tests.space_factory import tiny_config\n"
                    "def space():\n    return tiny_config(peak_lr=pg.floatv(1e-4, 1e-2, name='lr'))\n")
    space = load_space(str(path))
    with pytest.raises(SpaceError, match="lr='fast' is not a number"):
        space.apply_sets(["lr=fast"])
    with pytest.raises(SpaceError, match="outside"):
        space.apply_sets(["lr=nan"])


def test_an_unknown_data_task_stops_run_before_the_first_write(capsys, tmp_path):
    run = tmp_path / "run"
    refused(capsys, "run", TINY, "--run-dir", run, "--set", "data.task=nosuchtask", words=("nosuchtask",))
    assert not run.exists()
    refused(capsys, "run", TINY, "--run-dir", run, "--set", f"data.text_files=('{tmp_path}/none.txt',)",
            words=("none.txt",))
    assert not run.exists()


@pytest.mark.parametrize("flag,value,words", [
    ("--timeout", "nan", ("timeout", "finite")),
    ("--timeout", "inf", ("timeout", "finite")),
    ("--timeout", "-1", ("timeout",)),
    ("--seed", "-1", ("seed",)),
    ("--seed", str(2**40), ("seed",)),
    ("--trials", "0", ("trials",)),
    ("--workers", "0", ("workers",)),
    ("--processes", "0", ("processes",)),
    ("--memory-budget", "1e999GB", ("memory budget", "finite")),
    ("--memory-budget", "0", ("memory budget",)),
])
def test_numeric_flags_out_of_range_are_one_line(capsys, tmp_path, flag, value, words):
    run = tmp_path / "run"
    refused(capsys, "run", TINY, "--run-dir", run, flag, value, words=words)
    assert not run.exists()


@pytest.mark.parametrize("study,words", [
    (dict(trials=2.5), ("trials=2.5", "integer")),
    (dict(trials="10"), ("trials='10'", "integer")),
    (dict(workers=True), ("workers=True", "integer")),
    (dict(timeout=math.nan), ("timeout",)),
    (dict(timeout="600"), ("timeout='600'",)),
    (dict(seed=-3), ("seed",)),
    (dict(memory_budget=math.inf), ("memory budget",)),
    (dict(tokens=math.inf), ("tokens",)),
    (dict(tokens="1e999"), ("tokens",)),
    (dict(tokens=[65536]), ("tokens",)),
    (dict(count_flops="no"), ("count_flops='no'",)),
    (dict(target=8), ("target=8", "string")),
    (dict(objectives=[1, 2]), ("objectives",)),
])
def test_study_settings_are_checked_for_type_range_and_finiteness(study, words):
    with pytest.raises(SettingsError) as e:
        StudySettings.from_dict(study)
    for word in words:
        assert word in str(e.value)


def test_settings_of_earlier_studies_still_load():
    """What to_dict stored (ints, a float timeout, None budgets) and older int timeouts read back."""
    stored = StudySettings(trials=4, timeout=90.0, memory_budget=2**31, tokens=65536).to_dict()
    assert StudySettings.from_dict(stored).to_dict() == stored
    assert StudySettings.from_dict({**stored, "timeout": 600}).timeout == 600.0


def test_a_space_file_study_with_a_bad_setting_is_one_line(capsys, tmp_path, make_space):
    path = make_space(study=dict(trials=2.5))
    refused(capsys, "run", path, "--run-dir", tmp_path / "run", words=("trials=2.5",))
    assert not (tmp_path / "run").exists()


def test_a_worker_refuses_a_bad_override_read_back_from_storage(capsys, tmp_path):
    """Whoever can write the study can store any override text; a worker checks it as --set is."""
    run = tmp_path / "run"
    assert cli.main(["run", TINY, "--run-dir", str(run), "--create-only"]) == 0
    url = f"sqlite:///{run}/study.db"
    study = optuna.load_study(study_name="tiny_space", storage=url)
    study.set_user_attr("overrides", ["optimizer=5"])
    capsys.readouterr()
    refused(capsys, "worker", "--storage", url, "--study", "tiny_space", "--run-dir", tmp_path / "w",
            "--no-progress", words=("optimizer=5",))
    assert not (tmp_path / "w").exists()
    study.set_user_attr("overrides", [])
    settings = dict(study.user_attrs["settings"], trials="many")
    study.set_user_attr("settings", settings)
    refused(capsys, "worker", "--storage", url, "--study", "tiny_space", "--run-dir", tmp_path / "w",
            "--no-progress", words=("trials='many'",))


def test_a_fiddle_json_config_with_a_non_finite_number_is_refused():
    raw = tiny_config()
    raw.optimizer = fdl.Config(configio.TrainConfig.__dataclass_fields__["optimizer"].default_factory().__class__,
                               peak_lr=math.nan)
    text = serialization.dump_json(raw)
    with pytest.raises(configio.ConfigFileError, match="peak_lr must be a finite number"):
        configio.loads(text)
    raw.optimizer.peak_lr = 1e-3
    assert configio.build(configio.loads(serialization.dump_json(raw))).optimizer.peak_lr == 1e-3

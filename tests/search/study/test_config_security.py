"""Configs and stored spaces never run code nobody asked for (issue 10, defect 5): Fiddle JSON
builds only paxsearch's own config classes; a stored space source runs only on opt-in."""
import os
import subprocess

import fiddle as fdl
import optuna
import pytest
from fiddle.experimental import serialization

from paxsearch.search.study import configio
from paxsearch.search.study import storage as storage_lib

from ...search_util import TINY, cli


def _evil_json(marker) -> str:
    """A Fiddle JSON config whose build would run a shell command (touch MARKER)."""
    return serialization.dump_json(fdl.Config(subprocess.getoutput, f"touch {marker}"))


def _evil_nested_json(marker) -> str:
    """A real TrainConfig with a foreign callable hidden in one field."""
    from paxsearch.trainer.config import TrainConfig

    cfg = configio.to_fiddle(TrainConfig())
    cfg.run_dir = fdl.Config(subprocess.getoutput, f"touch {marker}")
    return serialization.dump_json(cfg)


def test_loads_refuses_foreign_callables_in_one_line(tmp_path):
    marker = tmp_path / "pwned"
    for text in (_evil_json(marker), _evil_nested_json(marker)):
        with pytest.raises(configio.ConfigFileError) as e:
            configio.loads(text)
        assert "subprocess.getoutput" in str(e.value) and "\n" not in str(e.value)
        assert not marker.exists()


def test_loads_still_reads_paxsearch_configs():
    from paxsearch.trainer.config import TrainConfig

    cfg = TrainConfig()
    assert configio.build(configio.loads(configio.dumps(configio.to_fiddle(cfg)))) == cfg


def test_train_refuses_a_json_config_that_runs_code(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.json"
    path.write_text(_evil_json(marker))
    proc = cli("train", path, "--run-dir", tmp_path / "out", check=False, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert not marker.exists()
    assert len(proc.stderr.strip().splitlines()) == 1 and "subprocess.getoutput" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_train_trial_refuses_a_stored_config_that_runs_code(tmp_path):
    """Anyone who can write the shared database must not run code through `train RUN --trial`."""
    marker = tmp_path / "pwned"
    run = tmp_path / "run"
    run.mkdir()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="s", storage=storage_lib.default_url(str(run)))
    trial = study.ask()
    trial.set_user_attr("config", _evil_nested_json(marker))
    study.tell(trial, 1.0)
    proc = cli("train", run, "--trial", "0", "--run-dir", tmp_path / "out", check=False, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert not marker.exists()
    assert len(proc.stderr.strip().splitlines()) == 1 and "subprocess.getoutput" in proc.stderr


def _shared_study_with_evil_space(tmp_path, marker):
    """A study as `paxsearch run` stores it, whose space file is not on this machine and whose
    stored space source runs a command when loaded."""
    from paxsearch.search.driver.context import check_settings, study_attrs
    from paxsearch.search.study.space import load_space

    space = load_space(TINY)
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    study = optuna.create_study(study_name="tiny_space", storage=url, directions=space.settings.directions)
    for key, value in study_attrs(space, space.settings, check_settings(space.settings, space)).items():
        study.set_user_attr(key, value)
    study.set_user_attr("space_file", str(tmp_path / "gone" / "tiny_space.py"))
    study.set_user_attr("space_source", f"import os\nos.system('touch {marker}')\n" + open(TINY).read())
    return url


def test_worker_runs_a_stored_space_source_only_on_opt_in(tmp_path):
    marker = tmp_path / "pwned"
    url = _shared_study_with_evil_space(tmp_path, marker)
    proc = cli("worker", "--storage", url, "--run-dir", tmp_path / "w", "--trials", "1", "--no-progress",
               check=False, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert not marker.exists()
    assert "--trust-stored-space" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "w" / "tiny_space.py").exists()

    from paxsearch.search.driver.context import reopen

    ctx = reopen(url, None, str(tmp_path / "w2"), {}, trust_stored_space=True)
    assert marker.exists()  # the user opted in: the stored source ran
    assert ctx.space.path == os.path.abspath(tmp_path / "w2" / "tiny_space.py")

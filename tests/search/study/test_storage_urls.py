"""Storage URLs: PostgreSQL studies read back in the README's URL form, passwords never shown
or written, the URL taken from the environment (issue 10, defects 1 and 4)."""
import json

import optuna
import pytest

from paxsearch.search.study import storage as storage_lib

from ...search_util import cli, in_process, refused

CONFIG_JSON = None


def _tiny_config_json() -> str:
    global CONFIG_JSON
    if CONFIG_JSON is None:
        from paxsearch.search.study import configio
        from paxsearch.trainer.config import TrainConfig

        CONFIG_JSON = configio.dumps(configio.to_fiddle(TrainConfig()))
    return CONFIG_JSON


def _study_with_one_trial(url: str, name: str = "pg_study") -> None:
    """A study as `paxsearch run` stores it: three objectives, one completed trial with a config."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name=name, storage=storage_lib.open_storage(url),
                                directions=["minimize", "maximize", "minimize"])
    study.set_user_attr("objectives", [{"name": "loss", "direction": "minimize"},
                                       {"name": "mfu", "direction": "maximize"},
                                       {"name": "memory", "direction": "minimize"}])
    trial = study.ask()
    trial.set_user_attr("config", _tiny_config_json())
    study.tell(trial, [2.5, 0.1, 1e6])


@pytest.mark.postgres
def test_report_best_and_train_trial_read_a_postgresql_url(pg_url, tmp_path):
    """Defect 1: the README's postgresql:// form (no +psycopg2) reads back in analysis."""
    assert pg_url.startswith("postgresql://")
    _study_with_one_trial(pg_url)
    from paxsearch.analysis.best import best_trial
    from paxsearch.analysis.load import load_trials
    from paxsearch.search.study.trial_config import trial_config_json

    frame = load_trials(pg_url)
    assert list(frame["number"]) == [0] and frame["loss"][0] == 2.5
    assert best_trial(pg_url, "loss")[0] == 0
    assert trial_config_json(pg_url, "0") == (0, _tiny_config_json())
    out = cli("best", pg_url, "--objective", "loss", "--export", tmp_path / "best.json")
    assert "trial 0" in out.stdout
    assert json.loads((tmp_path / "best.json").read_text())


SECRET = "s3/cr#t?x"
SECRET_AT = "p@ss/w#rd?"


@pytest.mark.parametrize("url,secret", [
    (f"postgresql://alice:{SECRET}@db.example:5432/studies", SECRET),
    (f"postgresql://alice:{SECRET_AT}@db.example/studies", SECRET_AT),
    ("postgresql://alice@db.example/studies?password=hunter2&sslmode=require", "hunter2"),
    ("mysql+pymysql://bob:a%2Fb%40c@db/x", "a%2Fb%40c"),
])
def test_mask_url_hides_passwords_with_url_delimiters(url, secret):
    """Defect 4: one masking function, on SQLAlchemy's URL parsing."""
    masked = storage_lib.mask_url(url)
    pieces = [p for p in (secret, *secret.replace("%2F", "/").replace("%40", "@").split("/"),
                          *secret.split("@"), *secret.split("#"), *secret.split("?")) if len(p) >= 2]
    assert not any(p in masked for p in pieces), masked
    assert "***" in masked and ("db.example" in masked or "@db/" in masked)
    from paxsearch.analysis import load

    assert load.mask_url is storage_lib.mask_url  # analysis uses the same function


def test_mask_url_keeps_urls_without_password():
    for url in ("sqlite:////tmp/a b/study.db", "postgresql://postgres@127.0.0.1:5432/test", "env:PAXSEARCH_DB"):
        assert storage_lib.mask_url(url) == url


def test_study_json_and_output_never_hold_a_password(tmp_path):
    """Defect 4: a run whose storage URL has a password with / # ? prints and stores it masked.
    (The server is unreachable, so the run stops at the storage; the masked URL is what remains.)"""
    url = f"postgresql://alice:{SECRET}@127.0.0.1:1/nodb"
    run = tmp_path / "run"
    storage_lib.write_study_json(str(run), "s", url, "space.py")
    stored = (run / "study.json").read_text()
    assert "s3" not in stored and "cr#t" not in stored and "***" in stored
    proc = cli("run", "tests/spaces/tiny_space.py", "--storage", url, "--run-dir", run / "b", check=False,
               timeout=300)
    assert proc.returncode == 2, proc.stderr
    text = proc.stdout + proc.stderr
    assert "s3" not in text and "cr#t" not in text and "Traceback" not in text, text
    assert len(proc.stderr.strip().splitlines()) == 1


def test_storage_url_from_an_environment_variable(tmp_path, monkeypatch, capsys):
    """Defect 4: `--storage env:NAME` reads the URL (password included) from the environment and
    study.json keeps the name of the variable, never its value."""
    db = tmp_path / "elsewhere" / "study.db"
    monkeypatch.setenv("PAXSEARCH_TEST_DB", f"sqlite:///{db}")
    assert storage_lib.resolve_url("env:PAXSEARCH_TEST_DB") == f"sqlite:///{db}"
    _study_with_one_trial("env:PAXSEARCH_TEST_DB", name="envstudy")
    assert db.exists()
    run = tmp_path / "run"
    storage_lib.write_study_json(str(run), "envstudy", "env:PAXSEARCH_TEST_DB", "space.py")
    assert json.loads((run / "study.json").read_text())["storage"] == "env:PAXSEARCH_TEST_DB"
    from paxsearch.analysis.load import load_trials, open_study

    assert open_study(str(run)).storage_display == "env:PAXSEARCH_TEST_DB"
    assert list(load_trials(str(run))["number"]) == [0]
    # the commands in this process: they read the variable from os.environ, as a subprocess would
    capsys.readouterr()
    assert in_process("ls", run) == 0
    out = capsys.readouterr().out
    assert "envstudy" in out and "1 trials" in out
    assert in_process("best", "env:PAXSEARCH_TEST_DB", "--objective", "loss") == 0
    assert "trial 0" in capsys.readouterr().out
    monkeypatch.delenv("PAXSEARCH_TEST_DB")
    with pytest.raises(storage_lib.StorageError, match="PAXSEARCH_TEST_DB"):
        storage_lib.resolve_url("env:PAXSEARCH_TEST_DB")
    monkeypatch.setenv("PAXSEARCH_TEST_DB", "")
    refused(capsys, "best", run, words=("PAXSEARCH_TEST_DB",))  # exit 2, one line, no traceback

"""A database that blips while the driver prepares a trial (search/driver/prepare.py, loop.py): the
trial's attributes are written through storage_lib.retry, so a lost connection is waited for and one
that stays away stops the driver with one line (StorageError), not a traceback. CI found the gap: a
PostgreSQL outage that began between a trial's config.json and its math_key stopped the driver with
optuna's StorageInternalError (tests/search/study/test_storage_races_and_outages.py, exit 1, not 2)."""
from __future__ import annotations

import optuna
import pytest
import sqlalchemy.exc

from paxsearch.search.driver import prepare
from paxsearch.search.study import storage as storage_lib


def _lost() -> optuna.exceptions.StorageInternalError:
    try:
        raise sqlalchemy.exc.OperationalError("INSERT ...", {}, Exception("server closed the connection"))
    except sqlalchemy.exc.OperationalError as e:
        err = optuna.exceptions.StorageInternalError("An exception is raised during the commit.")
        err.__cause__ = e
        return err


@pytest.fixture
def trial(tmp_path, monkeypatch):
    monkeypatch.setattr(storage_lib, "RETRY_DELAYS_S", (0.01, 0.01))
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/s.db", study_name="s")
    return study.ask()


def test_a_blip_while_a_trial_is_prepared_is_waited_for(trial, monkeypatch):
    real, calls = trial.storage.set_trial_user_attr, []

    def flaky(trial_id, key, value):
        calls.append(key)
        if len(calls) == 1:
            raise _lost()
        return real(trial_id, key, value)

    monkeypatch.setattr(trial.storage, "set_trial_user_attr", flaky)
    prepare._set_attr(trial, "math_key", "abc")
    assert calls == ["math_key", "math_key"] and trial.user_attrs["math_key"] == "abc"


def test_a_storage_that_stays_away_stops_with_one_line(trial, monkeypatch):
    def gone(trial_id, key, value):
        raise _lost()

    monkeypatch.setattr(trial.storage, "set_trial_user_attr", gone)
    with pytest.raises(storage_lib.StorageError, match="stayed unreachable") as info:
        prepare._set_attr(trial, "math_key", "abc")
    assert "\n" not in str(info.value)


def test_bad_data_is_not_retried(trial, monkeypatch):
    calls = []

    def bad(trial_id, key, value):
        calls.append(key)
        raise ValueError("not JSON")

    monkeypatch.setattr(trial.storage, "set_trial_user_attr", bad)
    with pytest.raises(ValueError):
        prepare._set_attr(trial, "config", object())
    assert calls == ["config"]

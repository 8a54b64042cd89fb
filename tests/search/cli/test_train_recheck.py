"""`paxsearch train RUN --trial N` on a TPU machine whose libtpu is not the plan's: one line
before compiling, and one error line with both figures when the local compile does not fit
(search/cli/recheck.py); `paxsearch run` continuing such a study says so once (cli/common.py).
The CPU suite has no chip: the platform is passed in as a string (or a Target's)."""
from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import optuna
import pytest

from paxsearch.search.cli import recheck as R
from paxsearch.search.cli.common import other_libtpu_line
from paxsearch.search.errors import UserError
from paxsearch.search.planning.targets import parse_target

optuna.logging.set_verbosity(optuna.logging.WARNING)

NEW = {"jax": "0.10.2", "jaxlib": "0.10.2", "libtpu": "0.0.52"}
GIB = 2**30


@pytest.fixture
def run(tmp_path):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="s", storage=storage)
    plans = [{"peak_bytes": 14 * GIB, "compiler": NEW}, {"peak_bytes": GIB}, None]  # named, old, none
    for plan in plans:
        study.add_trial(optuna.trial.create_trial(value=1.0, user_attrs={"plan": plan} if plan else {}))
    (tmp_path / "study.json").write_text(json.dumps({"study_name": "s", "storage": storage}))
    return str(tmp_path)


def test_a_plan_of_another_libtpu_is_rechecked_on_tpus_only(run):
    found = R.planned_recheck(run, 0, "tpu", local_libtpu="0.0.42.1")
    assert found.line == ("trial 0 was planned with libtpu 0.0.52; this machine has 0.0.42.1: its memory is "
                          "re-checked with the local compiler before training")
    assert R.planned_recheck(run, 0, "cpu", local_libtpu="0.0.42.1") is None  # no chip here
    assert R.planned_recheck(run, 0, "tpu", local_libtpu="0.0.52") is None  # the same compiler
    assert R.planned_recheck(run, 1, "tpu", local_libtpu="0.0.42.1") is None  # a plan that names none
    assert R.planned_recheck(run, 2, "tpu", local_libtpu="0.0.42.1") is None  # no plan
    assert R.planned_recheck(None, None, "tpu", local_libtpu="0.0.42.1") is None  # not a stored trial


def test_a_rechecked_step_that_does_not_fit_is_one_error_line_with_both_figures(run):
    found = R.planned_recheck(run, 0, "tpu", local_libtpu="0.0.42.1")
    R.check_recheck(found, 15 * GIB, int(15.75 * GIB), "TPU v5 lite bytes_limit")  # fits: nothing
    R.check_recheck(None, 99 * GIB, GIB, "x")  # nothing to re-check: train's own check applies
    with pytest.raises(R.RecheckRefused) as refused:
        R.check_recheck(found, int(16.5 * GIB), int(15.75 * GIB), "TPU v5 lite bytes_limit")
    assert isinstance(refused.value, UserError)  # cli.main: one line, exit status 2
    line = str(refused.value)
    assert "\n" not in line
    assert line.startswith("trial 0 does not fit this machine: planned 14.00 GiB per device with libtpu 0.0.52, "
                           "the local compiler (libtpu 0.0.42.1) needs 16.50 GiB per device, above the chip's "
                           "limit of 15.75 GiB (TPU v5 lite bytes_limit)")


def test_run_continuing_a_study_on_tpus_says_once_which_libtpu_planned_it(run):
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{run}/study.db")
    on_chip = SimpleNamespace(study=study, target=dataclasses.replace(parse_target("tpu:v5e-1"), plan_only=False))
    line = other_libtpu_line(on_chip, local_libtpu="0.0.42.1")
    assert line.startswith("this study's earlier plans were made with another libtpu (1 plan with libtpu 0.0.52); "
                           "this machine has libtpu 0.0.42.1: trials here are compiled and their memory checked "
                           "with the local compiler before they train")
    assert other_libtpu_line(on_chip, local_libtpu="0.0.52") is None
    planning = SimpleNamespace(study=study, target=dataclasses.replace(on_chip.target, plan_only=True))
    assert other_libtpu_line(planning, local_libtpu="0.0.42.1") is None  # compiled here, never run: no chip

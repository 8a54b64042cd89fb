"""The report's recommendation block, outcome counts and units, on a stored study with an
ok pair, a predicted_oom trial (COMPLETE in Optuna, loss inf, as the driver stores it) and a crash."""
from __future__ import annotations

import math
import os

import optuna
import pytest

from paxsearch.analysis import load, write_report
from paxsearch.analysis.recommend import recommend

from .study_builder import GIB, make_run, trial_spec

BUDGET = 4 * GIB


def _specs() -> list[dict]:
    base = {"mesh": "1x8x1", "per_device_batch": 1, "remat": "none", "model_size": "tiny"}
    ok0 = trial_spec(0, base, values=(2.0, 0.30, 1 * GIB))
    ok1 = trial_spec(1, {**base, "mesh": "2x4x1"}, values=(2.0, 0.40, 2 * GIB))
    oom = trial_spec(2, {**base, "per_device_batch": 4}, values=(math.inf, 0.0, 5 * GIB))
    oom["attrs"].update(failure_kind="predicted_oom", failure_message="predicted 5 GiB exceeds the budget")
    oom["attrs"].pop("measured", None)
    crash = trial_spec(3, {**base, "remat": "full"}, failure_kind="crash")
    specs = [ok0, ok1, oom, crash]
    for spec in specs:
        spec["attrs"]["memory_budget"] = {"bytes": BUDGET, "source": "setting"}
    small = trial_spec(4, {**base, "model_size": "small"}, values=(1.9, 0.10, 300 * 2**20))
    small["attrs"]["memory_budget"] = {"bytes": BUDGET, "source": "setting"}
    return [*specs, small]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("rec") / "run", _specs())


def test_best_mfu_names_its_margin_headroom_and_commands(run):
    study = optuna.load_study(study_name="sweep", storage=f"sqlite:///{run / 'study.db'}")
    frame = load.trials_frame(study)
    assert list(frame["outcome"]) == ["ok", "ok", "predicted_oom", "crash", "ok"]
    rec = recommend(frame, ["mfu"], None, "runs/x", predicted=False)
    assert rec is not None and rec.number == 1 and rec.choice == "the best mfu"
    assert rec.decisions == {"mesh": "2x4x1", "per_device_batch": 1, "remat": "none", "model_size": "tiny"}
    assert rec.scores == {"MFU": "40.00%"}
    assert rec.reasons[0] == "MFU 40.00%: 33.3% above the runner-up, trial 0 (30.00%)"
    assert rec.reasons[1] == ("fits with 2.0 GiB to spare per device: compiled peak 2.0 GiB of a 4.0 GiB "
                              "budget (50% free)")
    assert rec.commands == ("paxsearch train runs/x --trial 1 --steps N",
                            "paxsearch best runs/x --objective mfu --export trial1.json")
    # the lowest memory is the MiB-sized trial: the trade against the best MFU is stated
    low = recommend(frame, ["memory"], None, "runs/x", predicted=False)
    assert low.number == 4 and low.scores == {"memory/device": "300.0 MiB"}
    assert recommend(frame.iloc[2:4], ["mfu"], None, "runs/x", predicted=False) is None  # nothing scored


def test_report_opens_with_the_recommendation_and_counts_outcomes(run, tmp_path):
    out = tmp_path / "report"
    paths = write_report(run, out_dir=out)
    page = paths["html"].read_text()
    assert page.index('id="recommendation"') < page.index('<dl class="header">')
    block = page[page.index('id="recommendation"'):page.index("</div>", page.index('id="recommendation"'))]
    assert "Use trial" in block and "paxsearch train" in block and "to spare per device" in block
    # counts by outcome: the predicted_oom trial is never counted (or shown) as COMPLETE / ok
    assert "5 (3 ok, 1 crash, 1 predicted_oom)" in page
    trials = page[page.index('id="trials"'):]
    assert "<th>outcome</th>" in trials and ">predicted_oom<" in trials and ">COMPLETE<" not in trials
    assert ">300.0 MiB<" in trials and ">1.0 GiB<" in trials  # units that fit the values
    assert '<div class="scroll">' in page  # wide tables scroll instead of running off the page
    markdown = paths["markdown"].read_text()
    assert markdown.index("## Recommendation") < markdown.index("- **study**")
    assert "paxsearch train" in markdown


def test_commands_and_header_name_paths_relative_to_here(run, tmp_path, monkeypatch):
    monkeypatch.chdir(run.parent)
    page = write_report(run, out_dir=tmp_path / "r")["html"].read_text()
    assert f"paxsearch train {run.name} --trial" in page
    assert f"sqlite:///{run.name}/study.db" in page and str(run.parent) + os.sep not in page


def test_decision_roles_from_the_stored_math_groups():
    import pandas as pd

    from paxsearch.analysis.tables import decision_roles

    frame = pd.DataFrame({"number": range(5), "d.mesh": ["a", "b", "a", "b", "a"], "d.batch": [1, 1, 2, 2, 1],
                          "d.remat": ["none"] * 5, "math_key": ["k1", "k1", "k2", "k2", "k1"]})
    roles = dict(zip(*decision_roles(frame).to_dict("list").values(), strict=True))
    assert roles == {"mesh": "time to train, MFU, memory: layout only (the loss is its math group's)",
                     "batch": "loss, time to train, MFU, memory: changes the math",
                     "remat": "not varied with the other decisions fixed"}
    assert decision_roles(frame.assign(math_key=None)).empty  # plan-only or older studies: no claim


def test_math_groups_are_labelled_by_what_sets_them_apart():
    import pandas as pd

    from paxsearch.analysis.tables import math_group_labels

    frame = pd.DataFrame({"number": range(5), "d.mesh": ["a", "b", "a", "b", "a"], "d.batch": [1, 1, 2, 2, 1],
                          "d.remat": ["none"] * 5, "math_key": ["k1", "k1", "k2", "k2", "k1"]})
    assert math_group_labels(frame) == {"k1": "batch=1 (3 trials)", "k2": "batch=2 (2 trials)"}
    # a per-device batch on two meshes: the same global batch is one group, told apart by it
    frame = frame.assign(**{"d.batch": [1, 2, 2, 4, 1], "plan.global_batch": [8, 8, 16, 16, 8]})
    assert math_group_labels(frame) == {"k1": "global batch=8 (3 trials)", "k2": "global batch=16 (2 trials)"}
    assert math_group_labels(frame[frame["math_key"] == "k1"]) == {"k1": "one math group (3 trials)"}
    assert math_group_labels(frame.assign(math_key=None)) == {}

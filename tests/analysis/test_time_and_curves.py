"""The report's time to train (its figure, units and full-run token count) and its loss curves
per math group (issue 21, sections 1 and 2), on a stored study of two math groups (model size)
with two layouts (mesh) each, stored as the driver stores them (record.settle)."""
from __future__ import annotations

import re

import optuna
import pytest

from paxsearch.analysis import load, plots, write_report
from paxsearch.search.trial import record
from paxsearch.store import Measured, Plan, TrialOutcome

from .study_builder import GIB, make_run, trial_spec

OBJECTIVES = [{"name": "loss", "direction": "minimize"},
              {"name": "time_to_train", "direction": "minimize"},
              {"name": "memory", "direction": "minimize"}]
PARAMS = {"tiny": 10**6, "small": 4 * 10**6}


def _spec(number: int, mesh: str, size: str) -> dict:
    decisions = {"mesh": mesh, "per_device_batch": 2, "remat": "none", "model_size": size}
    step_time = 0.5 + 0.25 * (mesh == "2x4x1") + (size == "small")
    final = 2.0 if size == "small" else 2.5
    curve = [[step, final + 1.0 / step + (0.01 if mesh == "2x4x1" else 0.0)] for step in (2, 4, 6, 8)]
    plan = Plan.make(peak_bytes=GIB, param_count=PARAMS[size], global_batch=16, tokens_per_step=16 * 64)
    outcome = TrialOutcome(plan=plan, measured=Measured(loss=curve[-1][1], mfu=0.3, step_time=step_time, steps=8),
                           intermediate=curve)
    _, values, outcome = record.settle([o["name"] for o in OBJECTIVES], outcome)
    spec = trial_spec(number, decisions, values=tuple(values))
    spec["attrs"].update(outcome.to_user_attrs(), math_key=f"key-{size}")
    spec["attrs"]["measured"]["step_time"] = step_time
    return spec


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    specs = [_spec(n, mesh, size) for n, (size, mesh) in enumerate(
        [("tiny", "1x8x1"), ("tiny", "2x4x1"), ("small", "1x8x1"), ("small", "2x4x1")])]
    return make_run(tmp_path_factory.mktemp("ttt") / "run", specs, objectives=OBJECTIVES)


@pytest.fixture(scope="module")
def report(run):
    return write_report(run)


def test_time_to_train_is_shown_in_its_unit_with_its_token_count(run, report):
    frame = load.load_trials(run)
    # 20 tokens per parameter over 1024 tokens per 0.5 s step: 20e6 x 0.5 / 1024 s
    assert frame.loc[0, "time_to_train"] == pytest.approx(20 * 10**6 * 0.5 / 1024)
    assert frame.loc[0, "full_run_tokens"] == 20 * 10**6
    for key in ("html", "markdown"):
        text = report[key].read_text()
        assert "full run = 20 tokens per parameter" in text and "Hoffmann et al. 2022" in text, key
        assert "time to train" in text
    page = report["html"].read_text()
    trials = page[page.index('id="trials"'):]
    assert "<th>time to train</th>" in trials and ">2.7 h<" in trials  # 9766 s
    block = page[page.index('id="recommendation"'):page.index("</div>", page.index('id="recommendation"'))]
    assert "full run in" in block
    roles = page[page.index('id="decision-roles"'):]
    assert "loss, time to train, MFU, memory: changes the math" in roles  # model_size
    assert "time to train, MFU, memory: layout only" in roles  # mesh


def test_loss_curves_one_line_per_math_group(run, report):
    study = optuna.load_study(study_name="sweep", storage=f"sqlite:///{run / 'study.db'}")
    study_frame, curves = load.trials_frame(study), load.loss_curves(study)
    groups = plots.curve_groups(study_frame, curves)
    # labelled by the math decision that sets them apart; the layout (mesh) is averaged over
    assert set(groups) == {"model_size=tiny (2 trials)", "model_size=small (2 trials)"}
    numbers, mean = groups["model_size=small (2 trials)"]
    assert numbers == [2, 3] and list(mean.index) == [2, 4, 6, 8]
    assert mean[8] == pytest.approx(2.0 + 1 / 8 + 0.005)
    page = report["html"].read_text()
    assert "Loss curves per math group" in page
    assert re.search(r'<img id="loss-curves"[^>]*src="data:image/png;base64,', page)
    start = page.index('id="loss-groups"')
    legend = page[start:page.index("</table>", start)]
    assert "model_size=small (2 trials)" in legend and ">2, 3<" in legend
    assert report["curves_png"].read_bytes().startswith(b"\x89PNG")
    assert "](report/loss_curves.png)" in report["markdown"].read_text()


def test_best_picks_the_shortest_time_to_train(run, cli):
    from paxsearch.analysis import best_trial

    number, _ = best_trial(run, "time_to_train")
    assert number == 0  # the tiny model on the faster mesh: 2.7 h
    out = cli("best", run, "--objective", "time_to_train")
    assert out.stdout.startswith("trial 0 (best time_to_train)") and "time to train 2.7 h" in out.stdout, out.stdout

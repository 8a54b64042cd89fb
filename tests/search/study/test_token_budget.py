"""A fair loss objective (issue 9, section 5): with STUDY tokens=, every trial trains the same
number of tokens (steps = tokens / (global batch x seq_len)) and loss is its held-out eval loss;
the report states the budget."""
import math

import optuna
import pytest

from paxsearch.search.driver.prepare import token_budget
from paxsearch.search.study import configio
from paxsearch.search.study.settings import SettingsError, StudySettings, steps_for_tokens, tokens_for_compute
from paxsearch.trainer import flops as flops_lib

from ...search_util import cli
from ...space_factory import tiny_config

TOKENS = 2048  # 8 steps at global batch 8 x seq 32, 4 steps at 16 x 32; batch 512 x 32 is over a step


def _space(make_space, tokens=TOKENS, evaluate=True):
    """3 per-device batches on mesh 8x1x1 with a token budget (steps=3 is replaced by it)."""
    return make_space("fair_space", study=dict(trials=3, timeout=300, tokens=tokens),
                      decisions=dict(per_device_batch=[1, 2, 64]), mesh="8x1x1", steps=3,
                      data=dict(eval_examples=16), evaluate=evaluate, eval_batches=1)


def test_steps_for_tokens_rounds_to_the_nearest_step():
    assert steps_for_tokens(2048, 8, 32) == 8 and steps_for_tokens(2048, 16, 32) == 4
    assert steps_for_tokens(1000, 2, 64) == 8  # 7.81 steps
    assert steps_for_tokens(1000, 3, 100) == 3  # 3.33 steps
    assert steps_for_tokens(150, 1, 100) == 2  # 1.5 steps: halves round up
    assert steps_for_tokens(128, 2, 64) == 1
    with pytest.raises(SettingsError, match="less than one step of global batch 2 x seq_len 64 = 128 tokens"):
        steps_for_tokens(127, 2, 64)


def test_tokens_setting_parses_counts():
    assert StudySettings.from_dict({"tokens": "64Ki"}).tokens == 65536
    assert StudySettings.from_dict({"tokens": "2M"}).tokens == 2_000_000
    assert StudySettings.from_dict({"tokens": 1e6}).tokens == 1_000_000
    assert StudySettings().tokens is None and StudySettings().to_dict()["tokens"] is None
    for bad in ("lots", 0, "2MB", True):
        with pytest.raises(SettingsError, match="tokens"):
            StudySettings.from_dict({"tokens": bad})


def test_tokens_without_eval_is_one_line(tmp_path, make_space):
    out = cli("run", _space(make_space, evaluate=False), "--run-dir", tmp_path / "r", "--no-progress", check=False)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "tokens=2048" in lines[0] and "eval.enabled=False" in lines[0], out.stderr


@pytest.mark.slow
def test_equal_tokens_per_trial_and_loss_is_the_eval_loss(tmp_path, make_space):
    run = tmp_path / "run"
    cli("run", _space(make_space), "--run-dir", run, "--no-progress", timeout=900)
    study = optuna.load_study(study_name="fair_space", storage=f"sqlite:///{run}/study.db")
    trials = {t.params["per_device_batch"]: t for t in study.get_trials()}
    assert set(trials) == {1, 2, 64}

    too_big = trials[64]
    assert too_big.user_attrs["failure_kind"] == "invalid"
    assert "less than one step of global batch 512 x seq_len 32" in too_big.user_attrs["failure_message"]

    tokens_seen = set()
    for per_device, steps in ((1, 8), (2, 4)):
        t = trials[per_device]
        assert t.state == optuna.trial.TrialState.COMPLETE, t.user_attrs.get("failure_message")
        budget = t.user_attrs["token_budget"]
        assert budget["global_batch"] == 8 * per_device and budget["steps"] == steps
        assert budget["tokens"] == TOKENS and budget["tokens_trained"] == steps * 8 * per_device * 32
        measured = t.user_attrs["measured"]
        assert measured["steps"] == steps  # it trained that many steps
        assert configio.build(configio.loads(t.user_attrs["config"])).steps == steps  # and exports them
        tokens_seen.add(measured["steps"] * 8 * per_device * 32)
        # the objective is the held-out eval loss, not the last training batch's loss
        assert math.isfinite(measured["eval_loss"]) and t.values[0] == measured["eval_loss"]
        assert measured["eval_loss"] != measured["loss"]
    assert tokens_seen == {TOKENS}

    assert "2,048 tokens per trial" in study.user_attrs["loss_objective"]
    cli("report", run, "--no-tensorboard")
    line = "loss = held-out eval loss after 2,048 tokens per trial"
    assert line in (run / "report.md").read_text()
    assert line in (run / "report.html").read_text()


# ------------------------------------------------------------ equal compute (issue 21, section 1)

def test_compute_setting_parses_and_excludes_tokens():
    assert StudySettings.from_dict({"compute": "3P"}).compute == 3 * 10**15
    assert StudySettings.from_dict({"compute": 1e12}).compute == 10**12
    assert StudySettings().compute is None
    with pytest.raises(SettingsError, match="not both"):
        StudySettings.from_dict({"compute": "1P", "tokens": "2M"})
    with pytest.raises(SettingsError, match="compute"):
        StudySettings.from_dict({"compute": "lots"})
    with pytest.raises(SettingsError, match="less than one token"):
        tokens_for_compute(10, 11)


def test_equal_compute_gives_a_larger_model_fewer_tokens_and_the_same_flops():
    """Two model sizes under one compute budget: each trains the tokens that spend it (to the
    token below), so the larger model sees fewer tokens and both spend the same model FLOPs."""
    compute = 3 * 10**9
    budgets = {}
    for d_ff in (64, 1024):
        cfg = configio.build(tiny_config(evaluate=True, model=dict(d_ff=d_ff)))
        b = token_budget(cfg, None, 8, compute)
        per_token = 3 * flops_lib.forward_flops_per_token(cfg.model)
        assert b["compute"] == compute and b["flops_per_token"] == per_token
        assert b["tokens"] * per_token <= compute < (b["tokens"] + 1) * per_token
        assert b["steps"] == steps_for_tokens(b["tokens"], 8, 32)
        budgets[d_ff] = b
    assert budgets[1024]["tokens"] < budgets[64]["tokens"]
    spent = [b["tokens"] * b["flops_per_token"] for b in budgets.values()]
    assert abs(spent[0] - spent[1]) <= max(b["flops_per_token"] for b in budgets.values())


@pytest.mark.slow
def test_a_study_under_a_compute_budget_trains_the_tokens_it_buys(tmp_path, make_space):
    """A real study with STUDY compute=: every trial trains compute / (model FLOPs per token)
    tokens, stores the budget, scores the held-out eval loss, and the report says so."""
    per_token = 3 * flops_lib.forward_flops_per_token(configio.build(tiny_config()).model)
    compute = 2048 * per_token  # 8 steps at global batch 8 x seq 32, 4 at 16 x 32
    space = make_space("compute_space", study=dict(trials=2, timeout=300, compute=compute),
                       decisions=dict(per_device_batch=[1, 2]), mesh="8x1x1", steps=3,
                       data=dict(eval_examples=16), evaluate=True, eval_batches=1)
    run = tmp_path / "run"
    cli("run", space, "--run-dir", run, "--no-progress", timeout=900)
    study = optuna.load_study(study_name="compute_space", storage=f"sqlite:///{run}/study.db")
    for t in study.get_trials():
        assert t.state == optuna.trial.TrialState.COMPLETE, t.user_attrs.get("failure_message")
        budget, measured = t.user_attrs["token_budget"], t.user_attrs["measured"]
        assert budget["compute"] == compute and budget["tokens"] == 2048
        assert measured["steps"] == budget["steps"] == 2048 // (8 * t.params["per_device_batch"] * 32)
        assert t.values[0] == measured["eval_loss"]
    assert "model FLOPs per trial (equal compute" in study.user_attrs["loss_objective"]

"""The report's int8-against-bf16 comparison on real trials: tests/analysis/quant_space.py's two twins
(per-device batch 1, quantization none and int8) trained on the 8 CPU devices, stored, reported
(~1-2 minutes on 2 cores)."""
import os

import optuna
import pytest

from paxsearch.analysis import quality

from ..search_util import REPO, cli


@pytest.mark.slow
def test_int8_twin_reported_with_its_speed_gain_and_loss_cost(tmp_path):
    run = tmp_path / "quant"
    cli("run", os.path.join(REPO, "tests", "analysis", "quant_space.py"), "--run-dir", run, "--trials", 2,
        "--set", "per_device_batch=1", "--no-progress", timeout=900)
    study = optuna.load_study(study_name="quant_space", storage=f"sqlite:///{run}/study.db")
    trials = {t.params["quantization"]: t for t in study.trials}
    assert set(trials) == {"none", "int8"}
    measured = {q: t.user_attrs["measured"] for q, t in trials.items()}
    for q, m in measured.items():
        assert trials[q].state == optuna.trial.TrialState.COMPLETE and m["steps"] == 32, (q, trials[q].user_attrs)
        assert "dropped_fraction" not in m  # a dense model stores no MoE figure
    gain = measured["int8"]["tokens_per_sec"] / measured["none"]["tokens_per_sec"]
    cost = trials["int8"].values[0] / trials["none"].values[0] - 1  # the loss objective: eval loss, equal tokens

    cli("report", run, "--no-tensorboard")
    markdown = (run / "report.md").read_text()
    section = markdown[markdown.index("## Quantization: speed gain against loss cost"):]
    int8, bf16 = trials["int8"].number, trials["none"].number
    assert quality.QUANT_RULE in section
    assert (f"The fastest quantized trial: trial {int8} (int8) runs at {gain:.2f}x the tokens/s of its bf16 twin, "
            f"trial {bf16}, at a loss cost of {cost:+.2%}") in section
    assert f"| {gain:.3f}x |" in section and f"| {cost:+.2%} |" in section
    verdict = "OVER the 2% loss tolerance" if cost > quality.LOSS_COST_TOLERANCE else "within the 2% loss tolerance"
    assert verdict in section
    assert "dropped" not in markdown  # a dense study: no dropped-tokens column

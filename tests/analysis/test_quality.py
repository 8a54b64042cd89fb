"""What dropping tokens and int8 matmuls cost in quality, in the report and the recommendation
(analysis/quality.py), on stored studies: a mixture of experts whose best-MFU trial drops tokens,
a dense study that must read as before, and a study with a quantization decision."""
from __future__ import annotations

import pandas as pd
import pytest

from paxsearch.analysis import best, load, quality, write_report
from paxsearch.analysis.recommend import recommend
from paxsearch.store.outcome import Measured

from .study_builder import GIB, make_run, trial_spec

BASE = {"mesh": "1x8x1", "per_device_batch": 1, "remat": "none", "model_size": "tiny"}


def _moe_specs() -> list[dict]:
    """Trial 1 has the best MFU and drops 13.9% of its tokens; 0 is dropless; 2 is dominated."""
    specs = [trial_spec(0, BASE, values=(2.00, 0.30, 1 * GIB)),
             trial_spec(1, {**BASE, "mesh": "2x4x1"}, values=(2.10, 0.40, 1 * GIB)),
             trial_spec(2, {**BASE, "remat": "full"}, values=(2.20, 0.20, 2 * GIB))]
    for spec, share in zip(specs, (0.0, 0.139, 0.05), strict=True):
        spec["attrs"]["measured"].update(dropped_fraction=share, load_balance_loss=1.2)
    return specs


@pytest.fixture(scope="module")
def moe_run(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("moe") / "run", _moe_specs())


def test_the_dropped_share_sits_beside_mfu_in_every_report_file(moe_run, tmp_path):
    paths = write_report(moe_run, out_dir=tmp_path / "r")
    markdown = paths["markdown"].read_text()
    header = next(line for line in markdown.splitlines() if line.startswith("| trial |"))
    cells = [c.strip() for c in header.split("|")]
    assert cells[cells.index("MFU") + 1] == "dropped tokens"  # beside MFU in the Pareto table
    assert "| 13.90% |" in markdown
    page = paths["html"].read_text()
    assert "<th>MFU</th><th>dropped tokens</th>" in page and ">13.90%<" in page
    assert "<th>load-balance loss</th>" in page[page.index('id="trials"'):]  # the all-trials table
    csv = pd.read_csv(paths["csv"])
    assert csv.set_index("number")["dropped_fraction"].to_dict() == {0: 0.0, 1: 0.139, 2: 0.05}
    assert (csv["load_balance_loss"] == 1.2).all()


def test_the_recommendation_says_when_the_best_mfu_trial_drops_tokens(moe_run):
    frame = load.load_trials(moe_run)
    rec = recommend(frame, ["mfu"], None, "runs/x", predicted=False)
    assert rec.number == 1 and rec.scores == {"MFU": "40.00%", "dropped tokens": "13.90%"}
    drop = next(r for r in rec.reasons if r.startswith("drops"))
    assert drop.startswith("drops 13.9% of tokens")
    assert "the best loss without dropping: trial 0's 2.0000 against 2.1000 here" in drop
    # a pick that does not drop names the best-MFU trial that does
    low = recommend(frame, ["loss"], None, "runs/x", predicted=False)
    assert low.number == 0
    assert any(r.startswith("the best MFU, trial 1 (40.00%), drops 13.9% of tokens") for r in low.reasons)
    chosen = best.choose(moe_run, "mfu")
    assert chosen.scores["dropped tokens"] == "13.90%"
    assert chosen.notes and chosen.notes[0].startswith("drops 13.9% of tokens")


def test_a_dense_study_has_no_dropped_column_and_stores_as_before(tmp_path):
    run = make_run(tmp_path / "dense", [trial_spec(0, BASE, values=(2.0, 0.3, GIB)),
                                        trial_spec(1, {**BASE, "mesh": "2x4x1"}, values=(2.1, 0.4, GIB))])
    paths = write_report(run, out_dir=tmp_path / "r")
    for key in ("markdown", "html", "csv"):
        text = paths[key].read_text()
        assert "dropped" not in text and "load_balance" not in text and "load-balance" not in text, key
    assert "Quantization" not in paths["markdown"].read_text()
    assert best.choose(run, "mfu").notes == ()
    # the stored form of a dense trial's measurement carries no MoE keys; a MoE one round-trips
    assert set(Measured(loss=1.0).to_dict()) == {"loss", "eval_loss", "mfu", "hfu", "tokens_per_sec", "step_time",
                                                 "peak_bytes", "steps"}
    moe = Measured(loss=1.0, dropped_fraction=0.25, load_balance_loss=1.1)
    assert Measured.from_dict(moe.to_dict()) == moe


def _quant_specs() -> list[dict]:
    """Twins on batch 1 (int8 1.25x faster, +0.5% loss) and batch 2 (int8 1.4x faster, +4% loss),
    and an int8 trial on another mesh whose nearest bf16 trial differs in the mesh."""
    rows = [(0, "none", {}, 2.000, 0.30), (1, "int8", {}, 2.010, 0.375),
            (2, "none", {"per_device_batch": 2}, 1.900, 0.35), (3, "int8", {"per_device_batch": 2}, 1.976, 0.49),
            (4, "int8", {"mesh": "8x1x1", "per_device_batch": 2}, 1.91, 0.20)]
    specs = []
    for number, quant, change, loss, mfu in rows:
        spec = trial_spec(number, {**BASE, **change}, values=(loss, mfu, GIB))
        spec["attrs"]["decisions"] = {**spec["attrs"]["decisions"], "quantization": quant}
        specs.append(spec)
    return specs


@pytest.fixture(scope="module")
def quant_run(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("quant") / "run", _quant_specs())


def test_int8_is_set_against_its_bf16_twin_at_equal_tokens(quant_run):
    frame = load.load_trials(quant_run)
    found = {c.number: c for c in quality.comparisons(frame)}
    assert set(found) == {1, 3, 4}
    assert found[1].counterpart == 0 and found[1].differs_in == ()
    assert found[1].speed_gain == pytest.approx(1.25) and found[1].loss_cost == pytest.approx(0.005)
    assert found[1].verdict == "pays"
    assert found[3].counterpart == 2 and found[3].loss_cost == pytest.approx(0.04)
    assert found[3].over_tolerance and found[3].verdict == "loss cost over 2%"
    assert found[4].counterpart == 2 and found[4].differs_in == ("mesh",)  # nearest: batch 2, another mesh
    assert found[4].speed_gain == pytest.approx(0.20 / 0.35) and found[4].verdict == "no speed gain"
    headline = quality.quantization_headline(frame)
    assert headline.startswith(quality.QUANT_RULE)
    assert ("The fastest quantized trial: trial 3 (int8) runs at 1.40x the tokens/s of its bf16 twin, trial 2, "
            "at a loss cost of +4.00%: OVER the 2% loss tolerance: trial 2 keeps the quality.") in headline


def test_the_recommendation_never_picks_int8_over_the_tolerance_silently(quant_run, tmp_path):
    frame = load.load_trials(quant_run)
    rec = recommend(frame, ["mfu"], None, "runs/x", predicted=False)
    assert rec.number == 3
    assert any("OVER the 2% loss tolerance: trial 2 keeps the quality" in r for r in rec.reasons)
    within = recommend(frame[frame["number"] <= 1], ["mfu"], None, "runs/x", predicted=False)
    assert within.number == 1
    assert ("trial 1 (int8) runs at 1.25x the tokens/s of its bf16 twin, trial 0, at a loss cost of +0.50%: "
            "within the 2% loss tolerance") in within.reasons
    bf16 = recommend(frame[frame["number"] <= 1], ["loss"], None, "runs/x", predicted=False)
    assert "its int8 twin, trial 1, runs at 1.25x its tokens/s at a loss cost of +0.50% (pays)" in bf16.reasons
    other = recommend(frame[frame["number"] != 1], ["loss"], None, "runs/x", predicted=False)  # trial 4 differs
    assert other.number == 2 and "its int8 twin, trial 3, runs at 1.40x its tokens/s at a loss cost of +4.00% " \
        "(loss cost over 2%)" in other.reasons
    assert any("OVER the 2%" in n for n in best.choose(quant_run, "mfu").notes)
    paths = write_report(quant_run, out_dir=tmp_path / "r")
    markdown = paths["markdown"].read_text()
    section = markdown[markdown.index("## Quantization: speed gain against loss cost"):]
    assert quality.QUANT_RULE in section and "| 1.400x | 1.9760 | 1.9000 | +4.00% | loss cost over 2% |" in section
    assert "| 4 | int8 | 2 | mesh |" in section  # the nearest bf16 trial, and what differs
    assert 'id="quantization"' in paths["html"].read_text()

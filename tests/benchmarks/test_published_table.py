"""benchmarks/published.py (MaxText's published throughput, with sources) and the pieces of
benchmarks/bench_published.py that need no compile: the FLOP conversion checked by hand, the
generated space of every row, the report's ratio and ranking."""
from __future__ import annotations

import importlib
import os
import re
import sys

import jax
import pytest

from paxsearch.search.planning.targets import parse_target
from paxsearch.search.study import configio
from paxsearch.search.study.space import load_space
from paxsearch.trainer import flops, presets, remat

from ..search_util import REPO

sys.path.insert(0, os.path.join(REPO, "benchmarks"))
P = importlib.import_module("published")
B = importlib.import_module("bench_published")

HASH = re.compile(r"@[0-9a-f]{40}\b")


@pytest.mark.parametrize("row", P.ROWS, ids=lambda r: r.name)
def test_every_row_is_traced_to_a_commit_and_a_config(row):
    assert row.published_in.startswith("google/maxtext ") and HASH.search(row.published_in), row.published_in
    assert row.config.startswith("google/maxtext ") and HASH.search(row.config), row.config
    assert row.formula in P.FORMULAS and row.remat in P.REMAT and row.attention in P.ATTENTION
    target = parse_target(row.target)
    assert target.num_devices == row.chips == row.ici[0] * row.ici[1] * row.ici[2]
    assert target.chip == row.chip
    p = presets.source(row.preset)  # a preset of the exact dims, with its own source
    assert p.model.vocab_size == 32768 and p.model.mlp == "dense" and p.model.activation == "relu"
    assert p.model.tie_embeddings and p.model.position == "rope" and p.model.n_kv_heads is None
    assert p.model.head_dim == 256
    # the published MFU is the published TFLOP/s over the chip's peak (integer TFLOP/s: 0.5%)
    assert P.PEAK_TFLOPS[row.chip] * 1e12 == flops.PEAK_BF16_FLOPS[f"tpu {row.chip}"]
    assert row.tflops / P.PEAK_TFLOPS[row.chip] == pytest.approx(row.mfu, rel=5e-3)


def test_the_four_configs_of_the_issue_are_the_calibration_rows():
    calibration = {r.name for r in P.ROWS if not r.held_out}
    assert calibration == {"v5e-256 16B", "v5e-256 32B", "v4-128 22B", "v5p-128 32B"}
    assert any(r.held_out for r in P.ROWS)
    v5p = P.BY_NAME["v5p-128 32B"]
    assert v5p.ici == (1, 16, 4) and v5p.global_batch == 512 and P.REMAT[v5p.remat] == "dots_no_batch"


def test_maxtext_minimal_is_our_dots_no_batch():
    """MaxText 2023 'minimal' = jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims."""
    assert remat.policy(P.REMAT["minimal"]) is jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims
    assert remat.policy(P.REMAT["full"]) is jax.checkpoint_policies.nothing_saveable


def test_conversion_by_hand_v4_22b_six_n_only():
    """2023-04 formula: 6 N S per row, N all parameters (tied embedding once, one norm per layer)."""
    row = P.BY_NAME["v4-128 22B"]
    d, L, H, Dh, ff, V, S = 6144, 48, 24, 256, 24576, 32768, 1024
    matmul = L * (4 * d * H * Dh + 2 * d * ff) + V * d
    assert matmul == 21_944_598_528
    n_maxtext = matmul + L * d + d
    assert P.maxtext_params(row) == n_maxtext
    assert P.maxtext_flops_per_row(row) == 6 * n_maxtext * S
    ours = 6 * matmul * S + 6 * S * S * H * Dh * L  # causal attention at half, x3 for training
    assert P.our_flops_per_row(row) == ours
    assert P.conversion(row) == pytest.approx(1.013748, abs=2e-6)
    assert P.converted_mfu(row) == pytest.approx(0.567 * 1.013748, abs=1e-6)


def test_conversion_by_hand_v5e_16b_full_attention():
    """2023-06..11 formula: attention counted in full (twice ours)."""
    row = P.BY_NAME["v5e-256 16B"]
    matmul, attn = 16_273_899_520, 2048 * 32 * 256 * 32  # per-token weights; S H Dh L
    n_maxtext = matmul + 32 * 5120 + 5120
    assert P.conversion(row) == pytest.approx((matmul + attn) / (n_maxtext + 2 * attn), rel=1e-12)
    assert P.conversion(row) == pytest.approx(0.969043, abs=2e-6)
    assert P.converted_mfu(row) == pytest.approx(0.5921, abs=1e-4)


def test_causal_formula_is_ours_up_to_norm_scales():
    for row in P.ROWS:
        if row.formula == "6N+causal":
            assert P.conversion(row) == pytest.approx(1.0, abs=2e-5)
        if row.formula == "6N+attn":  # ours counts less: attention at half
            assert P.conversion(row) < 1.0
        if row.formula == "6N":
            assert P.conversion(row) > 1.0


def test_implied_step_time_is_the_published_throughput():
    for row in P.ROWS:
        t = P.maxtext_flops_per_row(row) * row.maxtext_per_device_batch / (row.tflops * 1e12)
        assert P.published_step_time(row) == pytest.approx(t, rel=5e-3), row.name


@pytest.mark.parametrize("row", P.ROWS, ids=lambda r: r.name)
def test_generated_space_is_the_published_config(row, tmp_path):
    path = tmp_path / "space.py"
    path.write_text(B.space_text(row, 600))
    space = load_space(str(path))
    assert space.size() == 1 and space.settings.target == row.target
    (point,) = list(space.points())
    cfg = configio.build(space.config(point))
    assert cfg.model.attention == P.ATTENTION[row.attention]
    assert {**cfg.model.__dict__, "attention": "auto"} == presets.get(row.preset).__dict__
    assert cfg.mesh.ici == row.ici and cfg.global_batch == row.global_batch and cfg.per_device_batch is None
    assert cfg.remat == P.REMAT[row.remat]
    assert cfg.flags == row.flags == {"v5e": "collective_fusion", "v5p": "v5p_collectives"}.get(row.chip, "default")
    assert cfg.mesh.rules == ("sequence_parallel" if row.ici[2] > 1 else "default")  # MaxText: embed over tensor


def _result(mfu, fits=True, peak=10 * 2 ** 30):
    roof = {"compute_s": 1.0, "memory_s": 0.5, "roofline_s": 1.2, "comm_s": 2.0, "exposed_comm_s": 0.3}
    return {"plan": {"predicted_mfu": mfu, "fits": fits, "peak_bytes": peak, "hbm_bytes": 16 * 2 ** 30,
                     "predicted_step_time": 9.0, "roofline": roof}, "failure_kind": None}


def test_report_ratio_fit_and_ranking():
    a, b = P.BY_NAME["v5e-256 16B"], P.BY_NAME["v5e-256 32B"]
    rows = [a, b]
    same = B.report(rows, {a.name: _result(P.converted_mfu(a) * 1.05), b.name: _result(P.converted_mfu(b))})
    assert "| 1.05 |" in same and "| 1.00 |" in same and "(same order over 2 planned rows)" in same
    assert "0.9-1.1 for 2 of 2 planned rows; predicted to fit: 2 of 2" in same
    # 16B predicted above 32B: published has 32B first, so the order differs
    swapped = B.report(rows, {a.name: _result(0.9), b.name: _result(0.5, fits=False)})
    assert "DIFFERENT order" in swapped and "**no**" in swapped and "predicted to fit: 1 of 2" in swapped
    oom = {"plan": {"peak_bytes": 97 * 2 ** 30, "hbm_bytes": 95 * 2 ** 30}, "failure_kind": "predicted_oom",
           "failure_message": "predicted OOM"}
    over = B.report(rows, {a.name: oom, b.name: _result(0.6)})
    assert "**no** (97.0 / 95.0)" in over and "predicted to fit: 1 of 2" in over
    missing = B.report(rows, {a.name: {"plan": None, "failure_kind": "compile_error", "failure_message": "boom"}})
    assert "compile_error: boom" in missing and "not run" in missing

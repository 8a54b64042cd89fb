"""benchmarks/published.py (MaxText's published throughput, with sources) and the pieces of
benchmarks/bench_published.py that need no compile: the FLOP conversion checked by hand, the
generated space of every row, the report's ratio and ranking."""
from __future__ import annotations

import dataclasses
import re

import jax
import pytest

from paxsearch.benchmarks import bench_published, published
from paxsearch.search.planning.targets import parse_target
from paxsearch.search.study import configio
from paxsearch.search.study.space import load_space
from paxsearch.trainer import flops, presets, remat

HASH = re.compile(r"@[0-9a-f]{40}\b")


@pytest.mark.parametrize("row", published.ROWS, ids=lambda r: r.name)
def test_every_row_is_traced_to_a_commit_and_a_config(row):
    assert row.published_in.startswith("google/maxtext ") and HASH.search(row.published_in), row.published_in
    assert row.config.startswith("google/maxtext ") and HASH.search(row.config), row.config
    assert row.formula in published.FORMULAS and row.remat in published.REMAT and row.attention in published.ATTENTION
    target = parse_target(row.target)
    assert target.num_devices == row.chips * row.slices and row.chips == row.ici[0] * row.ici[1] * row.ici[2]
    assert target.num_slices == row.slices and (row.slices == 1 or row.held_out)
    assert target.chip == row.chip
    p = presets.source(row.preset)  # a preset of the exact dims, with its own source
    assert p.model.vocab_size == 32768 and p.model.mlp == "dense" and p.model.activation == "relu"
    assert p.model.tie_embeddings and p.model.position == "rope" and p.model.n_kv_heads is None
    assert p.model.head_dim == 256
    # the published MFU is the published TFLOP/s over the chip's peak (integer TFLOP/s: 0.5%)
    assert published.PEAK_TFLOPS[row.chip] * 1e12 == flops.PEAK_BF16_FLOPS[f"tpu {row.chip}"]
    assert row.tflops / published.PEAK_TFLOPS[row.chip] == pytest.approx(row.mfu, rel=5e-3)


def test_the_four_configs_of_the_issue_are_the_calibration_rows():
    calibration = {r.name for r in published.ROWS if not r.held_out}
    assert calibration == {"v5e-256 16B", "v5e-256 32B", "v4-128 22B", "v5p-128 32B"}
    assert any(r.held_out for r in published.ROWS)
    v5p = published.BY_NAME["v5p-128 32B"]
    assert v5p.ici == (1, 16, 4) and v5p.global_batch == 512 and published.REMAT[v5p.remat] == "dots_no_batch"


def test_maxtext_minimal_is_our_dots_no_batch():
    """MaxText 2023 'minimal' = jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims."""
    assert remat.policy(published.REMAT["minimal"]) is jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims
    assert remat.policy(published.REMAT["full"]) is jax.checkpoint_policies.nothing_saveable


def test_conversion_by_hand_v4_22b_six_n_only():
    """2023-04 formula: 6 N S per row, N all parameters (tied embedding once, one norm per layer)."""
    row = published.BY_NAME["v4-128 22B"]
    d, L, H, Dh, ff, V, S = 6144, 48, 24, 256, 24576, 32768, 1024
    matmul = L * (4 * d * H * Dh + 2 * d * ff) + V * d
    assert matmul == 21_944_598_528
    n_maxtext = matmul + L * d + d
    assert published.maxtext_params(row) == n_maxtext
    assert published.maxtext_flops_per_row(row) == 6 * n_maxtext * S
    ours = 6 * matmul * S + 6 * S * S * H * Dh * L  # causal attention at half, x3 for training
    assert published.our_flops_per_row(row) == ours
    assert published.conversion(row) == pytest.approx(1.013748, abs=2e-6)
    assert published.converted_mfu(row) == pytest.approx(0.567 * 1.013748, abs=1e-6)


def test_conversion_by_hand_v5e_16b_full_attention():
    """2023-06..11 formula: attention counted in full (twice ours)."""
    row = published.BY_NAME["v5e-256 16B"]
    matmul, attn = 16_273_899_520, 2048 * 32 * 256 * 32  # per-token weights; S H Dh L
    n_maxtext = matmul + 32 * 5120 + 5120
    assert published.conversion(row) == pytest.approx((matmul + attn) / (n_maxtext + 2 * attn), rel=1e-12)
    assert published.conversion(row) == pytest.approx(0.969043, abs=2e-6)
    assert published.converted_mfu(row) == pytest.approx(0.5921, abs=1e-4)


def test_causal_formula_is_ours_up_to_norm_scales():
    for row in published.ROWS:
        if row.formula == "6N+causal":
            assert published.conversion(row) == pytest.approx(1.0, abs=2e-5)
        if row.formula == "6N+attn":  # ours counts less: attention at half
            assert published.conversion(row) < 1.0
        if row.formula == "6N":
            assert published.conversion(row) > 1.0


def test_implied_step_time_is_the_published_throughput():
    for row in published.ROWS:
        t = published.maxtext_flops_per_row(row) * row.maxtext_per_device_batch / (row.tflops * 1e12)
        assert published.published_step_time(row) == pytest.approx(t, rel=5e-3), row.name


@pytest.mark.parametrize("row", published.ROWS, ids=lambda r: r.name)
def test_generated_space_is_the_published_config(row, tmp_path):
    path = tmp_path / "space.py"
    path.write_text(bench_published.space_text(row, 600))
    space = load_space(str(path))
    assert space.size() == 1 and space.settings.target == row.target
    (point,) = list(space.points())
    cfg = configio.build(space.config(point))
    assert cfg.model.attention == published.ATTENTION[row.attention]
    assert {**cfg.model.__dict__, "attention": "auto"} == presets.get(row.preset).__dict__
    assert cfg.mesh.ici == row.ici and cfg.global_batch == row.global_batch and cfg.per_device_batch is None
    assert cfg.mesh.dcn == (row.slices, 1, 1)  # MaxText's dcn_data_parallelism -1: data parallel across slices
    assert cfg.remat == published.REMAT[row.remat]
    assert cfg.flags == row.flags == {"v5e": "collective_fusion", "v5p": "v5p_collectives"}.get(row.chip, "default")
    assert cfg.mesh.rules == ("sequence_parallel" if row.ici[2] > 1 else "default")  # MaxText: embed over tensor


def _result(mfu, fits=True, peak=10 * 2 ** 30):
    roof = {"compute_s": 1.0, "memory_s": 0.5, "roofline_s": 1.2, "comm_s": 2.0, "exposed_comm_s": 0.3}
    return {"plan": {"predicted_mfu": mfu, "fits": fits, "peak_bytes": peak, "hbm_bytes": 16 * 2 ** 30,
                     "predicted_step_time": 9.0, "roofline": roof}, "failure_kind": None}


def test_report_ratio_fit_and_ranking():
    a, b = published.BY_NAME["v5e-256 16B"], published.BY_NAME["v5e-256 32B"]
    rows = [a, b]
    same = bench_published.report(rows, {a.name: _result(published.converted_mfu(a) * 1.05),
                                         b.name: _result(published.converted_mfu(b))})
    assert "| 1.05 |" in same and "| 1.00 |" in same and "(same order over 2 planned rows)" in same
    assert "0.9-1.1 for 2 of 2 planned rows; predicted to fit: 2 of 2" in same
    # 16B predicted above 32B: published has 32B first, so the order differs
    swapped = bench_published.report(rows, {a.name: _result(0.9), b.name: _result(0.5, fits=False)})
    assert "DIFFERENT order" in swapped and "**no**" in swapped and "predicted to fit: 1 of 2" in swapped
    # the two published MFUs are 9% apart: a pair beyond the figures' repeatability, ordered or not
    assert "Pairs (calibration) ordered as published: 1 of 1; of the pairs more than 5% apart published: 1 of 1" \
        in same
    assert "Pairs (calibration) ordered as published: 0 of 1; of the pairs more than 5% apart published: 0 of 1" \
        in swapped
    close = bench_published._pairs_line("x", [(0.60, 0.50), (0.62, 0.40), (0.70, 0.80)])  # 0.60 / 0.62: 3% apart
    assert close == "Pairs (x) ordered as published: 2 of 3; of the pairs more than 5% apart published: 2 of 2"
    oom = {"plan": {"peak_bytes": 97 * 2 ** 30, "hbm_bytes": 95 * 2 ** 30}, "failure_kind": "predicted_oom",
           "failure_message": "predicted OOM"}
    over = bench_published.report(rows, {a.name: oom, b.name: _result(0.6)})
    assert "**no** (97.0 / 95.0)" in over and "predicted to fit: 1 of 2" in over
    missing = bench_published.report(
        rows, {a.name: {"plan": None, "failure_kind": "compile_error", "failure_message": "boom"}})
    assert "compile_error: boom" in missing and "not run" in missing


def test_report_prices_the_published_cost_of_a_second_slice_in_dcn_bandwidth():
    """A multi-slice row does the same work per chip as its one-slice row, so the published step's
    extra seconds are what the slices cost; the report sets them against the bytes each chip sends
    over DCN in the plan (ICI transfers not counted) and the hardware table's DCN share."""
    one, two = published.BY_NAME["v5p-128 32B"], published.BY_NAME["2x v5p-128 32B"]
    dcn = _result(0.7)
    dcn["plan"]["roofline"]["collectives"] = [
        {"link": "dcn", "bytes": 0.75e9, "seconds": 0.12, "exposed_seconds": 0.01},
        {"link": "dcn", "bytes": 0.25e9, "seconds": 0.04, "exposed_seconds": 0.0},
        {"link": "ici", "bytes": 9e9, "seconds": 1.0, "exposed_seconds": 0.5}]
    text = bench_published.report([one, two], {one.name: _result(0.7), two.name: dcn})
    extra = published.published_step_time(two) - published.published_step_time(one)
    assert extra > 0  # published: 71.47% on one slice, 69.43% on two
    assert (f"| 2x v5p-128 32B | +{extra:.2f} | 1.000 | {1.0 / extra:.2f} | 6.25 | 0.160 / 0.010 |") in text
    # no DCN transfer in the plan: the bandwidth is not made up
    assert "| 2x v5p-128 32B | " + f"+{extra:.2f} | - | - | 6.25 | - / - |" in bench_published.report(
        [one, two], {one.name: _result(0.7), two.name: _result(0.7)})


def test_the_published_programs_attention_work():
    """The 2023 v5e programs computed every S x S block (flash_attention causal=False): the blocks
    our causal splash kernels skip, 6 of 16 at S 2048 and block 512, priced at the planner's splash
    rate on v5e, are added to our step for the comparison; a causal row adds nothing."""
    from paxsearch.trainer import hardware

    v5e = [r for r in published.ROWS if not r.causal_attention]
    one_slice = {"v5e-256 16B", "v5e-256 32B", "v5e-256 64B", "v5e-256 128B"}
    assert {r.name for r in v5e} == one_slice | {f"{n}x {name}" for n in (2, 4, 8, 16) for name in one_slice}
    assert all(r.note == published.V5E_2023_ATTENTION for r in v5e)
    # 16B by hand: 32 layers x 32 heads x 6 rows per chip x 11 S x S matmuls x 2 S^2 x 256, 6 of 16 blocks
    r16 = published.BY_NAME["v5e-256 16B"]
    assert published.noncausal_extra_flops_per_chip(r16) == pytest.approx(
        32 * 32 * 6 * 11 * 2 * 2048 ** 2 * 256 * 6 / 16)
    # 128B: fsdp 16 x tensor 16, so 16 rows and 4 heads a chip, 64 layers: the same work per chip as 32B's
    assert published.noncausal_extra_flops_per_chip(published.BY_NAME["v5e-256 128B"]) == pytest.approx(
        published.noncausal_extra_flops_per_chip(published.BY_NAME["v5e-256 32B"]))
    assert (published.noncausal_extra_flops_per_chip(published.BY_NAME["4x v5e-256 16B"])
            == published.noncausal_extra_flops_per_chip(r16))
    spec = hardware.spec("v5e")
    assert published.noncausal_extra_seconds(r16) == pytest.approx(
        published.noncausal_extra_flops_per_chip(r16) / (197e12 * spec.attention_efficiency.value))
    assert published.noncausal_extra_flops_per_chip(published.BY_NAME["v4-128 22B"]) == 0.0
    with pytest.raises(ValueError, match="remat 'full' only"):
        published.noncausal_extra_flops_per_chip(dataclasses.replace(r16, remat="minimal"))
    text = bench_published.report([r16], {r16.name: _result(published.converted_mfu(r16) * 1.14)})
    extra = published.noncausal_extra_seconds(r16)
    assert f"| 1.14 | +{extra:.2f}, {1.14 * 9.0 / (9.0 + extra):.2f} |" in text
    assert "Mean |predicted / published - 1| (calibration, 1 rows): 14.0% (max 14.0%); with the published " \
           f"programs' work {abs(1.14 * 9.0 / (9.0 + extra) - 1):.1%}" in text


# ---- MaxText's 2025 recipes (published.RECIPES): traced, their figures consistent, the nearest config valid


def test_the_four_recipes_of_the_issue_and_one_held_out():
    assert set(published.RECIPES_BY_NAME) == {"v6e-256 Llama3.1-8B", "v6e-256 Llama3.1-70B", "v6e-256 Llama2-70B",
                                      "v5p-1024 Llama2-70B", "v6e-8 Llama3.1-8B"}
    assert {r.name: r.mfu for r in published.RECIPES} == {"v6e-256 Llama3.1-8B": 0.4546, "v6e-256 Llama3.1-70B": 0.5033,
                                                  "v6e-256 Llama2-70B": 0.438, "v5p-1024 Llama2-70B": 0.654,
                                                  "v6e-8 Llama3.1-8B": 0.4504}  # the last: held out (its note)


def test_v6e_peak_is_the_hardware_tables():
    assert published.PEAK_TFLOPS["v6e"] * 1e12 == flops.PEAK_BF16_FLOPS["tpu v6e"]


@pytest.mark.parametrize("r", published.RECIPES, ids=lambda r: r.name)
def test_every_recipe_is_traced_and_every_knob_mapped_or_a_named_gap(r):
    assert r.published_in.startswith((published.MX, published.TPU_RECIPES)) and HASH.search(r.published_in), \
        r.published_in
    assert r.config.startswith(published.MX) and HASH.search(r.config), r.config
    assert r.formula in published.RECIPE_FORMULAS and HASH.search(published.RECIPE_FORMULAS[r.formula])
    target = parse_target(r.target)
    assert target.num_devices == r.chips == r.ici[0] * r.ici[1] * r.ici[2] and target.chip == r.chip
    knobs = {k: (v, ours) for k, v, ours in r.knobs}
    assert all(ours for _, ours in knobs.values())
    assert knobs["max_target_length"][0] == str(presets.get(r.preset).seq_len)
    assert knobs["per_device_batch_size"][0] == str(r.maxtext_per_device_batch)
    assert f"global_batch={r.global_batch}" in knobs["per_device_batch_size"][1]
    assert r.gaps and all(": " in g for g in r.gaps)  # each gap names the knob, its value and why
    assert any(k.startswith("remat_policy") for k in knobs)
    if r.remat.startswith(remat.CUSTOM):  # the custom policy names exactly the tensors the recipe names
        chosen = {t for t, c in remat.parse_custom(r.remat).items() if c != "recompute"}
        assert chosen and all(t in str(r.knobs) for t in chosen), chosen


@pytest.mark.parametrize("r", published.RECIPES, ids=lambda r: r.name)
def test_published_mfu_and_tokens_per_s_agree_under_the_recipes_formula(r):
    """MFU x peak / (tokens/s) is MaxText's FLOPs per token under the stated formula: to 0.05% where a
    log line is quoted, to 1.5% for tiering.md's approximate tokens/s; and the log's TFLOP/s is the MFU."""
    ratio = published.recipe_implied_flops_per_token(r) / published.recipe_maxtext_flops_per_token(r)
    assert ratio == pytest.approx(1.0, abs=5e-4 if r.tflops else 1.5e-2), ratio
    if r.tflops:
        assert r.tflops / published.PEAK_TFLOPS[r.chip] == pytest.approx(r.mfu, abs=5e-4)  # MFU rounded to 0.1 point
        assert r.tflops * 1e12 / r.tokens_per_s == pytest.approx(published.recipe_maxtext_flops_per_token(r), rel=1e-5)
    other = "matmul+causal" if r.formula == "matmul+attn" else "matmul+attn"
    wrong = published.recipe_implied_flops_per_token(r) / published.recipe_maxtext_flops_per_token(
        published.Recipe(**{**r.__dict__, "formula": other}))
    assert abs(wrong - 1) > abs(ratio - 1)  # the stated formula fits better than the other


def test_recipe_conversion_by_hand_llama31_8b():
    """Full attention in MaxText's figure: ours / theirs = (6 W + 6 H Dh L S) / (6 W + 12 H Dh L S)."""
    r = published.RECIPES_BY_NAME["v6e-256 Llama3.1-8B"]
    d, L, H, K, Dh, F, V, S = 4096, 32, 32, 8, 128, 14336, 128256, 8192
    w = L * (d * (2 * H + 2 * K) * Dh + 3 * d * F) + V * d  # matmul weights, the unembedding included
    assert published.recipe_maxtext_flops_per_token(r) == 6 * w + 12 * H * Dh * L * S
    assert published.recipe_our_flops_per_token(r) == pytest.approx(6 * w + 6 * H * Dh * L * S, rel=1e-12)
    assert published.recipe_conversion(r) == pytest.approx((6 * w + 6 * H * Dh * L * S) / (6 * w + 12 * H * Dh * L * S))
    assert published.recipe_converted_mfu(r) == pytest.approx(0.4546 * 0.8888, abs=1e-4)
    causal = published.RECIPES_BY_NAME["v5p-1024 Llama2-70B"]  # after the causal halving: our convention exactly
    assert published.recipe_conversion(causal) == pytest.approx(1.0, rel=1e-12)


@pytest.mark.parametrize("r", published.RECIPES, ids=lambda r: r.name)
def test_nearest_config_of_each_recipe_passes_the_static_checks_on_its_slice(r):
    from paxsearch.trainer import validate

    cfg = published.recipe_config(r)
    validate.check(cfg, r.chips, "tpu", chip=r.chip)  # mesh = chips, batch divides, remat, flag set on the chip
    assert cfg.model == presets.get(r.preset).__class__(**{**presets.get(r.preset).__dict__, "attention": "flash"})
    assert cfg.global_batch == r.global_batch and cfg.mesh.ici == r.ici and cfg.remat == r.remat
    assert remat.offloads(cfg.remat) == any("offload" in value for _, value, _ in r.knobs)
    table = published.recipes_table()
    assert f"| {r.name} |" in table and f"{published.recipe_converted_mfu(r):.2%}" in table


@pytest.mark.parametrize("row", published.GPU_ROWS, ids=lambda r: r.name)
def test_gpu_row_is_traced_and_converted(row):
    assert row.published_in.startswith("AI-Hypercomputer/maxtext ") and HASH.search(row.published_in)
    assert row.config.startswith("AI-Hypercomputer/maxtext ") and HASH.search(row.config)
    target = parse_target(row.target)
    assert target.platform == "gpu" and target.chip == row.chip and target.num_devices == row.gpus
    assert row.ici[0] * row.ici[1] * row.ici[2] == row.gpus and remat.parse_custom(row.remat)
    m = presets.get(row.preset)
    # MaxText's 6 N S counts both Llama2 embedding tables; ours counts the unembedding matmul only
    n, s = flops.param_count(m), m.seq_len
    assert published.gpu_maxtext_flops_per_row(row) == 6 * n * s + 6 * m.n_heads * m.n_layers * m.head_dim * s * s
    assert 0.97 < published.gpu_conversion(row) < 1.0
    # 492 TFLOP/s of 989: 49.7% in MaxText's count, 48.8% in ours; 1.45 s a step
    assert published.gpu_converted_mfu(row) == pytest.approx(row.tflops / 989 * published.gpu_conversion(row))
    assert published.gpu_step_time(row) == pytest.approx(published.gpu_maxtext_flops_per_row(row) * 4 / 492e12)


# ------------------------------------------------------------------ the mixture-of-experts rows (issue 43)
PLANNED_MOE = [r for r in published.MOE_ROWS if r.planned]


def test_the_four_moe_runs_of_the_issue():
    assert [(r.chip, r.chips, r.tflops) for r in published.MOE_ROWS] == [
        ("v5p", 64, 251.94), ("v6e", 256, 302.311), ("v6e", 256, 332.463), ("v5p", 512, 152.415)]
    assert published.moe_published_mfu(published.MOE_ROWS[0]) == 0.5489  # stated: 251.94 / 459 = 54.89%
    assert 251.94 / published.PEAK_TFLOPS["v5p"] == pytest.approx(0.5489, abs=5e-5)


@pytest.mark.parametrize("r", published.MOE_ROWS, ids=lambda r: r.name)
def test_every_moe_row_is_traced_and_every_knob_mapped_or_a_named_gap(r):
    assert HASH.search(r.published_in) and HASH.search(r.config), r.name
    assert parse_target(r.target).num_devices == r.chips and parse_target(r.target).chip == r.chip
    assert all(len(k) == 3 and k[2] for k in r.knobs)
    assert r.planned and published.moe_config(r).model.n_experts  # every MoE row of the issue is planned now


def test_a_moe_row_without_a_preset_says_why_and_gives_no_config():
    """A published run whose model no preset expresses (as DeepSeek V3 was before MLA) stays in the table,
    unplanned, with its reason."""
    r = dataclasses.replace(published.MOE_ROWS[-1], preset=None, planned=False,
                            note="Not planned: its attention is not expressible")
    with pytest.raises(ValueError, match="no preset"):
        published.moe_config(r)


@pytest.mark.parametrize("r", [r for r in PLANNED_MOE if r.step_s], ids=lambda r: r.name)
def test_maxtexts_moe_formula_gives_the_published_tflops_from_the_log_lines_step(r):
    """TFLOP/s x seconds = MaxText's FLOPs per chip and step (the run's dims: 8x22B's vocabulary is 32768; with the
    preset's 32000 it would be 1e-4 off, beyond the log line's rounding)."""
    per_chip = published.moe_maxtext_flops_per_token(r) * r.maxtext_per_device_batch * r.seq_len
    assert per_chip / r.step_s / 1e12 == pytest.approx(r.tflops, rel=3e-5)


def test_moe_conversion_by_hand_mixtral_8x7b():
    """Ours = MaxText's less half the attention (6 H Dh L S per token); the router and the top-2 experts in both."""
    r = published.MOE_BY_NAME["v6e-256 Mixtral-8x7B dropped"]
    d, h, kv, dh, f, v, s, layers = 4096, 32, 8, 128, 14336, 32000, 4096, 32
    per_layer = 2 * d * (h + 2 * kv) * dh + 2 * d * h * dh + 2 * d * 8 + 2 * 3 * 2 * d * f
    maxtext = 3 * (layers * per_layer + 2 * d * v) + 12 * h * dh * layers * s
    assert published.moe_maxtext_flops_per_token(r) == maxtext
    assert published.moe_our_flops_per_token(r) == maxtext - 6 * h * dh * layers * s
    assert published.moe_converted_mfu(r) == pytest.approx(302.311 / 918 * (1 - 6 * h * dh * layers * s / maxtext))


@pytest.mark.parametrize("r", PLANNED_MOE, ids=lambda r: r.name)
def test_the_generated_moe_space_is_the_rows_config_and_passes_the_static_checks(r, tmp_path):
    from paxsearch.trainer import validate

    path = tmp_path / "space.py"
    path.write_text(bench_published.moe_space_text(r, 600))
    space = load_space(str(path))
    assert space.size() == 1 and space.settings.target == r.target
    (point,) = list(space.points())
    cfg = configio.build(space.config(point))
    want = published.moe_config(r)  # the space's own optimizer aside (no model FLOPs, no memory of its own)
    assert (cfg.model, cfg.mesh, cfg.remat, cfg.flags) == (want.model, want.mesh, want.remat, want.flags)
    assert cfg.model.expert_compute == r.expert_compute and cfg.model.capacity_factor == r.capacity_factor
    assert cfg.global_batch == r.maxtext_per_device_batch * r.chips and cfg.remat == r.remat
    validate.check(cfg, r.chips, "tpu", chip=r.chip)
    assert remat.offloads(cfg.remat) == any("offload" in value for _, value, _ in r.knobs)


def test_moe_conversion_by_hand_deepseek_v3():
    """MaxText's count at the DeepSeek row's commit (calculate_mla_tflops_per_device, the deepseek decoder block's
    dense and MoE layers, attention halved) by hand: it is ours (conversion 1), and with the log line's 90.668 s
    it gives the published 152.415 TFLOP/s."""
    r = published.MOE_BY_NAME["v5p-1024 DeepSeek-V3-671B"]
    d, h, v, s, layers, dense = 7168, 128, 129280, 8192, 61, 3
    q = 2 * (d * 1536 + 1536 * h * 192)
    kv = 2 * (d * (512 + 64) + 512 * h * (128 + 128))
    out = 2 * d * h * 128
    ffn = dense * 3 * 2 * d * 18432 + (layers - dense) * (2 * d * 256 + (1 + 8) * 3 * 2 * d * 2048)
    maxtext = 3 * (ffn + (q + kv + out) * layers + 2 * d * v) + 3 * layers * 2 * s * h * (192 + 128) / 2
    assert published.moe_maxtext_flops_per_token(r) == maxtext
    assert published.moe_our_flops_per_token(r) == maxtext and published.moe_conversion(r) == 1.0
    assert maxtext * 6 * s / 90.668 / 1e12 == pytest.approx(152.415, rel=3e-5)
    assert published.moe_model(r).seq_len == 8192 and published.moe_model(r).attention_type == "mla"


def test_moe_report_ratio_and_a_row_not_run():
    r = published.MOE_BY_NAME["v6e-256 Mixtral-8x7B dropped"]
    pub = published.moe_converted_mfu(r)
    text = bench_published.moe_report(published.MOE_ROWS, {r.name: _result(pub * 1.05)})
    assert f"| {r.name} | {pub:.2%} | {pub * 1.05:.2%} | 1.05 | fits" in text
    assert "| v5p-1024 DeepSeek-V3-671B | 33.21% | - |" in text and "not run |" in text
    assert "Goal: predicted / published in 0.9-1.1 for 1 of 1 planned MoE rows." in text


def test_the_gpu_rows_plan_through_the_one_script(capsys):
    """bench_published.py --gpu (was bench_gpu_published.py): each GPU row planned on its node (analytic
    here, without the CUDA plugin), one JSON line with the ratio to the published MFU."""
    import json

    assert bench_published.main(["--gpu"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [x["row"] for x in lines] == [r.name for r in published.GPU_ROWS]
    for x in lines:
        assert x["predicted_over_published"] == pytest.approx(x["predicted_mfu"] / x["published_mfu_ours"], rel=1e-3)
    with pytest.raises(SystemExit):
        bench_published.main(["--gpu", "--moe"])
    with pytest.raises(SystemExit):
        bench_published.main(["--target", "gpu:h200x8"])

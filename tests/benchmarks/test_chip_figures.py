"""benchmarks/chip_figures.py and chip_profile.py, the chip's own figures: their FLOP formulas
against the roofline's, and their JSON from a CPU run (--tiny; the full runs are for one TPU v5e)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from paxsearch.benchmarks import chip_figures, chip_profile
from paxsearch.search.planning.roofline import cost

from ..search_util import REPO


def _run(script: str, out, *args: str, timeout: int = 600) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split() if "device_count" not in f)
    proc = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", script), "--tiny", "--out", str(out),
                           *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    name = chip_figures.OUT_FILE if script == "chip_figures.py" else chip_profile.OUT_FILE
    assert [f for f in os.listdir(out) if not f.endswith((".hlo.txt.gz", ".ops.json"))] == [name]  # one JSON
    with open(os.path.join(out, name)) as f:
        return json.load(f)


def test_matmul_and_attention_flops():
    assert chip_figures.matmul_flops(8192, 8192, 8192) == 2 * 8192 ** 3
    assert chip_figures.matmul_flops(2048, 128, 2048, batch=16) == 16 * 2 * 2048 * 128 * 2048
    # the model's count: QK^T and PV, causal at half, training 3 x forward
    fwd = chip_figures.attention_model_flops(2, 8, 2048, 128, backward=False)
    assert fwd == 4 * 2 * 8 * 2048 ** 2 * 128 / 2
    assert chip_figures.attention_model_flops(2, 8, 2048, 128, backward=True) == 3 * fwd
    assert chip_figures.attention_model_flops(2, 8, 2048, 128, backward=False, causal=False) == 2 * fwd
    assert chip_figures.efficiency(197e12, 1.0, 197e12) == 1.0 and chip_figures.efficiency(1.0, None, 1.0) is None


def test_splash_kernel_flops_are_the_roofline_count():
    """The kernels' FLOPs as cost.splash_flops counts them: 2 (forward) and 4 + 3 (backward) S x S
    matmuls per head over the causal blocks, (n + 1) / 2n for n = S / block."""
    counts = dict(cost.SPLASH_MATMULS)
    assert chip_figures.splash_kernel_matmuls(False) == counts["splash_mha_fwd"] == 2
    assert chip_figures.splash_kernel_matmuls(True) == 2 + 4 + 3
    b, h, s, d = 1, 8, 4096, 128
    n = s // 512
    assert chip_figures.splash_kernel_flops(b, h, s, d, 512, backward=False) == pytest.approx(
        2 * 2 * s * s * d * h * (n + 1) / (2 * n))
    # at block 128 more of the diagonal blocks are skipped: fewer FLOPs than at 512, more than half
    small = chip_figures.splash_kernel_flops(b, h, s, d, 128, backward=True)
    assert 9 * 2 * s * s * d * h / 2 < small < chip_figures.splash_kernel_flops(b, h, s, d, 512, backward=True)
    assert chip_figures.splash_kernel_flops(b, h, s, d, 512, matmuls=3) == pytest.approx(
        1.5 * chip_figures.splash_kernel_flops(b, h, s, d, 512, backward=False))


def test_the_chip_sets_cover_the_issues_shapes():
    mm = chip_figures.matmul_cases(tiny=False)
    ids = {c.id for c in mm}
    assert len(ids) == len(mm)
    assert {"mm_square_8192x8192x8192", "mm_up_16384x4096x16384", "mm_up_2048x1024x4096",
            "mm_vocab_8192x1024x32000"} <= ids
    assert all(c.flops == chip_figures.matmul_flops(c.params["m"], c.params["k"], c.params["n"],
                                                    c.params.get("batch", 1))
               for c in mm)
    hbm = chip_figures.hbm_cases(tiny=False)
    kinds = {c.params["kind"] for c in hbm}
    assert {"add", "reduce_sum_to_f32", "transpose", "copy", "convert_bf16_to_f32", "convert_f32_to_bf16"} <= kinds
    for c in hbm:  # bytes = operands + result; `mib`: the bf16 input's MiB, each read at least once
        assert c.bytes >= c.params["mib"] * 2 ** 20


def test_overhead_and_host_sections_write_one_json(tmp_path):
    doc = _run("chip_figures.py", tmp_path, "--sections", "overhead,host")
    assert doc["tiny"] and doc["environment"]["platform"] == "cpu" and doc["peak_flops"] > 0
    over = {c["id"]: c for c in doc["sections"]["overhead"]["cases"]}
    assert {"back_to_back", "blocked_each", "donated_back_to_back", "tree64_donated_back_to_back"} <= set(over)
    assert all(c["per_call_s"] > 0 for c in over.values())
    host = doc["sections"]["host"]
    paths = {c["path"] for c in host["cases"] if "error" not in c}
    assert {"numpy_to_device", "device_to_numpy"} <= paths
    assert all(c["gb_per_s_best"] > 0 for c in host["cases"] if "error" not in c)


def test_index_cases_and_gqa_splash_cases(tmp_path):
    """The index section's cases (row gathers, scatters, scatter-adds and ragged dots) run, and the splash
    section takes GQA shapes (K/V with fewer heads) and other batch x seq totals."""
    full = chip_figures.index_cases(tiny=False)
    assert len(full) == 48 and len({c.id for c in full}) == 48
    kinds = {c.params["kind"] for c in full}
    assert kinds == {"gather", "scatter", "scatter_add", "ragged_dot"}
    assert {c.params["row_bytes"] for c in full if c.params["kind"] != "ragged_dot"} == {512, 1024, 2048, 4096, 8192,
                                                                                       16384}
    gqa = chip_figures.splash_cases(False, True, tokens=32768, seqs=(2048,), head_dims=(64,), heads=(12,),
                                    kv_heads=(4, 5, 0), blocks=(512,))
    assert [c.id for c in gqa] == ["splash_fwd_s2048_h12_b512_d64_kv4", "splash_fwd_bwd_s2048_h12_b512_d64_kv4",
                                   "splash_fwd_s2048_h12_b512_d64", "splash_fwd_bwd_s2048_h12_b512_d64"]
    assert gqa[0].shapes[1].shape == (16, 4, 2048, 64) and gqa[0].params["kv_heads"] == 4  # 5 does not divide 12
    narrow = chip_figures.index_cases(tiny=False, rows=(32768,), widths=(64, 128), ragged=False)
    assert {c.params["row_bytes"] for c in narrow} == {128, 256, 512} and len(narrow) == 12
    doc = _run("chip_figures.py", tmp_path, "--sections", "index,gmm,proj")
    cases = doc["sections"]["index"]["cases"]
    assert {c["kind"] for c in cases} == kinds and all("error" not in c and c["device_s"] > 0 for c in cases)
    # grouped matmuls two ways (the megablox kernel interpreted on the CPU), forward and with the backward
    gmm = doc["sections"]["gmm"]["cases"]
    assert {(c["kind"], c["pass_"]) for c in gmm} == {(k, p) for k in ("ragged_dot", "megablox")
                                                      for p in ("fwd", "fwd_bwd")}
    assert all("error" not in c and c["device_s"] > 0 for c in gmm)
    # the attention projections per head dim, beside the same FLOPs as one plain matmul
    proj = doc["sections"]["proj"]["cases"]
    assert {(c["kind"], c["pass_"]) for c in proj} == {(f"projection {k}", p) for k in ("q", "out", "flat")
                                                       for p in ("fwd", "fwd_bwd")}
    assert all("error" not in c and c["device_s"] > 0 for c in proj) and len({c["flops"] for c in proj}) == 2
    assert len(chip_figures.projection_cases(False)) == 2 * 2 * 3 * 2  # d_models x head dims x ways x passes
    full_gmm = chip_figures.gmm_cases(False, True)
    assert len(full_gmm) == 2 * 3 * len(chip_figures.GMM_SHAPES)  # ragged_dot + 2 tilings, 2 passes
    assert {tuple(c.params.get("tiling", ())) for c in full_gmm} == {(), (512, 1024, 1024), (128, 128, 128)}
    assert all(c.flops == (3 if c.params["pass_"] == "fwd_bwd" else 1) * chip_figures.matmul_flops(
        c.params["rows"], c.params["d"], c.params["f"]) for c in full_gmm)


@pytest.mark.slow
def test_every_section_runs_on_cpu(tmp_path):
    doc = _run("chip_figures.py", tmp_path)
    for name in ("matmul", "splash", "hbm", "index"):
        cases = doc["sections"][name]["cases"]
        assert cases and all("error" not in c for c in cases), name
        assert all(c["wall_s"] > 0 and c["efficiency_wall"] > 0 for c in cases)
    splash = doc["sections"]["splash"]["cases"]
    assert {c["pass_"] for c in splash} == {"fwd", "fwd_bwd"} and all(c["kernel_flops"] > 0 for c in splash)


@pytest.mark.slow
def test_chip_profile_compares_plan_and_trace_buckets_on_cpu(tmp_path):
    doc = _run("chip_profile.py", tmp_path, "--configs", "dot_b1,flash_b1", "--warm", "1", "--steps", "2",
               "--budget-s", "500", "--save-hlo")
    assert [r["config"] for r in doc["results"]] == ["dot_b1", "flash_b1"]
    # --save-hlo: each step's HLO and its ops' measured times, for pricing op by op without the chip
    import gzip

    from paxsearch.search.planning.roofline import parse_module

    with gzip.open(tmp_path / "dot_b1.hlo.txt.gz", "rt") as f:
        module = parse_module(f.read())
    ops = json.loads((tmp_path / "dot_b1.ops.json").read_text())
    names = {i.name for c in module.computations.values() for i in c.instrs}
    assert ops and set(ops) <= names and all(s > 0 and n > 0 for s, n in ops.values())
    for r in doc["results"]:
        assert "error" not in r, r.get("traceback")
        assert r["steps_traced"] == 2 and r["measured_step_s"] > 0 and r["wall_step_s"] > 0
        b = r["buckets"]
        assert b["matmul"]["predicted_s"] > 0 and b["matmul"]["measured_s"] > 0 and b["unmatched"]["measured_s"] == 0
        assert r["top_ops"]


def test_chip_profile_builds_an_onchip_point_as_its_study_trains_it():
    from paxsearch.benchmarks import chip_profile

    cfg = chip_profile.onchip_config("moe16-s2k-b8-dropless")
    assert (cfg.model.n_experts, cfg.model.expert_d_ff, cfg.model.expert_compute) == (16, 704, "dropless")
    assert (cfg.per_device_batch, cfg.remat, cfg.model.seq_len) == (8, "full", 2048)
    assert chip_profile.describe("moe16-s2k-b8-dropless").endswith("point moe16-s2k-b8-dropless")
    with pytest.raises(SystemExit, match="not a point of spaces/onchip_v5e.py"):
        chip_profile.onchip_config("m42-nope")

"""The MaxText round trip (benchmarks/bench_export_roundtrip.py) with MaxText 0.2.5 itself: an
exported trial compiles with MaxText's train_compile for the same TPU topology, with the same
FLOPs within 1% and memory within 5%. Needs /work/mt312 (a Python 3.12 venv holding MaxText
0.2.5 and this checkout's paxsearch, set up as the bench's docstring says; PAXSEARCH_MAXTEXT_VENV names another);
without it they are skipped with the reason."""
from __future__ import annotations

import dataclasses
import glob
import json
import os
import subprocess

import pytest

from paxsearch.search.export import maxtext
from paxsearch.trainer import presets
from paxsearch.trainer.config import MeshConfig, OptimizerConfig, PipelineConfig, TrainConfig, mesh_shape

MT312 = os.environ.get("PAXSEARCH_MAXTEXT_VENV", "/work/mt312")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _maxtext_env_problem() -> str | None:
    """Why MT312 cannot run the round trip for this checkout, or None. The bench imports paxsearch from
    MT312's interpreter, so an environment installed from another checkout would test that one."""
    if not os.path.exists(f"{MT312}/bin/python"):
        return f"{MT312} is absent: no MaxText 0.2.5 environment (see benchmarks/bench_export_roundtrip.py)"
    probe = subprocess.run([f"{MT312}/bin/python", "-c", "import os, paxsearch.trainer as trainer, maxtext; "
                            "print(os.path.dirname(os.path.dirname(os.path.realpath(trainer.__file__))))"],
                           capture_output=True, text=True, timeout=120, cwd="/")
    if probe.returncode != 0:
        return f"{MT312} cannot import paxsearch and maxtext: {probe.stderr.strip().splitlines()[-1:]}"
    if os.path.realpath(probe.stdout.strip()) != os.path.realpath(ROOT):
        return f"{MT312}'s paxsearch is {probe.stdout.strip()}, not this checkout {ROOT} (pip install -e . there)"
    return None


_PROBLEM = _maxtext_env_problem()
needs_maxtext = pytest.mark.skipif(_PROBLEM is not None, reason=str(_PROBLEM))


@needs_maxtext
def test_every_exported_key_is_a_maxtext_key():
    import yaml

    base = glob.glob(f"{MT312}/lib/python3*/site-packages/maxtext/configs/base.yml")
    assert base, f"{MT312} holds no maxtext/configs/base.yml"
    with open(base[0]) as f:
        known = set(yaml.safe_load(f))
    cfg = TrainConfig(model=presets.replace("llama3-8b", vocab_tiles=2), grad_accum_steps=2, global_batch=64,
                      per_device_batch=None, mesh=MeshConfig(ici=mesh_shape(stage=2, fsdp=-1, context=2),
                                                             dcn=mesh_shape(data=2)),
                      pipeline=PipelineConfig(microbatches=4), offload_params=True,
                      optimizer=OptimizerConfig(zero1=True, offload_state=True),
                      remat="custom:decoder_input=offload,mlp1=device")
    keys, _ = maxtext.overrides(cfg, "tpu", 16, 2)
    assert sorted(k for k, _ in keys if k not in known) == []
    # mixtures of experts (the mixtral, qwen3_moe and deepseek blocks; dropless, capacity, megablox; the expert
    # axis) and multi-head latent attention
    mixtral = presets.get("mixtral-8x7b")
    for model in (mixtral, dataclasses.replace(mixtral, expert_compute="capacity"),
                  dataclasses.replace(mixtral, grouped_matmul="megablox"), presets.get("qwen3-30b-a3b"),
                  presets.get("deepseek-v3"), presets.get("deepseek-v2-lite")):
        moe = TrainConfig(model=model, mesh=MeshConfig(ici=mesh_shape(fsdp=-1, expert=4)), per_device_batch=1)
        keys, _ = maxtext.overrides(moe, "tpu", 16)
        assert sorted(k for k, _ in keys if k not in known) == [], model


@pytest.mark.slow
@needs_maxtext
def test_roundtrip_compiles_with_same_flops_and_memory(tmp_path):
    """The case with every axis kind the v5e-4 has room for: fsdp 2 x tensor 2 (MaxText's activation rules),
    GQA, SwiGLU, our 'minimal' remat as MaxText's custom policy, splash attention."""
    proc = subprocess.run([f"{MT312}/bin/python", "benchmarks/bench_export_roundtrip.py", "--only",
                           "llama-fsdp2-tensor2-minimal", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=3000,
                          env={k: v for k, v in os.environ.items() if k != "XLA_FLAGS"})  # not the 8 CPU devices
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    with open(tmp_path / "roundtrip.json") as f:
        (res,) = json.load(f)
    assert "error" not in res["theirs"], res["theirs"].get("error")
    assert abs(res["flops_ratio"] - 1) <= 0.01, res
    assert abs(res["memory_ratio"] - 1) <= 0.05, res

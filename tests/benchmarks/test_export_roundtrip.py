"""The MaxText round trip (benchmarks/bench_export_roundtrip.py) with MaxText 0.2.5 itself: an
exported trial compiles with MaxText's train_compile for the same TPU topology, with the same
FLOPs within 1% and memory within 5%. Needs /work/mt312 (a Python 3.12 venv holding MaxText
0.2.5 and paxsearch, set up as the bench's docstring says); the CI machine has none."""
from __future__ import annotations

import glob
import json
import os
import subprocess

import pytest

from paxsearch.search.export import maxtext
from paxsearch.trainer import presets
from paxsearch.trainer.config import MeshConfig, OptimizerConfig, PipelineConfig, TrainConfig, mesh_shape

MT312 = "/work/mt312"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
needs_maxtext = pytest.mark.skipif(not os.path.exists(f"{MT312}/bin/python"),
                                   reason=f"{MT312} is absent: no MaxText 0.2.5 environment (see "
                                          "benchmarks/bench_export_roundtrip.py's docstring)")


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


@pytest.mark.slow
@needs_maxtext
def test_roundtrip_compiles_with_same_flops_and_memory(tmp_path):
    """The case with every axis kind the v5e-4 has room for: fsdp 2 x tensor 2 (MaxText's activation rules),
    GQA, SwiGLU, our 'minimal' remat as MaxText's custom policy, splash attention."""
    proc = subprocess.run([f"{MT312}/bin/python", "benchmarks/bench_export_roundtrip.py", "--only",
                           "llama-fsdp2-tensor2-minimal", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=3000,
                          env={k: v for k, v in os.environ.items() if k != "XLA_FLAGS"})  # not the 8 CPU devices
    with open(tmp_path / "roundtrip.json") as f:
        (res,) = json.load(f)
    assert "error" not in res["theirs"], res["theirs"].get("error")
    assert abs(res["flops_ratio"] - 1) <= 0.01, res
    assert abs(res["memory_ratio"] - 1) <= 0.05, res
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]

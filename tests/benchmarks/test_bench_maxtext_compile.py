"""benchmarks/bench_maxtext_compile.py's MaxText keys for a MoE row (moe_maxtext_argv), without MaxText: read
back through trainer/maxtext_yml.py (the reader of MaxText's model keys), they are the row's model."""
from __future__ import annotations

import dataclasses

import pytest
import yaml

from paxsearch.benchmarks import bench_maxtext_compile, published
from paxsearch.trainer import maxtext_yml

ROW = published.MOE_BY_NAME["v5p-128 Mixtral-8x7B"]


def read_back(row: published.MoePublished):
    """The ModelConfig maxtext_yml reads from the model keys of moe_maxtext_argv(row)."""
    known = set(maxtext_yml.BASE_DEFAULTS) | set(maxtext_yml.REQUIRED) | {"base_num_kv_heads"}
    pairs = (a.split("=", 1) for a in bench_maxtext_compile.moe_maxtext_argv(row, "base.yml") if "=" in a)
    return maxtext_yml.from_dict({k: yaml.safe_load(v) for k, v in pairs if k in known})


@pytest.mark.parametrize("k, weight", [(2, None), (2, 0.01), (3, 0.01), (8, 0.001), (2, 0.0)])
def test_load_balance_weight_read_back_is_ours(k, weight):
    """MaxText's load_balance_loss_weight is ours / experts_per_token (its loss counts each of a token's k
    routes), the writer's and the reader's convention: k x what the argv writes is our weight again."""
    fields = dict(ROW.model_fields, experts_per_token=k)
    if weight is not None:
        fields["load_balance_weight"] = weight
    row = dataclasses.replace(ROW, model_fields=tuple(fields.items()))
    ours = published.moe_model(row)
    assert read_back(row).load_balance_weight == ours.load_balance_weight
    if ours.load_balance_weight:  # the value on MaxText's command line is ours / k, not ours
        argv = dict(a.split("=", 1) for a in bench_maxtext_compile.moe_maxtext_argv(row, "b.yml") if "=" in a)
        assert float(argv["load_balance_loss_weight"]) == pytest.approx(ours.load_balance_weight / k, rel=1e-12)


@pytest.mark.parametrize("compute", ["dropless", "capacity"])
def test_moe_keys_read_back_as_the_rows_experts(compute):
    row = dataclasses.replace(ROW, expert_compute=compute, capacity_factor=1.5)
    ours, back = published.moe_model(row), read_back(row)
    fields = ("n_experts", "experts_per_token", "router", "mlp", "activation", "d_model", "n_layers", "n_heads",
              "n_kv_heads", "head_dim", "vocab_size", "seq_len", "rope_theta", "load_balance_weight", "expert_compute")
    assert {f: getattr(back, f) for f in fields} == {f: getattr(ours, f) for f in fields}
    assert back.expert_d_ff == (ours.expert_d_ff or ours.d_ff)
    assert compute == "dropless" or back.capacity_factor == 1.5


@pytest.mark.parametrize("model", ["moe", "moecap"])
def test_the_cpu_tokens_benchmark_gives_maxtext_our_weight_per_route(model):
    """benchmarks/bench_maxtext.py's MoE keys: MaxText's load_balance_loss_weight is ours / k (its loss counts each
    of a token's k routes), as the export writes it."""
    from paxsearch.benchmarks import bench_maxtext

    argv = dict(a.split("=", 1) for a in bench_maxtext._maxtext_moe(model))
    k, ours = bench_maxtext.MOE["experts_per_token"], bench_maxtext.MOE["load_balance_weight"]
    assert float(argv["load_balance_loss_weight"]) * k == pytest.approx(ours, rel=1e-12)
    assert bench_maxtext._maxtext_moe("llama") == []

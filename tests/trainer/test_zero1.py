"""ZeRO-1 (OptimizerConfig.zero1): AdamW's moments sharded over data on a data-parallel mesh;
the compiled per-device memory drops and the step's loss and update are unchanged."""
import dataclasses

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding

from paxsearch.trainer import validate
from paxsearch.trainer.errors import ConfigError, UnsupportedOnPlatform
from paxsearch.trainer.placement import zero1_sharding

from .knobs_util import assert_trees_close, config, one_step


def _zero1(cfg):
    return dataclasses.replace(cfg, optimizer=dataclasses.replace(cfg.optimizer, zero1=True))


@pytest.fixture(scope="module")
def plain_and_zero1():
    cfg = config(ici=(8, 1, 1), global_batch=16)
    plain = one_step(cfg)
    return plain, one_step(_zero1(cfg), init=plain[3])


def test_moments_are_sharded_over_data_and_memory_drops(plain_and_zero1):
    (p0, _, _, _), (p1, _, _, _) = plain_and_zero1
    mu = lambda program: program.state_shardings["opt_state"][1][0].mu["layers"]["mlp_up"]["kernel"]
    assert "data" not in str(mu(p0).spec) and "data" in str(mu(p1).spec)
    params = lambda program: program.state_shardings["params"]["layers"]["mlp_up"]["kernel"]
    assert params(p1) == params(p0)  # parameters stay replicated over data
    m0, m1 = p0.plan.memory, p1.plan.memory
    state_bytes = 4 * p0.plan.param_count  # one float32 moment
    # two moments, 7/8 of each gone from every device: arguments (and donated outputs) shrink
    assert m0.argument_bytes - m1.argument_bytes > 1.5 * state_bytes * 7 / 8, (m0, m1)
    assert p1.plan.peak_bytes < p0.plan.peak_bytes


def test_zero1_keeps_the_loss_and_the_update(plain_and_zero1):
    (_, m0, s0, _), (_, m1, s1, _) = plain_and_zero1
    np.testing.assert_allclose(m1["loss"], m0["loss"], rtol=1e-6)
    assert_trees_close(s1["params"], s0["params"], rtol=1e-5)
    assert_trees_close(s1["opt_state"], s0["opt_state"], rtol=1e-5, atol=1e-10)


def test_zero1_sharding_picks_a_dim_that_divides():
    mesh = jax.make_mesh((4, 2, 1), ("data", "fsdp", "tensor"))
    sh = NamedSharding(mesh, jax.sharding.PartitionSpec("fsdp", None))
    assert zero1_sharding(sh, (6, 12)).spec == jax.sharding.PartitionSpec("fsdp", "data")  # 12 % 4 == 0
    assert zero1_sharding(sh, (8, 6)).spec == jax.sharding.PartitionSpec(("fsdp", "data"), None)
    assert zero1_sharding(sh, (6, 6)).spec == sh.spec  # nothing divides: left as it is


def test_zero1_without_data_and_offload_on_cpu_are_one_line_errors():
    with pytest.raises(ConfigError, match="zero1 shards the optimizer state over the data axis, which has size 1"):
        validate.check(_zero1(config(ici=(1, 8, 1))), 8, "cpu")
    cfg = config()
    with pytest.raises(UnsupportedOnPlatform, match="optimizer.offload_state needs host-memory offload.*'cpu'"):
        validate.check(dataclasses.replace(cfg, optimizer=dataclasses.replace(cfg.optimizer, offload_state=True)),
                       8, "cpu")
    with pytest.raises(UnsupportedOnPlatform, match="offload_params needs host-memory offload"):
        validate.check(dataclasses.replace(cfg, offload_params=True), 8, "cpu")

"""Gradient accumulation (TrainConfig.grad_accum_steps): k microbatches per step give the loss
and the update of one batch of all the rows, on 8 CPU devices; bad splits are refused."""
import dataclasses

import numpy as np
import pytest

from paxsearch.trainer import validate
from paxsearch.trainer.errors import ConfigError
from paxsearch.trainer.plan import build_program

from .knobs_util import assert_trees_close, config, one_step

MESH = (4, 2, 1)  # both batch axes (data, fsdp)


@pytest.fixture(scope="module")
def whole_batch():
    return one_step(config(ici=MESH, global_batch=32))


@pytest.fixture(scope="module")
def four_microbatches(whole_batch):
    return one_step(config(ici=MESH, global_batch=32, grad_accum_steps=4), init=whole_batch[3])


def test_k_microbatches_give_the_loss_and_update_of_one_batch(whole_batch, four_microbatches):
    _, m1, s1, _ = whole_batch
    program, mk, sk, _ = four_microbatches
    assert program.plan.global_batch == 32
    np.testing.assert_allclose(mk["loss"], m1["loss"], rtol=1e-5)
    np.testing.assert_allclose(mk["grad_norm"], m1["grad_norm"], rtol=1e-5)
    assert_trees_close(sk["params"], s1["params"])
    assert_trees_close(sk["opt_state"], s1["opt_state"], atol=1e-9)


def test_accumulation_lowers_activation_memory_and_keeps_model_flops(whole_batch, four_microbatches):
    one, four = whole_batch[0].plan, four_microbatches[0].plan
    assert four.model_flops_per_step == one.model_flops_per_step  # the same work, in four slices
    assert four.memory.temp_bytes < 0.6 * one.memory.temp_bytes, (four.memory, one.memory)


@pytest.mark.slow  # six compiles: two steps, four unrolled FLOP probes
def test_loop_corrected_xla_flops_count_every_microbatch():
    cfg = config(global_batch=32)
    one = build_program(cfg).plan
    two = build_program(dataclasses.replace(cfg, grad_accum_steps=2)).plan
    assert two.xla_flops_per_step == pytest.approx(one.xla_flops_per_step, rel=0.02)


@pytest.mark.parametrize("k, words", [
    (3, "global batch 32 does not split into grad_accum_steps=3 microbatches"),
    (8, "multiple of 64 .k x batch devices. or a grad_accum_steps dividing 4"),
    (0, "grad_accum_steps must be an integer >= 1"),
])
def test_a_batch_that_does_not_split_is_one_config_error(k, words):
    with pytest.raises(ConfigError, match=words) as e:
        validate.check(config(global_batch=32, grad_accum_steps=k), 8, "cpu")
    assert "\n" not in str(e.value)

"""Vocab tiling (ModelConfig.vocab_tiles): the chunked unembedding + cross-entropy gives the
untiled loss and gradients, and the compiled step holds less memory."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from paxsearch.trainer import step as step_lib
from paxsearch.trainer import validate
from paxsearch.trainer.errors import ConfigError
from paxsearch.trainer.model import TransformerLM
from paxsearch.trainer.plan import build_program

from .knobs_util import MODEL, assert_trees_close, batch, config


def _loss_and_grads(m, params, b):
    sums = step_lib.make_loss_sums(TransformerLM(m))
    fn = jax.jit(jax.value_and_grad(lambda p: (lambda s, w: s / w)(*sums(p, b))))
    return jax.device_get(fn(params))


# untied: quick-loop budget (issue 18), CI runs it
@pytest.mark.parametrize("tied", [pytest.param(False, marks=pytest.mark.slow), True])
def test_tiled_loss_and_gradients_equal_untiled(tied):
    m = dataclasses.replace(MODEL, tie_embeddings=tied)
    b = {k: jnp.asarray(v) for k, v in batch(4, m.seq_len).items()}
    init = jax.jit(lambda key: step_lib.unbox(TransformerLM(m).init(key, b["inputs"], b["positions"],
                                                                   b["segment_ids"])["params"]))
    params = init(jax.random.key(0))
    loss1, grads1 = _loss_and_grads(m, params, b)
    loss4, grads4 = _loss_and_grads(dataclasses.replace(m, vocab_tiles=4), params, b)
    np.testing.assert_allclose(loss4, loss1, rtol=1e-5)
    assert_trees_close(grads4, grads1, rtol=1e-5, atol=1e-8)
    table = grads1["embed"]["embedding"] if tied else grads1["unembed"]["kernel"]
    assert np.abs(table).max() > 0


@pytest.mark.slow  # quick-loop budget (issue 18): a full compile or a whole CLI run; CI runs it
def test_tiling_holds_less_than_the_whole_logits():
    m = dataclasses.replace(MODEL, vocab_size=8192, seq_len=64)
    cfg = config(global_batch=16, model=m)
    whole = build_program(cfg, count_flops=False).plan
    tiled = build_program(dataclasses.replace(cfg, model=dataclasses.replace(m, vocab_tiles=8)),
                          count_flops=False).plan
    logits_per_device = 2 * 64 * 8192 * 4  # 2 rows x S x V float32
    assert whole.memory.temp_bytes > logits_per_device  # the logits (and their softmax) are held...
    assert whole.memory.temp_bytes - tiled.memory.temp_bytes > logits_per_device / 2  # ...and tiled, an 8th
    assert tiled.model_flops_per_step == whole.model_flops_per_step


@pytest.mark.parametrize("tiles, words", [(3, "vocab_tiles=3 does not divide seq_len=32"),
                                          (0, "vocab_tiles must be an integer >= 1")])
def test_bad_tiles_are_one_config_error(tiles, words):
    cfg = config(model=dataclasses.replace(MODEL, vocab_tiles=tiles))
    with pytest.raises(ConfigError, match=words):
        validate.check(cfg, 8, "cpu")

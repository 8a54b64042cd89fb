"""One real train step of a compiled Program on a fixed batch, for the memory-knob tests."""
import dataclasses

import jax
import numpy as np

from paxsearch.trainer.config import MeshConfig, ModelConfig, TrainConfig
from paxsearch.trainer.plan import build_program

MODEL = ModelConfig(vocab_size=384, d_model=32, n_layers=2, n_heads=4, head_dim=8, d_ff=64, seq_len=32,
                    mlp="gated", activation="silu", position="rope", n_kv_heads=2)


def config(ici=(8, 1, 1), global_batch=32, **kw) -> TrainConfig:
    base = TrainConfig(model=MODEL, mesh=MeshConfig(ici=ici), per_device_batch=None, global_batch=global_batch,
                       steps=10)
    return dataclasses.replace(base, **kw)


def batch(global_batch: int, seq_len: int, vocab: int = 259, seed: int = 0) -> dict:
    """Random tokens; weights with a different number of zeros per row, so that a mean over
    microbatches of their own means would differ from the token-weighted mean."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, vocab, (global_batch, seq_len + 1)).astype(np.int32)
    weights = (np.arange(seq_len)[None, :] < rng.integers(4, seq_len + 1, (global_batch, 1))).astype(np.float32)
    return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "weights": weights,
            "segment_ids": np.ones((global_batch, seq_len), np.int32),
            "positions": np.broadcast_to(np.arange(seq_len, dtype=np.int32), (global_batch, seq_len)).copy()}


def one_step(cfg: TrainConfig, seed: int = 0, init=None):
    """(program, metrics, new state as numpy, initial state as numpy) of one step on
    batch(seed), from `init` (a state as numpy) or else the seed-0 initialization."""
    program = build_program(cfg, count_flops=False)
    b = {k: jax.device_put(v, program.batch_sharding)
         for k, v in batch(program.plan.global_batch, cfg.model.seq_len, seed=seed).items()}
    if init is None:
        state = program.init_state(jax.random.key(0))
        init = jax.device_get(state)
    else:  # the same values, placed as this program wants them (an init compile saved)
        state = jax.device_put(init, program.state_shardings)
    new_state, metrics = program.compiled_step(state, b)
    return program, jax.device_get(metrics), jax.device_get(new_state), init


def assert_trees_close(a, b, rtol=1e-5, atol=1e-7):
    """Leaf by leaf within rtol, an element near zero within rtol of its leaf's largest value
    (float32 sums in another order differ by that much on a value 100x below the leaf's scale)."""
    flat_a, tree_a = jax.tree.flatten_with_path(a)
    flat_b, tree_b = jax.tree.flatten_with_path(b)
    assert [p for p, _ in flat_a] == [p for p, _ in flat_b]
    for (path, x), (_, y) in zip(flat_a, flat_b, strict=True):
        y = np.asarray(y)
        scale = float(np.max(np.abs(y))) if y.size and np.issubdtype(y.dtype, np.floating) else 0.0
        np.testing.assert_allclose(np.asarray(x), y, rtol=rtol, atol=max(atol, rtol * scale), err_msg=str(path))

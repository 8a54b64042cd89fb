"""The one formula of a train step's state bytes (trainer/state_memory.py): parameters and
gradients in the parameters' dtype, AdamW's two moments, ZeRO-1 and offloaded shares."""
from __future__ import annotations

from paxsearch.trainer.state_memory import dtype_bytes, train_state_bytes


def test_float32_parameters_gradients_and_two_moments():
    n = 1_000_000
    # 4 B parameter + 4 B gradient + 2 x 4 B moments = 16 B per parameter
    assert train_state_bytes(n, dtype_bytes("float32")) == 16 * n
    assert train_state_bytes(n, 4, shards=8) == 2 * n  # every term split 8 ways


def test_bfloat16_gradients_and_moments_follow_the_parameters():
    n = 1_000_000
    assert dtype_bytes("bfloat16") == 2
    assert train_state_bytes(n, dtype_bytes("bfloat16"), shards=4) == 8 * n // 4


def test_zero1_and_offloaded_moments():
    n = 1_200_000
    # ZeRO-1: parameters and gradients over 4 weight shards, the moments over 4 x 8 data
    assert train_state_bytes(n, 4, shards=4, moment_shards=32) == 2 * 4 * n // 4 + 2 * 4 * n // 32
    # offloaded moments are in host memory: parameters and gradients only
    assert train_state_bytes(n, 4, shards=4, offload_moments=True) == 2 * 4 * n // 4


def test_each_term_rounds_up_to_whole_bytes():
    assert train_state_bytes(1, 4, shards=3) == 3 + 3  # ceil(8 / 3) for each of the two terms

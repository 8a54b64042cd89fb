"""One helper sets the simulated CPU device count in XLA_FLAGS (trainer/flagsets.py), used by
the worker pool, plan targets, `train` and the tests; the user's other flags are kept."""
from paxsearch.trainer.flagsets import (
    CPU_COLLECTIVE_TIMEOUT_FLAG,
    CPU_COLLECTIVE_TIMEOUT_S,
    DEVICE_COUNT_FLAG,
    with_device_count,
)

TIMEOUT = f"{CPU_COLLECTIVE_TIMEOUT_FLAG}={CPU_COLLECTIVE_TIMEOUT_S}"


def test_sets_replaces_and_removes_the_device_count():
    assert with_device_count(None, 8) == f"{DEVICE_COUNT_FLAG}=8 {TIMEOUT}"
    own = "--xla_cpu_enable_fast_math=false"
    assert with_device_count(f"{DEVICE_COUNT_FLAG}=2 {own}", 4) == f"{own} {DEVICE_COUNT_FLAG}=4 {TIMEOUT}"
    assert with_device_count(f"{own} {DEVICE_COUNT_FLAG}=2 {DEVICE_COUNT_FLAG}=3", None) == own
    # a flag that merely starts with the same letters is someone else's
    other = f"{DEVICE_COUNT_FLAG}_x=1"
    assert with_device_count(other, 2) == f"{other} {DEVICE_COUNT_FLAG}=2 {TIMEOUT}"


def test_simulated_devices_wait_10_minutes_in_a_collective_unless_the_user_says_otherwise():
    """XLA:CPU aborts a process whose collective waits 60 s for a late device thread (its default);
    simulated devices get 10 minutes. The user's own value stays, once; without simulated
    devices (n None: a TPU or GPU worker) nothing is added, and the flag is taken out."""
    assert CPU_COLLECTIVE_TIMEOUT_S == 600
    again = with_device_count(with_device_count(None, 8), 4)
    assert again.split().count(TIMEOUT) == 1 and f"{DEVICE_COUNT_FLAG}=4" in again.split()
    own = f"{CPU_COLLECTIVE_TIMEOUT_FLAG}=30"
    assert with_device_count(own, 8).split() == [own, f"{DEVICE_COUNT_FLAG}=8"]
    assert with_device_count("--xla_dump_to=/tmp/x", None) == "--xla_dump_to=/tmp/x"
    # the flags of one's own (a TPU or GPU worker, the plan cache's key) hold neither
    assert with_device_count(with_device_count("--xla_dump_to=/tmp/x", 8), None) == "--xla_dump_to=/tmp/x"


def test_the_pool_and_targets_use_it():
    from paxsearch.search.planning.targets import parse_target, target_env

    env = target_env(parse_target("cpu:4"))
    assert env["XLA_FLAGS"].split().count(f"{DEVICE_COUNT_FLAG}=4") == 1
    assert DEVICE_COUNT_FLAG + "=8" not in env["XLA_FLAGS"]  # conftest's count replaced, not added to

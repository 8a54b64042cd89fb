"""Checkpoints that do not stop training (trainer/checkpoint.py, trainer/train.py): a resumed run
continues bit-exactly, and the seconds a save blocks the loop are recorded apart from step time.
Real Orbax saves on 8 simulated CPU devices; one compiled program serves every run here."""
import dataclasses
import time

import jax
import numpy as np
import pytest

from paxsearch.search.cli.train import _checkpoint_line
from paxsearch.trainer.checkpoint import Checkpointer
from paxsearch.trainer.config import CheckpointConfig
from paxsearch.trainer.plan import build_program
from paxsearch.trainer.results import CheckpointSeconds
from paxsearch.trainer.train import train

from ..trainer_util import tiny

STEPS = 4  # the whole run; the interrupted one stops at STEPS // 2 and resumes
EVERY = 2


def _cfg(steps: int, run_dir) -> object:
    cfg = tiny(steps=steps, log_every=1)
    # a fixed schedule: a 4-step run and an 8-step run take the same learning rates
    return dataclasses.replace(cfg, run_dir=str(run_dir), optimizer=dataclasses.replace(cfg.optimizer, decay_steps=20),
                               checkpoint=CheckpointConfig(enabled=True, every_steps=EVERY, keep=2))


@pytest.fixture(scope="module")
def program():
    return build_program(_cfg(STEPS, None), count_flops=False)


def _train(cfg, program):
    """(result, metrics by step, perf_counter at each report call by step)."""
    seen, clock = {}, {}

    def report(m):
        clock[m.step] = time.perf_counter()
        seen[m.step] = m

    return train(cfg, report=report, program=program), seen, clock


@pytest.fixture(scope="module")
def whole(program, tmp_path_factory):
    run = tmp_path_factory.mktemp("whole")
    return (run, *_train(_cfg(STEPS, run), program))


def _params(run, program, step: int):
    ckpt = Checkpointer(CheckpointConfig(enabled=True), str(run))
    try:
        state = ckpt.restore(program.abstract_state, step)
    finally:
        ckpt.close()
    return jax.device_get(state["params"])


def test_resumed_run_matches_the_uninterrupted_one_bit_for_bit(whole, program, tmp_path):
    run_a, _, losses_a, _ = whole
    first, _, _ = _train(_cfg(STEPS // 2, tmp_path), program)
    assert first.steps_run == STEPS // 2 and first.start_step == 0
    resumed, losses_b, _ = _train(_cfg(STEPS, tmp_path), program)
    assert resumed.start_step == STEPS // 2 and resumed.steps_run == STEPS - STEPS // 2
    later = range(STEPS // 2 + 1, STEPS + 1)
    assert sorted(losses_b) == list(later)
    assert [losses_b[s].loss for s in later] == [losses_a[s].loss for s in later]  # bit-exact
    assert [losses_b[s].grad_norm for s in later] == [losses_a[s].grad_norm for s in later]
    a, b = _params(run_a, program, STEPS), _params(tmp_path, program, STEPS)
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)


def test_save_blocking_is_recorded_and_kept_out_of_step_time(whole):
    run, result, seen, clock = whole
    c = result.checkpoint_seconds
    assert isinstance(c, CheckpointSeconds)
    assert c.saves == STEPS // EVERY  # the last periodic save is the final one: not saved twice
    assert c.blocking_s > 0 and 0 <= c.waiting_for_previous_s <= c.blocking_s and c.final_wait_s >= 0
    saving = {s for s in seen if s % EVERY == 0}
    assert all(seen[s].checkpoint_s > 0 for s in saving)
    assert all(seen[s].checkpoint_s == 0 for s in seen if s not in saving)
    assert sum(seen[s].checkpoint_s for s in sorted(seen)) == pytest.approx(c.blocking_s, rel=1e-9)
    # Each interval (one step: log every step) is timed inside the span between two report calls;
    # its step time plus the save's blocking seconds fill no more than that span. Were the
    # blocking seconds also in step_time, they would count twice and overflow it.
    for s in sorted(seen)[1:]:
        assert seen[s].step_time + seen[s].checkpoint_s <= clock[s] - clock[s - 1] + 1e-9, s
        assert seen[s].tokens_per_sec == pytest.approx(result.plan.tokens_per_step / seen[s].step_time)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tb"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("checkpoint/blocking_s")] == sorted(saving)
    assert [e.step for e in acc.Scalars("checkpoint/final_wait_s")] == [STEPS]
    assert "train/checkpoint_s" in acc.Tags()["scalars"]


def test_summary_line():
    line = _checkpoint_line(CheckpointSeconds(saves=2, blocking_s=1.9, waiting_for_previous_s=0.6, final_wait_s=3.1))
    assert line == ("checkpoints: 2 saves, 1.9 s blocking (0.95 s a save, 0.6 s of it waiting for the previous "
                    "write), 3.1 s waiting for the last write at exit; not counted in step time")
    assert "previous" not in _checkpoint_line(CheckpointSeconds(saves=1, blocking_s=0.2))

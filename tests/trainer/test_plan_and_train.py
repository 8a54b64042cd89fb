"""Trainer behaviour on 8 simulated CPU devices: loss, mesh equivalence, remat, FLOPs, errors."""
import dataclasses

import numpy as np
import pytest

from paxsearch.trainer import flops as flops_lib
from paxsearch.trainer.config import MeshConfig, ModelConfig
from paxsearch.trainer.errors import ConfigError, UnsupportedOnPlatform
from paxsearch.trainer.plan import build_program, plan
from paxsearch.trainer.train import train

from ..trainer_util import tiny


def _losses(cfg):
    """Losses by step; the program is built without the FLOP probes (two more compiles of
    unrolled layers) since no test here reads FLOPs from a train()."""
    seen = []
    train(cfg, report=lambda m: seen.append((m.step, m.loss)), program=build_program(cfg, count_flops=False))
    return dict(seen)


@pytest.mark.slow  # quick-loop budget (issue 18): 50 trained steps; CI runs it
def test_loss_falls_within_50_steps():
    cfg = tiny(steps=50, log_every=10)
    cfg = dataclasses.replace(cfg, optimizer=dataclasses.replace(cfg.optimizer, peak_lr=3e-3, warmup_steps=5))
    losses = _losses(cfg)
    assert losses[50] < 0.6 * losses[1], losses


@pytest.fixture(scope="module")
def reference():
    return _losses(tiny(ici=(8, 1, 1)))


@pytest.mark.parametrize("ici", [(1, 8, 1),  # the quick loop checks one mesh; CI all three
                                 pytest.param((2, 2, 2), marks=pytest.mark.slow),
                                 pytest.param((1, 4, 2), marks=pytest.mark.slow)])
def test_same_loss_on_every_mesh(ici, reference):
    other = _losses(tiny(ici=ici))
    assert sorted(reference) == sorted(other) == [1, 2, 3]
    np.testing.assert_allclose([other[s] for s in (1, 2, 3)], [reference[s] for s in (1, 2, 3)], rtol=1e-4)


@pytest.mark.slow  # quick-loop budget (issue 18): a full compile or a whole CLI run; CI runs it
def test_remat_orders_compiled_temp_memory():
    cfg = tiny()
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, n_layers=4))
    temp = {r: plan(dataclasses.replace(cfg, remat=r), count_flops=False).memory.temp_bytes
            for r in ("none", "dots", "full")}
    assert temp["none"] > temp["dots"] > temp["full"], temp


@pytest.mark.slow  # quick-loop budget (issue 18): a full compile or a whole CLI run; CI runs it
def test_every_named_policy_compiles_and_offload_fails_loudly_on_cpu():
    cfg = tiny()
    for r in ("dots_no_batch", "qkv_proj", "minimal"):
        assert plan(dataclasses.replace(cfg, remat=r), count_flops=False).peak_bytes > 0
    with pytest.raises(UnsupportedOnPlatform, match="offload.*cpu"):
        plan(dataclasses.replace(cfg, remat="offload"), count_flops=False)


def test_model_flops_match_hand_computed_integer():
    m = ModelConfig(vocab_size=512, d_model=256, n_layers=4, n_heads=8, head_dim=32, d_ff=1024, seq_len=128)
    # per token forward: 4 x (2*256*768 + 2*256*256 + 4*256*1024 + 2*128*256) + 2*256*512
    per_token = 4 * (393216 + 131072 + 1048576 + 65536) + 262144
    assert per_token == 6815744
    assert flops_lib.model_flops_per_step(m, global_batch=32) == 3 * 6815744 * 32 * 128 == 83751862272


@pytest.mark.slow  # quick-loop budget (issue 18): a full compile or a whole CLI run; CI runs it
def test_xla_flops_corrected_for_scan_trip_count():
    cfg = tiny()
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, n_layers=4))
    scanned = plan(cfg)
    unrolled = plan(dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, scan_layers=False)))
    assert scanned.xla_flops_per_step == pytest.approx(unrolled.xla_flops_per_step, rel=0.02)
    # and it is real work: at least the analytic model FLOPs of one device's share
    assert scanned.xla_flops_per_step >= 0.9 * scanned.model_flops_per_step / scanned.num_devices
    assert scanned.param_count == flops_lib.param_count(cfg.model)


@pytest.mark.parametrize("change, pattern", [
    (dict(mesh=MeshConfig(ici=(2, 2, 1))), r"4 devices but 8 are available"),
    (dict(mesh=MeshConfig(ici=(3, -1, 1))), r"not a multiple of 3"),
    (dict(global_batch=12), r"global batch 12 does not divide over the 8 devices"),
    (dict(mesh=MeshConfig(ici=(1, 1, 8))), r"n_heads=4 does not divide over tensor=8"),
    (dict(remat="sometimes"), r"unknown remat policy 'sometimes'"),
])
def test_bad_configs_give_one_clear_line(change, pattern):
    with pytest.raises(ConfigError, match=pattern) as info:
        plan(dataclasses.replace(tiny(), **change), count_flops=False)
    assert "\n" not in str(info.value)


def test_d_ff_must_divide_over_tensor():
    cfg = tiny(ici=(2, 1, 4))
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, d_ff=130, n_heads=4))
    with pytest.raises(ConfigError, match=r"d_ff=130 does not divide over tensor=4"):
        plan(cfg, count_flops=False)

"""The learned correction of predicted MFU (store/correction.py): it recovers a known linear
relation, its prediction interval covers at its level, and it falls back to the global ratio
when the measured trials are too few for its features."""
import math

import numpy as np
import pytest
from scipy import stats

from paxsearch.store import correction
from paxsearch.store.plan import Plan


def _plan(comm_share, log_device_tokens, log_step_time=-2.0, tensor=1, recompute=1.0):
    """A plan whose features (correction.FEATURES) are the given values."""
    chip = 1.0
    tokens = math.exp(log_device_tokens) * 8
    return Plan.make(predicted_mfu=0.3, predicted_step_time=math.exp(log_step_time), num_devices=8,
                     tokens_per_step=tokens, mesh_shape={"data": 8 // tensor, "fsdp": 1, "tensor": tensor},
                     model_flops_per_step=8e9,
                     roofline={"comm_s": chip * comm_share / (1 - comm_share), "roofline_s": chip,
                               "flops_per_step": 1e9 * recompute})


def test_the_features_are_read_back_from_a_plan():
    plan = _plan(0.25, math.log(512), log_step_time=-1.5, tensor=4, recompute=1.3)
    values = {name: f(plan) for name, f in correction.FEATURES.items()}
    assert values == pytest.approx({"comm_share": 0.25, "log_device_tokens": math.log(512), "log_step_time": -1.5,
                                    "log_tensor": 2.0, "log_recompute": math.log(1.3)})
    assert correction.FEATURES["comm_share"](Plan.make(predicted_mfu=0.3)) is None  # no roofline: no feature


def _truth(plan):
    return -0.4 - 1.5 * correction.FEATURES["comm_share"](plan) + 0.2 * correction.FEATURES["log_device_tokens"](plan)


def _draw(rng, n):
    return [_plan(rng.uniform(0.05, 0.6), rng.uniform(5, 9)) for _ in range(n)]


def test_it_recovers_a_known_linear_relation():
    rng = np.random.default_rng(0)
    plans = _draw(rng, 200)
    logs = [_truth(p) + rng.normal(0, 0.01) for p in plans]
    model = correction.fit(plans, logs)
    assert model.names[:2] == ("comm_share", "log_device_tokens")
    new = _draw(rng, 50)
    means = np.array([model.predict(p)[0] for p in new])
    assert np.max(np.abs(means - [_truth(p) for p in new])) < 0.01
    assert model.s == pytest.approx(0.01, rel=0.2)
    # the corrected prediction is the predicted MFU times the median ratio
    assert model.corrected(new[0], 0.3) == pytest.approx(0.3 * math.exp(_truth(new[0])), rel=0.02)
    assert correction.Correction.from_dict(model.to_dict()) == model  # JSON-able for a worker


def test_the_upper_bound_covers_held_out_points_at_its_level():
    rng = np.random.default_rng(1)
    misses, two_sided, outside = [], [], []
    for _ in range(1500):
        plans = _draw(rng, 13)
        logs = [_truth(p) + rng.normal(0, 0.2) for p in plans]
        model = correction.fit(plans[:-1], logs[:-1], max_features=2)
        assert model.names == ("comm_share", "log_device_tokens") and model.dof == 9
        misses.append(math.log(model.upper_ratio(plans[-1], 0.05)) < logs[-1])
        mean, sd = model.predict(plans[-1])
        two_sided.append(abs(logs[-1] - mean) > stats.t.ppf(0.975, model.dof) * sd)
        low, high = model.interval(plans[-1], 1.0, 0.9)  # the report's interval, on MFU of predicted 1
        outside.append(not math.log(low) <= logs[-1] <= math.log(high))
    assert abs(np.mean(misses) - 0.05) < 0.015
    assert abs(np.mean(two_sided) - 0.05) < 0.015
    assert abs(np.mean(outside) - 0.10) < 0.02


def test_too_few_trials_fall_back_to_the_global_ratio():
    rng = np.random.default_rng(2)
    plans = _draw(rng, 7)
    logs = [_truth(p) for p in plans]
    assert correction.fit(plans[:2], logs[:2]) is None
    three = correction.fit(plans[:3], logs[:3])  # n = 3 <= p + 2 for any p >= 1: no feature
    assert three.is_global and three.dof == 2
    ratios = np.exp(logs[:3])
    global_bound = math.exp(np.mean(logs[:3]) + stats.t.ppf(0.95, 2) * np.std(logs[:3], ddof=1) * math.sqrt(4 / 3))
    assert three.upper_ratio(plans[5], 0.05) == pytest.approx(global_bound)  # the same for every point
    assert three.upper_ratio(plans[4], 0.05) == pytest.approx(global_bound) and global_bound > max(ratios)
    assert correction.fit(plans[:4], logs[:4]).is_global
    # features enter as trials accrue, p <= (n - 3) / 2, in FEATURES order (log_step_time is
    # constant in these plans, so it is left out)
    assert correction.fit(plans[:5], logs[:5]).names == ("comm_share",)
    assert correction.fit(plans[:6], logs[:6]).names == ("comm_share",)
    assert correction.fit(plans, logs).names == ("comm_share", "log_device_tokens")
    same_tokens = [_plan(rng.uniform(0.05, 0.6), 7.0) for _ in range(7)]  # a constant feature is left out
    assert correction.fit(same_tokens, [_truth(p) for p in same_tokens]).names == ("comm_share",)


def test_leave_one_out_never_sees_the_trial_it_predicts():
    rng = np.random.default_rng(3)
    plans = _draw(rng, 8)
    logs = [_truth(p) + rng.normal(0, 0.05) for p in plans]
    logs[0] += 2.0  # an outlier: its own fit would pull towards it, the others' cannot
    loo = correction.leave_one_out(plans, logs)
    assert loo[0] == pytest.approx(correction.fit(plans[1:], logs[1:]).predict(plans[0])[0])
    assert logs[0] - loo[0] > 1.5
    assert correction.leave_one_out(plans[:3], logs[:3]) == [None, None, None]  # 2 others: no model

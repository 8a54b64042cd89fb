"""The math group's loss: which finished trial a layout-only variant inherits its loss from."""
import math

import optuna
from optuna.distributions import CategoricalDistribution

from paxsearch.search.tuning.steer import group_loss


def _trial(number, key, loss, **attrs):
    t = optuna.trial.create_trial(params={"m": number}, distributions={"m": CategoricalDistribution(list(range(9)))},
                                  values=[loss, 0.1], user_attrs={"math_key": key, **attrs})
    t.number = number
    return t


def test_the_lowest_numbered_own_loss_of_the_same_math_is_the_reference():
    trials = [_trial(3, "a", 2.0), _trial(1, "b", 1.0), _trial(2, "a", 2.5),
              _trial(0, "a", 9.0, loss_group={"from_trial": 7, "loss": 9.0}),  # inherited: never a reference
              _trial(4, "a", math.inf)]
    assert group_loss(trials, "a", number=5, loss_index=0) == (2, 2.5)
    assert group_loss(trials, "a", number=2, loss_index=0) == (3, 2.0)  # never itself
    assert group_loss(trials, "b", number=1, loss_index=0) is None
    assert group_loss(trials, None, number=5, loss_index=0) is None
    failed = [_trial(1, "c", 1.0, failure_kind="crash"), _trial(2, "c", 1.5, predicted=True)]
    assert group_loss(failed, "c", number=3, loss_index=0) is None

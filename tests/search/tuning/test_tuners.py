"""The tuner bridge: the dedupe sampler and the grid and evolution proposers over the tiny
space (no JAX run)."""
import random

import optuna
from optuna.trial import TrialState

from paxsearch.search.study.space import decisions_key, load_space
from paxsearch.search.tuning import tuners

from ...search_util import TINY


def _study_with(space, points, state=TrialState.COMPLETE):
    study = optuna.create_study(directions=["minimize"])
    for p in points:
        study.add_trial(optuna.trial.create_trial(params=p, distributions=tuners.distributions(space),
                                                  values=[1.0], state=state, user_attrs={"decisions": p}))
    return study


def test_dedupe_sampler_never_repeats_a_point():
    space = load_space(TINY)
    every = list(space.points())
    study = _study_with(space, every[:4])
    study.sampler = tuners.make_sampler(space.settings.replace(tuner="random"), space, seed=0)
    seen = {decisions_key(p) for p in every[:4]}
    for _ in range(2):
        trial = study.ask()
        d = tuners.suggest_all(trial, space)
        assert decisions_key(d) not in seen
        seen.add(decisions_key(d))
        study.tell(trial, 1.0)
    assert len(seen) == 6


def test_grid_and_evolution_proposers():
    space = load_space(TINY)
    grid = tuners.GridProposer(space, seed=1)
    study = _study_with(space, [])
    proposed = []
    while (p := grid.propose(space, study.get_trials())) is not None:
        proposed.append(decisions_key(p))
        study.add_trial(optuna.trial.create_trial(params=p, distributions=tuners.distributions(space), values=[1.0],
                                                  user_attrs={"decisions": p}))
    assert len(proposed) == len(set(proposed)) == 6

    evo = tuners.EvolutionProposer(space, space.settings.replace(trials=6, objectives=("loss",)), seed=0)
    study = _study_with(space, [])
    keys = []
    for _ in range(6):
        p = evo.propose(space, study.get_trials())
        assert p is not None
        keys.append(decisions_key(p))
        study.add_trial(optuna.trial.create_trial(params=p, distributions=tuners.distributions(space),
                                                  values=[random.random()], user_attrs={"decisions": p}))
    assert len(set(keys)) == 6
    assert evo.propose(space, study.get_trials()) is None

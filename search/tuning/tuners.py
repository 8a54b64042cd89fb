"""Tuners: PyGlove decisions <-> Optuna distributions, Optuna samplers with deduplication,
and the proposers paxsearch drives itself (grid, PyGlove regularized evolution).

Every tuner answers the same question under the study lock: which point runs next?
- tpe, nsga2, random: an Optuna sampler, wrapped by DedupeSampler, which asks the
  inner sampler for a whole point at once and swaps a point already in the study (or left
  out by the space's constraint) for an unseen one.
- grid: every point of the (finite) space once, in a seeded shuffled order, then stop.
- evolution: pg.evolution.regularized_evolution over the space's DNASpec, fed back with the
  first objective (as a reward to maximize); its proposals enter the study by enqueue_trial.
"""
from __future__ import annotations

import math
import random
from typing import Iterable

import optuna
import pyglove as pg
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.samplers import BaseSampler
from optuna.trial import FrozenTrial, TrialState

from ...store.outcome import kind_of
from ..errors import UserError
from ..study.settings import OBJECTIVES, StudySettings
from ..study.space import Decision, Space, decisions_key
from ..study.storage import is_superseded

FAILED_REWARD = -1e30  # evolution's reward for a trial without a usable score


class SpaceExhausted(RuntimeError):
    """Every point of the space is already in the study."""


class TunerError(UserError, ValueError):
    """The tuner cannot run this space (message says why)."""


def distribution(d: Decision, fixed=None) -> BaseDistribution:
    if fixed is not None:
        return CategoricalDistribution([fixed])
    if d.kind == "float":
        return FloatDistribution(d.low, d.high, log=d.log)
    if d.kind == "int":
        return IntDistribution(int(d.values[0]), int(d.values[-1]), log=d.log)
    return CategoricalDistribution(list(d.values))


def distributions(space: Space) -> dict[str, BaseDistribution]:
    return {d.name: distribution(d, space.fixed.get(d.name)) for d in space.all_decisions}


def suggest_all(trial: optuna.Trial, space: Space) -> dict:
    """Suggest every decision on `trial` (Optuna parameters named as the decisions)."""
    out = {}
    for name, dist in distributions(space).items():
        out[name] = _suggest(trial, name, dist)
    return space.full({k: v for k, v in out.items() if k not in space.fixed})


def _suggest(trial: optuna.Trial, name: str, dist: BaseDistribution):
    if isinstance(dist, FloatDistribution):
        return trial.suggest_float(name, dist.low, dist.high, log=dist.log)
    if isinstance(dist, IntDistribution):
        return trial.suggest_int(name, dist.low, dist.high, log=dist.log)
    return trial.suggest_categorical(name, dist.choices)


def canonical(space: Space, decisions: dict) -> dict:
    return {d.name: d.coerce(decisions[d.name]) for d in space.all_decisions}


def trial_decisions(space: Space, t: FrozenTrial) -> dict | None:
    """A trial's decisions (stored, enqueued or suggested), or None while incomplete."""
    d = t.user_attrs.get("decisions") or t.system_attrs.get("fixed_params") or t.params
    try:
        return canonical(space, d)
    except (KeyError, ValueError):
        return None


def seen_keys(space: Space, trials: Iterable[FrozenTrial], exclude_number: int | None = None) -> set[str]:
    keys = set()
    for t in trials:
        if t.number == exclude_number or is_superseded(t):
            continue
        d = trial_decisions(space, t)
        if d is not None:
            keys.add(decisions_key(d))
    return keys


def random_unseen(space: Space, seen: set[str], rng: random.Random) -> dict:
    """A random point of the space that is neither seen nor excluded by its constraint."""
    free = space.decisions
    for _ in range(2000):
        pick = {}
        for d in free:
            if d.kind == "float":
                pick[d.name] = (math.exp(rng.uniform(math.log(d.low), math.log(d.high))) if d.log
                                else rng.uniform(d.low, d.high))
            else:
                pick[d.name] = rng.choice(d.values)
        point = space.full(pick)
        if decisions_key(point) not in seen and not space.excluded(point):
            return point
    if space.finite:
        rest = [p for p in space.points() if decisions_key(p) not in seen]
        if rest:
            return rng.choice(rest)
    raise SpaceExhausted("every point of the space is already in the study")


class DedupeSampler(BaseSampler):
    """Samples a whole point from `inner`, then replaces it when it is already in the study or
    left out by the space's constraint. Fixed (enqueued) parameters bypass it, as in Optuna."""

    def __init__(self, inner: BaseSampler, space: Space, seed: int = 0):
        self.inner, self.space = inner, space
        self._rng = random.Random(seed)
        self.replaced = 0

    def infer_relative_search_space(self, study, trial):
        return {d.name: distribution(d) for d in self.space.decisions}

    def sample_relative(self, study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]) -> dict:
        if not search_space:
            return {}
        inner_space = self.inner.infer_relative_search_space(study, trial)
        inner_space = {k: v for k, v in inner_space.items() if k in search_space}
        params = dict(self.inner.sample_relative(study, trial, inner_space)) if inner_space else {}
        for name, dist in search_space.items():
            if name not in params:
                params[name] = self.inner.sample_independent(study, trial, name, dist)
        point = self.space.full(params)
        seen = seen_keys(self.space, study.get_trials(deepcopy=False), exclude_number=trial.number)
        if decisions_key(canonical(self.space, point)) in seen or self.space.excluded(point):
            point = random_unseen(self.space, seen, self._rng)
            self.replaced += 1
        return {name: point[name] for name in search_space}

    def sample_independent(self, study, trial, param_name, param_distribution):
        return self.inner.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study, trial):
        self.inner.before_trial(study, trial)

    def after_trial(self, study, trial, state, values):
        self.inner.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.inner.reseed_rng()


def make_sampler(settings: StudySettings, space: Space, seed: int) -> BaseSampler:
    """The Optuna sampler of a study (grid and evolution use a random one underneath, which
    never samples: their points arrive as fixed parameters)."""
    name, n = settings.tuner, settings.trials
    if name == "tpe":
        inner = optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True,
                                           n_startup_trials=max(3, min(10, n // 3)))
    elif name == "nsga2":
        inner = optuna.samplers.NSGAIISampler(seed=seed, population_size=max(4, min(50, n // 3)))
    else:  # random, grid, evolution
        inner = optuna.samplers.RandomSampler(seed=seed)
    return DedupeSampler(inner, space, seed)


def make_pruner(settings: StudySettings, steps: int) -> optuna.pruners.BasePruner:
    if settings.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=1)
    if settings.pruner == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=1, max_resource=max(2, steps), reduction_factor=3)
    return optuna.pruners.NopPruner()


class GridProposer:
    """Every point once, in a seeded shuffled order; None when all are in the study.
    With `smaller_batches_first` (plan-only targets) the shuffled order is stably sorted by
    global batch, so that a batch that does not fit rules out the larger ones of the same
    model, mesh and remat before they are compiled (search/planning/screen.py)."""

    def __init__(self, space: Space, seed: int, smaller_batches_first: int | None = None):
        if not space.finite:
            raise TunerError("tuner grid needs a finite space; "
                             f"{', '.join(d.name for d in space.decisions if not d.finite)} "
                             "is continuous (fix it with --set, or use another tuner)")
        self.order = list(space.points())
        random.Random(seed).shuffle(self.order)
        if smaller_batches_first:
            self.order.sort(key=lambda point: _global_batch(space, point, smaller_batches_first))

    def propose(self, space: Space, trials: list[FrozenTrial]) -> dict | None:
        seen = seen_keys(space, trials)
        for point in self.order:
            if decisions_key(point) not in seen:
                return point
        return None

    def size(self) -> int:
        return len(self.order)


def reward(settings: StudySettings, t: FrozenTrial) -> float:
    """The first objective as a reward to maximize (evolution is single-objective)."""
    if t.state != TrialState.COMPLETE or not t.values or kind_of(t.user_attrs).failed:
        return FAILED_REWARD
    v = t.values[0]
    if not math.isfinite(v):
        return FAILED_REWARD
    return v if OBJECTIVES[settings.objectives[0]] == "maximize" else -v


class EvolutionProposer:
    """PyGlove regularized evolution behind the same ask/tell interface."""

    def __init__(self, space: Space, settings: StudySettings, seed: int):
        population = max(4, min(32, settings.trials // 2))
        self.algo = pg.evolution.regularized_evolution(
            population_size=population, tournament_size=max(2, population // 3), seed=seed)
        self.algo.setup(space.dna_spec)
        self.settings = settings
        self._fed: set[int] = set()
        self._own: dict[str, pg.DNA] = {}
        self._rng = random.Random(seed)

    def _sync(self, space: Space, trials: list[FrozenTrial]) -> dict[str, float]:
        """Feed back every finished trial not fed yet; returns rewards by point key."""
        rewards = {}
        for t in trials:
            if is_superseded(t) or not t.state.is_finished():
                continue
            d = trial_decisions(space, t)
            if d is None:
                continue
            key = decisions_key(d)
            rewards[key] = reward(self.settings, t)
            if t.number in self._fed:
                continue
            self._fed.add(t.number)
            dna = self._own.pop(key, None) or _foreign(space.to_dna(d), self.algo.num_proposals)
            self.algo.feedback(dna, rewards[key])
        return rewards

    def propose(self, space: Space, trials: list[FrozenTrial]) -> dict | None:
        rewards = self._sync(space, trials)
        seen = seen_keys(space, trials)
        for _ in range(200):
            dna = self.algo.propose()
            point = space.from_dna(dna)
            key = decisions_key(point)
            if space.excluded(point):
                self.algo.feedback(dna, FAILED_REWARD)
            elif key in rewards:  # already evaluated: its known reward, at no cost
                self.algo.feedback(dna, rewards[key])
            elif key not in seen:
                self._own[key] = dna
                return point
        try:
            return random_unseen(space, seen, self._rng)
        except SpaceExhausted:
            return None


def _foreign(dna: pg.DNA, proposal_id: int) -> pg.DNA:
    """Metadata PyGlove's evolution expects on a DNA it did not propose itself."""
    from pyglove.ext.evolution import base as evo

    evo.set_proposal_id(dna, proposal_id + 1)
    evo.set_generation_id(dna, 1)
    dna.set_metadata(evo.DNA_METADATA_INITIAL_POPULATION, False)
    return dna


def _global_batch(space: Space, point: dict, num_devices: int) -> int:
    from ...trainer import mesh as mesh_lib
    from ...trainer.errors import ConfigError
    from ..study import configio

    try:
        return mesh_lib.global_batch_size(configio.build(space.config(point)), num_devices)
    except (ConfigError, ValueError, TypeError):  # an invalid point: failed by the driver, first
        return 0


def make_proposer(settings: StudySettings, space: Space, seed: int):
    if settings.tuner == "grid":
        from ..planning.targets import parse_target

        target = parse_target(settings.target)
        return GridProposer(space, seed, target.num_devices if target.plan_only else None)
    if settings.tuner == "evolution":
        return EvolutionProposer(space, settings, seed)
    return None


"""How much of a study is left to run: its trial budget against its space, whether a driver
would find a trial to run now, and whether the study is finished (nothing left, nothing running)."""
from __future__ import annotations

from optuna.trial import TrialState

from ..study import storage as storage_lib
from ..study.storage import is_superseded
from ..tuning import steer
from ..tuning.tuners import seen_keys
from .context import StudyContext


def budget_of(ctx: StudyContext) -> tuple[int, int | None]:
    """(trials the study runs, size of its space or None when infinite)."""
    size = ctx.space.size() if ctx.space.finite else None
    return (ctx.settings.trials if size is None else min(ctx.settings.trials, size)), size


def has_work(ctx: StudyContext) -> bool:
    """Whether a driver would find a trial to run now: a queued config, or budget and space left."""
    budget, size = budget_of(ctx)
    with ctx.lock.hold():
        active = [t for t in ctx.study.get_trials(deepcopy=False) if not is_superseded(t)]
        if any(t.state == TrialState.WAITING for t in active):
            return True
        if steer.counted(active) >= budget:
            return False
        if size is not None and len(seen_keys(ctx.space, active)) >= size:
            return False
    return True


def study_finished(ctx: StudyContext) -> bool:
    """No work left and no trial running anywhere (a running one may still be queued again)."""
    running = storage_lib.retry(ctx.study.get_trials, deepcopy=False, states=(TrialState.RUNNING,))
    return not running and not has_work(ctx)

"""What to try next: Optuna samplers and pruners, the grid and PyGlove-evolution proposers
(tuners.py), and steering, which skips trials a compiled prediction says are dominated (steer.py).

The tuners are imported on first use: a trial worker reads steer.py alone and must not import
PyGlove and Optuna for it."""
from __future__ import annotations

from typing import TYPE_CHECKING

from .. import load_export

if TYPE_CHECKING:  # `X as X`: re-exported names, for type checkers
    from .tuners import TunerError as TunerError
    from .tuners import make_proposer as make_proposer
    from .tuners import make_pruner as make_pruner
    from .tuners import make_sampler as make_sampler

_HOMES: dict[str, tuple[str, str | None]] = {
    name: ("tuners", name) for name in ("TunerError", "make_proposer", "make_pruner", "make_sampler")}

__all__ = sorted(_HOMES)


def __getattr__(name: str):
    return load_export(__name__, _HOMES, name)

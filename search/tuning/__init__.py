"""What to try next: Optuna samplers and pruners, the grid and PyGlove-evolution proposers
(tuners.py), and steering, which skips trials a compiled prediction says are dominated (steer.py)."""
from .tuners import TunerError, make_proposer, make_pruner, make_sampler

__all__ = ["TunerError", "make_proposer", "make_pruner", "make_sampler"]

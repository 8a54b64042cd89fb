"""Planning a trial for a target without running it: targets (cpu:N, gpu:N, tpu:<slice>), a
plan compiled for one (targets.py), and screening plans the study already knows (screen.py)."""
from .targets import Target, TargetError, parse_target

__all__ = ["Target", "TargetError", "parse_target"]

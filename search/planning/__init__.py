"""Planning a trial for a target without running it: targets (cpu:N, gpu:N, tpu:<slice>:
targets.py), how a plan is made here (method.py), one point planned (compilation.py plan_point),
planned without compiling (analytic.py), the keys of points that compile alike (keys.py), the
typed plans (plans.py), the plan cache (plan_cache.py), and screening plans the study already
knows (screen.py)."""
from .targets import Target, TargetError, parse_target

__all__ = ["Target", "TargetError", "parse_target"]

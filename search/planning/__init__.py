"""Planning a trial for a target without running it: targets (cpu:N, gpu:N, tpu:<slice>:
targets.py), how a plan is made here (method.py), one point planned (compilation.py plan_point),
planned without compiling (analytic.py), the keys of points that compile alike (keys.py), the
typed plans (plans.py), the plan cache (plan_cache.py), and screening plans the study already
knows (screen.py). Beneath them: compile-only devices (topology.py for TPU slices, gpu_topology.py
for GPU nodes), the compiler's HLO passes alone (hlo_passes.py), the prediction (predict.py) and
the roofline it reads the optimized HLO with (roofline/). Imports run one way, search -> planning
-> trainer: the trainer (the program builder, the hardware table) imports nothing of this package."""
from .targets import Target, TargetError, parse_target

__all__ = ["Target", "TargetError", "parse_target"]

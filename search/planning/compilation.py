"""One point planned for a target: the step compiled for the target's devices, and its prediction.

    program, plan = plan_point(cfg, target)   # the trial's Plan (store/plan.py), PREDICTED figures

plan_point returns per-device memory from XLA's compiler (memory_analysis of the compiled
step, or the buffer assignment of the HLO passes: method.py), `fits` against the chip's HBM,
and a roofline prediction of step time and MFU from the optimized HLO (search/planning/roofline/;
every predicted figure is a prediction of the Plan). A plan over capacity comes back with
fits=False (the caller marks the trial predicted_oom with the numbers); a step the TPU compiler
itself refuses for memory raises topology.PredictedOOM (typed, with required and
available bytes). Where XLA cannot compile for the target here (a GPU node without the CUDA
plugin: targets.planning_notice) the plan is analytic.py's, and there is no Program.

Planning a space is `paxsearch run` on a plan-only target: the driver settles what it
can without compiling (search/planning/screen.py: analytic pre-screen, duplicates, larger
batches of a refused point), worker processes plan the rest in parallel with the
target's environment (targets.target_env) set before JAX is imported, one compile per point
(FLOPs are counted from the optimized HLO with loop trip counts, search/planning/roofline/, so
the two unrolled FLOP probes of build_program(count_flops=True) are not needed).
"""
# trainer.plan and hlo_passes import JAX: they are imported inside plan_point.
from __future__ import annotations

import time
from typing import Sequence

from ...store.plan import Plan
from ...trainer.errors import ConfigError
from . import plans
from . import topology as topo
from .analytic import analytic_plan
from .method import plan_method, plan_method_notice
from .predict import hardware_for, predict
from .targets import Target, mesh_shapes, planning_notice, target_devices


def plan_point(cfg, target: Target, devices: Sequence | None = None, phases: dict | None = None):
    """(Program, Plan) of `cfg` compiled for `target`; (None, analytic_plan) where XLA cannot
    compile for the target here (planning_notice). Raises PredictedOOM when the TPU
    compiler refuses the step for memory, ConfigError when the config cannot run there.
    `phases`, when given, gets the seconds of each phase (PlanResult.phases and predict_s).
    The plan's plan_method says how it was made (method.plan_method); where the HLO passes give
    no plan, the step is compiled in full and its plan_method_note says why."""
    from ...trainer.plan import build_program
    from .hlo_passes import PassesError, build_plan_program

    target = target.for_config(cfg)  # slices=auto: this trial's own slice count
    if planning_notice(target) is not None:  # cannot compile for it here: the analytic plan, no Program
        return None, analytic_plan(cfg, target)
    devices = list(devices) if devices is not None else target_devices(target)
    method, note = plan_method(target), plan_method_notice(target)
    try:
        if method == "hlo_passes":
            try:
                program = build_plan_program(cfg, devices, target.slice_name or "", target.num_slices)
            except PassesError as e:
                method, note = "compiled", f"the HLO passes gave no plan ({e}); compiled in full"
        if method == "compiled":
            program = build_program(cfg, devices, count_flops=False, keep_hlo=True)
    except ConfigError:
        raise
    except Exception as e:
        oom = e if isinstance(e, topo.PredictedOOM) else topo.predicted_oom_from(e, target.hbm_bytes_per_device)
        if oom is None:
            raise
        oom.plan_method = method
        raise oom from None
    result = program.plan
    hbm = target.hbm_bytes_per_device or topo.bytes_limit(devices[0])
    t0 = time.perf_counter()
    prediction = predict(program, hardware_for(devices, target.chip))
    if phases is not None:
        phases.update(result.phases, predict_s=round(time.perf_counter() - t0, 3))
    # the concrete target ("tpu:v5e-256,slices=2" under slices=auto); the compiler: this process's
    plan: Plan = plans.compiled(result, prediction, target=target.name, num_slices=target.num_slices,
                                plan_only=target.plan_only, hbm_bytes=hbm, mesh=mesh_shapes(cfg, target),
                                method=method, note=note)
    return program, plan

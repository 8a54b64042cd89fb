"""Every plan is built here (store/plan.py's Plan), whichever way it was made.

    compiled(result, prediction, target=..., ...)   # a compile for a target: "compiled" or "hlo_passes"
    trained(result, prediction | error)             # the trainer's compile of a trial it trains
    analytic(...)                                   # nothing compiled: state bytes, FLOPs at the chip's rates
    refused(peak_bytes, source, hbm_bytes, method)  # the TPU compiler refused the step for memory
    bound(peak_bytes, source, target, screen, ...)  # a screen's answer: a lower bound, nothing compiled
    cached(stored, target) / duplicate(plan, n)     # another compile's plan, reused

The figures come from the trainer's typed results (trainer/results.py PlanResult, search/planning/predict.py
Prediction); the plan's stored form is store/plan.py's alone.
"""
from __future__ import annotations

from typing import Any, Mapping

from ...store import compiler
from ...store.plan import ANALYTIC, CACHE, COMPILED, STUDY, Plan
from ...trainer.results import PlanResult
from .predict import Prediction

MeshShapes = tuple[tuple[int, ...], tuple[int, ...], tuple[str, ...]]  # (ICI shape, DCN shape, mesh axes)


def _result(result: PlanResult) -> dict[str, Any]:
    """A compile's figures, as Plan fields (in their stored order)."""
    mem = result.memory
    return dict(peak_bytes=int(result.peak_bytes), argument_bytes=int(mem.argument_bytes),
                output_bytes=int(mem.output_bytes), temp_bytes=int(mem.temp_bytes), alias_bytes=int(mem.alias_bytes),
                generated_code_bytes=int(mem.generated_code_bytes),
                xla_flops_per_step=float(result.xla_flops_per_step), flops_source=result.flops_source,
                model_flops_per_step=float(result.model_flops_per_step), param_count=int(result.param_count),
                compile_seconds=float(result.compile_seconds), global_batch=int(result.global_batch),
                tokens_per_step=int(result.tokens_per_step), num_devices=int(result.num_devices),
                device_kind=result.device_kind, platform=result.platform, mesh_shape=dict(result.mesh_shape),
                pipeline_bubble=float(result.pipeline_bubble))


def _prediction(p: Prediction) -> dict[str, Any]:
    """The roofline's prediction, as Plan fields (the executed FLOPs and where they were counted among them)."""
    return dict(xla_flops_per_step=float(p.flops_per_step), xla_bytes_accessed_per_step=float(p.hbm_bytes_per_step),
                flops_source=p.flops_source, peak_flops_per_device=float(p.peak_flops_per_device), predicted=True,
                predicted_step_time=p.step_time_s, predicted_mfu=p.mfu, predicted_tokens_per_sec=p.tokens_per_sec,
                roofline=p.roofline, hlo_source=p.hlo_source)


def compiled(result: PlanResult, prediction: Prediction, *, target: str, num_slices: int, plan_only: bool,
             hbm_bytes: int | None, mesh: MeshShapes, method: str, note: str | None) -> Plan:
    """The plan of a step compiled for a target (`method`: "compiled" or "hlo_passes"; `note`: why
    a plan meant for the HLO passes was compiled in full), with the compiler of this process."""
    fields: dict[str, Any] = dict(target=target, num_slices=int(num_slices), plan_only=plan_only, **_result(result))
    fields.update(hbm_bytes=int(hbm_bytes) if hbm_bytes else None,
                  fits=bool(hbm_bytes is None or result.peak_bytes <= hbm_bytes), **_mesh(mesh))
    fields.update(_prediction(prediction))
    fields.update(plan_method=method, compiler=compiler.made_here())
    if note:
        fields["plan_method_note"] = note
    return Plan.make(**fields)


def trained(result: PlanResult, prediction: Prediction | None, error: str | None = None) -> Plan:
    """The plan of a trial the trainer compiled to train: its compile's figures and the roofline's
    prediction, or (`prediction` None) no predicted figures and the roofline's `error`. The driver
    names the worker's compiler (compiler.named)."""
    fields: dict[str, Any] = dict(**_result(result), predicted_step_time=None, predicted_mfu=None)
    if prediction is not None:
        fields.update(predicted_step_time=prediction.step_time_s, predicted_mfu=prediction.mfu,
                      predicted_tokens_per_sec=prediction.tokens_per_sec, roofline=prediction.roofline)
    else:
        fields.update(roofline={"predicted": True, "error": error})
    fields["plan_method"] = COMPILED
    return Plan.make(**fields)


def analytic(*, target: str, num_slices: int, plan_only: bool, peak_bytes: int, hbm_bytes: int | None,
             peak_bytes_source: str, param_count: int, global_batch: int, num_devices: int,
             model_flops_per_step: float, tokens_per_step: int, device_kind: str, platform: str,
             mesh: MeshShapes, peak_flops_per_device: float, step_time: float, roofline: Mapping[str, Any],
             plan_notice: str | None) -> Plan:
    """A plan that compiled nothing (search/planning/targets.py analytic_plan): memory a lower
    bound, the step time the model's FLOPs at the chip's rates."""
    return Plan.make(
        target=target, num_slices=int(num_slices), plan_only=plan_only, peak_bytes=int(peak_bytes),
        hbm_bytes=hbm_bytes, fits=bool(hbm_bytes is None or peak_bytes <= hbm_bytes),
        peak_bytes_source=peak_bytes_source, param_count=int(param_count), global_batch=int(global_batch),
        num_devices=int(num_devices), model_flops_per_step=model_flops_per_step,
        tokens_per_step=int(tokens_per_step), device_kind=device_kind, platform=platform, **_mesh(mesh),
        peak_flops_per_device=peak_flops_per_device, predicted=True, predicted_step_time=step_time,
        predicted_mfu=model_flops_per_step / num_devices / (step_time * peak_flops_per_device),
        predicted_tokens_per_sec=tokens_per_step / step_time, roofline=dict(roofline), plan_method=ANALYTIC,
        compiler=compiler.NOT_COMPILED, plan_notice=plan_notice)


def refused(peak_bytes: int | None, source: str, hbm_bytes: int | None, method: str) -> Plan:
    """The plan of a step the TPU compiler refused for memory: the bytes it named stand for the peak."""
    return Plan.make(peak_bytes=peak_bytes, predicted=True, peak_bytes_source=f"RESOURCE_EXHAUSTED ({source})",
                     hbm_bytes=hbm_bytes, plan_method=method, compiler=compiler.made_here())


def bound(peak_bytes: int, peak_bytes_source: str, *, target: str, num_slices: int, hbm_bytes: int | None,
          screen: str, method: str, compiler_of: Plan | None = None) -> Plan:
    """A screen's answer that compiled nothing: a lower bound of the peak and where it comes from.
    ANALYTIC names no compiler; a bound from an earlier trial's plan (`compiler_of`) names its
    compiler when that plan does."""
    fields: dict[str, Any] = dict(peak_bytes=peak_bytes, hbm_bytes=hbm_bytes, predicted=True, target=target,
                                  num_slices=num_slices, screen=screen, plan_method=method)
    if method == ANALYTIC:
        fields["compiler"] = compiler.NOT_COMPILED
    fields["peak_bytes_source"] = peak_bytes_source
    if compiler_of is not None and compiler_of.has("compiler"):
        fields["compiler"] = compiler_of.compiler
    return Plan.make(**fields)


def duplicate(plan: Plan, number: int) -> Plan:
    """An earlier trial's plan of the same compiled step, reused."""
    return plan.with_(screen=f"duplicate of trial {number}", plan_method=STUDY)


def cached(stored: Plan, target: str, num_slices: int) -> Plan:
    """A plan from the persistent plan cache, on this trial's target (a record written before plans
    named their compiler: the cache key holds this machine's versions)."""
    return stored.with_defaults(compiler=compiler.made_here()).with_(
        target=target, num_slices=num_slices, screen="plan cache", plan_method=CACHE)


def _mesh(mesh: MeshShapes) -> dict[str, Any]:
    ici, dcn, axes = mesh
    return dict(ici_mesh=tuple(ici), dcn_mesh=tuple(dcn), mesh_axes=tuple(axes))

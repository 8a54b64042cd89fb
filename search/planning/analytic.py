"""A point planned without compiling: what parameters, gradients and optimizer state alone need.

    oom = prescreen(cfg, target)          # PredictedOOM when the state alone exceeds the HBM, else None
    plan = analytic_plan(cfg, target)     # a GPU node XLA cannot compile for here: a labelled lower bound

Both start no JAX compile (trainer.mesh is imported inside them, for the mesh's axis sizes).
"""
from __future__ import annotations

from ...store.plan import Plan
from ...trainer import flops as flops_lib
from ...trainer import hardware
from ...trainer.state_memory import dtype_bytes, train_state_bytes
from . import plans
from . import topology as topo
from .targets import Target, memory_limit, mesh_shapes, planning_notice


def state_bytes(cfg, target: Target) -> tuple[int, int, int, str]:
    """(bytes per device, shards, parameters, what the moments are) of what a train step keeps
    in device memory at the update: parameters, gradients and AdamW moments, without compiling.
    A lower bound of the compiled peak (activations are not counted)."""
    from ...trainer import mesh as mesh_lib

    sizes = mesh_lib.axis_sizes(cfg.mesh, target.num_devices)
    # weights: embed over fsdp x context, heads/mlp/vocab over tensor, the layers over pipeline
    # stages (so a lower bound: embeddings are not split over stage)
    shards = sizes["fsdp"] * sizes["context"] * sizes["tensor"] * sizes["stage"]
    # the expert axis shards every weight too: a MoE layer's experts, and the dense weights' embed dim
    # (trainer/sharding.py); 1 for a dense model
    shards *= sizes.get("expert", 1)
    params = flops_lib.param_count(cfg.model)
    # params + gradients + two AdamW moments (trainer/state_memory.py): ZeRO-1 shards the moments
    # over data too; offloaded moments are in host memory
    opt = cfg.optimizer
    moment_shards = shards * (sizes["data"] if opt.zero1 else 1)
    need = train_state_bytes(params, dtype_bytes(cfg.model.param_dtype), shards, moment_shards, opt.offload_state)
    moments = ("AdamW moments (offloaded: not counted)" if opt.offload_state else
               f"AdamW moments (ZeRO-1: over {moment_shards} shards)" if opt.zero1 else "AdamW moments")
    return need, shards, params, moments


def mesh_shapes_expert(cfg, target: Target) -> int:
    """The expert axis size of `cfg` on `target` (1 for a dense model)."""
    from ...trainer import mesh as mesh_lib

    return mesh_lib.axis_sizes(cfg.mesh, target.num_devices).get("expert", 1)


def prescreen(cfg, target: Target, limit_bytes: int | None = None) -> topo.PredictedOOM | None:
    """A PredictedOOM when parameters, gradients and AdamW moments alone exceed the HBM of
    one device (or `limit_bytes`, when smaller), without compiling; None when the point may
    fit. Call it on a point that passed trainer.validate.check (the driver's static checks)."""
    target = target.for_config(cfg)
    hbm, what = memory_limit(target.hbm_bytes_per_device, limit_bytes)
    if hbm is None:
        return None
    need, shards, params, moments = state_bytes(cfg, target)
    if need <= hbm:
        return None
    return topo.PredictedOOM(
        f"predicted OOM (analytic, not compiled): {params:,} parameters with gradients and {moments} "
        f"need {need / topo.GiB:.2f} GiB per device over fsdp x context x tensor x stage"
        f"{' x expert' if mesh_shapes_expert(cfg, target) > 1 else ''} = {shards} shards, above "
        f"{hbm / topo.GiB:.2f} GiB {what}", need, hbm, "analytic")


def analytic_plan(cfg, target: Target) -> Plan:
    """The plan of `cfg` on `target` without compiling (a GPU node where XLA cannot compile for
    it: planning_notice): memory is state_bytes' lower bound (parameters, gradients, AdamW
    moments; no activations), FLOPs the model's (trainer/flops.py), and the step time those
    FLOPs at the chip's rates (peak x measured matmul efficiency; the causal attention's at the
    attention kernels' measured efficiency, trainer/hardware.py), with no memory-bound work and no
    communication: an optimistic bound, labelled analytic."""
    from ...trainer import mesh as mesh_lib

    target = target.for_config(cfg)
    entry = hardware.spec(target.chip or "")
    need, shards, params, moments = state_bytes(cfg, target)
    batch = mesh_lib.global_batch_size(cfg, target.num_devices)
    model_flops = float(flops_lib.model_flops_per_step(cfg.model, batch))
    attention = float(flops_lib.attention_flops_per_step(cfg.model, batch))
    peak = entry.peak_bf16_flops.value
    attention_eff = (entry.attention_efficiency or entry.matmul_efficiency).value
    step = ((model_flops - attention) / (peak * entry.matmul_efficiency.value)
            + attention / (peak * attention_eff)) / target.num_devices
    hbm = target.hbm_bytes_per_device
    return plans.analytic(
        target=target.name, num_slices=target.num_slices, plan_only=target.plan_only, peak_bytes=need,
        hbm_bytes=hbm, peak_bytes_source=f"lower bound: {params:,} parameters, gradients and {moments} over {shards} "
                                         "shards (no activations)",
        param_count=params, global_batch=batch, num_devices=target.num_devices, model_flops_per_step=model_flops,
        tokens_per_step=batch * cfg.model.seq_len, device_kind=entry.device_kinds[0], platform=target.platform,
        mesh=mesh_shapes(cfg, target), peak_flops_per_device=peak, step_time=step,
        roofline={"predicted": True, "hardware": entry.name, "method": "analytic", "compute_s": step,
                  "step_time_s": step,
                  "source": f"model FLOPs at {peak / 1e12:g} TFLOP/s x matmul efficiency "
                            f"{entry.matmul_efficiency.value:g}, their causal attention at x attention "
                            f"efficiency {attention_eff:g}; trainer/hardware.py: "
                            f"{entry.peak_bf16_flops.source}; {entry.matmul_efficiency.source}"},
        plan_notice=planning_notice(target))

"""The keys of points that compile to the same step, on one target.

    plan_key, shape_key, global_batch = plan_keys(cfg, target)

A study compiles each plan key once (search/planning/screen.py: duplicates, larger batches of a
refused shape) and the plan cache keys its records by it (plan_cache.py). Importing this module
starts no JAX.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json

from ...trainer.config import MLA_FIELDS, MOE_FIELDS, compact_shape
from .targets import Target


def plan_keys(cfg, target: Target) -> tuple[str, str, int]:
    """(plan key, shape key, global batch). Points with the same plan key compile to the same
    step: model, resolved mesh, sharding rules, global batch, remat, flag set, memory knobs and
    pipeline on the same target (optimizer numbers, steps, seeds, data and logging do not change
    the compiled program's memory or FLOPs: the batch always carries segment ids and positions,
    and AdamW with clipping is the one optimizer). Points
    with the same shape key differ at most in their global batch, and a step's memory does
    not shrink as its batch grows: a batch that cannot fit rules out every larger one."""
    from ...trainer import mesh as mesh_lib

    target = target.for_config(cfg)  # slices=auto: keyed by the trial's concrete target
    ici, dcn = mesh_lib.resolve_shapes(cfg.mesh, target.num_devices)
    batch = mesh_lib.global_batch_size(cfg, target.num_devices)
    model = dataclasses.asdict(cfg.model)
    if model.get("vocab_tiles") == 1:  # the default: keys of studies made before vocab tiling stay the same
        del model["vocab_tiles"]
    if model.get("quantization") == "none":  # the default: keys of studies made before quantization stay the same
        del model["quantization"]
    if not model.get("n_experts"):  # a dense model: keys of studies made before mixtures of experts stay the same
        for name in MOE_FIELDS:
            model.pop(name, None)
    if model.get("attention_type") == "mha":  # standard attention: keys of studies made before MLA stay the same
        for name in MLA_FIELDS:
            model.pop(name, None)
    # compact_shape: a mesh without stage or context keys as the 3-entry shape earlier releases
    # stored, so a resumed study still finds their plans
    key = {"target": target.name, "model": model, "ici": list(compact_shape(ici)), "dcn": list(compact_shape(dcn)),
           "remat": cfg.remat}
    if cfg.mesh.rules != "default":  # activation sharding changes the compiled step; keyed only when set
        key["rules"] = cfg.mesh.rules
    if cfg.flags != "default":  # a compiler flag set changes the compiled step
        key["flags"] = cfg.flags
    # the memory knobs change the compiled step; keyed only when set, like flags
    knobs = {"grad_accum_steps": (cfg.grad_accum_steps, 1), "zero1": (cfg.optimizer.zero1, False),
             "offload_state": (cfg.optimizer.offload_state, False), "offload_params": (cfg.offload_params, False)}
    key.update({k: v for k, (v, default) in knobs.items() if v != default})
    pipeline = dataclasses.asdict(cfg.pipeline)
    if pipeline != dataclasses.asdict(type(cfg.pipeline)()):  # microbatches, repeats, schedule
        key["pipeline"] = pipeline

    def digest(d: dict) -> str:
        return hashlib.sha1(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]

    return digest({**key, "global_batch": batch}), digest(key), batch


def plan_key(cfg, target: Target) -> str:
    """See plan_keys."""
    return plan_keys(cfg, target)[0]

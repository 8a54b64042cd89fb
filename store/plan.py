"""A trial's plan: one typed value for every way a plan is made, and its one stored form.

    plan = Plan.make(peak_bytes=..., fits=True, plan_method="compiled", ...)  # search/planning/make.py builds them
    plan.peak_bytes, plan.predicted_mfu, plan.compiler                          # typed reads
    plan.with_(screen="plan cache", plan_method="cache")                        # a changed copy
    d = plan.to_stored()              # the dict a study stores (Optuna user attribute "plan"), the plan cache's
    plan = Plan.from_stored(d)        # any stored plan, of this release or an older one

A plan is what is known of one train step before it runs: whether it fits (`fits`, against
`hbm_bytes`), its per-device memory (XLA's compiled figures, or a lower bound and where it
comes from), its FLOPs (the model's, and what XLA executes with where they were counted), the
roofline's predicted step time / MFU / tokens per second with its buckets (`roofline`, a dict:
its schema is the roofline's own, search/planning/roofline/), how it was made (`plan_method`:
"compiled", "hlo_passes", "cache", "study", "analytic") and the compiler it was made with
(`compiler`, store/compiler.py).

The stored form is the dict studies have stored since the first release, key for key: a plan
stores the keys it was made with (`keys`, in their order), so a plan made by a screen (a peak
and its source) stores no memory breakdown, and one read from an older study writes back the
keys it had, no more. A plan stored before plans named their compiler reads with compiler
UNKNOWN and stores none; keys this release does not know are kept as they were (`extra`).
This module is the one place a plan's fields are read or written by their stored names.
Pure: imports neither JAX nor anything of paxsearch outside store/.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from . import compiler as compiler_lib

# plan_method values
COMPILED = "compiled"  # a full compile (a worker's, or the trainer's of a trial it trains)
HLO_PASSES = "hlo_passes"  # the compiler's HLO passes on compile-only TPU devices (search/planning/hlo_passes.py)
CACHE = "cache"  # the persistent plan cache (search/planning/plan_cache.py)
STUDY = "study"  # an earlier trial of the same study: a duplicate, or a smaller batch that did not fit
ANALYTIC = "analytic"  # nothing compiled: parameters, gradients and moments, FLOPs at the chip's rates


@dataclass(frozen=True)
class Plan:
    """One planned train step; every field None where the plan has no such figure (see `keys`)."""

    # ----- where: the target, its devices and the trial's mesh
    target: str | None = None  # the concrete target ("tpu:v5e-256,slices=2"); None: a trained trial's devices
    num_slices: int | None = None
    plan_only: bool | None = None  # compiled for, never run
    num_devices: int | None = None
    device_kind: str | None = None
    platform: str | None = None
    mesh_shape: Mapping[str, int] | None = None  # axis -> size
    ici_mesh: tuple[int, ...] | None = None
    dcn_mesh: tuple[int, ...] | None = None
    mesh_axes: tuple[str, ...] | None = None
    # ----- memory, per device
    peak_bytes: int | None = None  # compiled peak (arguments + outputs - aliases + temporaries + code), or a bound
    peak_bytes_source: str | None = None  # where a peak that is not XLA's memory analysis comes from
    argument_bytes: int | None = None
    output_bytes: int | None = None
    temp_bytes: int | None = None
    alias_bytes: int | None = None
    generated_code_bytes: int | None = None
    hbm_bytes: int | None = None  # the chip's usable HBM (or the device's limit) the plan is held against
    fits: bool | None = None  # peak_bytes <= hbm_bytes
    # ----- FLOPs and sizes
    model_flops_per_step: float | None = None  # analytic, the whole step over all devices (trainer/flops.py)
    xla_flops_per_step: float | None = None  # per device, what XLA executes
    xla_bytes_accessed_per_step: float | None = None  # per device
    flops_source: str | None = None  # how xla_flops_per_step was counted (trainer/results.py FLOPS_*)
    param_count: int | None = None
    global_batch: int | None = None
    tokens_per_step: int | None = None
    pipeline_bubble: float | None = None
    compile_seconds: float | None = None
    # ----- the prediction (every figure a prediction; `predicted` says so)
    predicted: bool | None = None
    peak_flops_per_device: float | None = None
    predicted_step_time: float | None = None  # seconds; None when the roofline could not read the HLO
    predicted_mfu: float | None = None
    predicted_tokens_per_sec: float | None = None
    roofline: Mapping[str, Any] | None = None  # the roofline's buckets and notes (its own schema), or its error
    hlo_source: str | None = None  # where the optimized HLO came from
    # ----- how it was made
    plan_method: str | None = None  # COMPILED, HLO_PASSES, CACHE, STUDY, ANALYTIC
    plan_method_note: str | None = None  # why a plan meant for the HLO passes was compiled in full
    plan_notice: str | None = None  # why a target was planned analytically
    screen: str | None = None  # what settled a trial without compiling ("analytic", "plan cache", ...)
    compiler: compiler_lib.Stored = compiler_lib.UNKNOWN  # {jax, jaxlib, libtpu}, NOT_COMPILED or UNKNOWN
    # ----- the stored form
    keys: tuple[str, ...] = ()  # the stored keys this plan has, in their stored order
    extra: Mapping[str, Any] = field(default_factory=dict)  # stored keys this release does not know

    # ----- building
    @classmethod
    def make(cls, **fields: Any) -> Plan:
        """A plan of `fields` (stored in the order given; fields not given are not stored)."""
        unknown = set(fields) - set(FIELDS)
        if unknown:
            raise TypeError(f"Plan has no field {sorted(unknown)}")
        return cls(**fields, keys=tuple(fields))

    def with_(self, **fields: Any) -> Plan:
        """This plan with `fields` set (a field it did not store is stored after its own, like a
        dict update)."""
        plan = Plan.make(**fields)
        return dataclasses.replace(self, **fields, keys=self.keys + tuple(k for k in plan.keys if k not in self.keys))

    def with_defaults(self, **fields: Any) -> Plan:
        """This plan with those of `fields` it does not store set, stored before its own."""
        missing = {k: v for k, v in fields.items() if k not in self.keys}
        return dataclasses.replace(self, **missing, keys=tuple(missing) + self.keys)

    def without(self, *names: str) -> Plan:
        """This plan without the stored fields `names` (their values back to the defaults)."""
        defaults: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(Plan) if f.name in names}
        return dataclasses.replace(self, **defaults, keys=tuple(k for k in self.keys if k not in names))

    def has(self, name: str) -> bool:
        """Whether the plan stores field `name` (a None it stores counts)."""
        return name in self.keys

    # ----- the storage boundary
    def to_stored(self) -> dict:
        """The stored dict: the plan's keys in their order (tuples as lists), then `extra`."""
        out: dict = {}
        for key in self.keys:
            value = getattr(self, key)
            if key in _TUPLES and value is not None:
                value = list(value)
            elif key in _DICTS and value is not None:
                value = dict(value)
            out[key] = value
        out.update(self.extra)
        return out

    @classmethod
    def from_stored(cls, d: Mapping | None) -> Plan | None:
        """The plan of a stored dict (None for None). Keys an older release did not store read as
        None (the compiler as UNKNOWN) and are not stored again; unknown keys are kept in `extra`."""
        if d is None:
            return None
        fields: dict = {}
        extra: dict = {}
        for key, value in d.items():
            if key not in FIELDS:
                extra[key] = value
                continue
            if key in _TUPLES and isinstance(value, list):
                value = tuple(value)
            elif key == "compiler":
                value = compiler_lib.read(value)
            fields[key] = value
        return cls(**fields, keys=tuple(fields), extra=extra)

    # ----- reads
    @property
    def settled_without_compiling(self) -> bool:
        """A screen's answer (analytic, a duplicate, the cache, a dominated batch): nothing compiled here."""
        return self.screen is not None


FIELDS = tuple(f.name for f in dataclasses.fields(Plan) if f.name not in ("keys", "extra"))
_TUPLES = frozenset({"ici_mesh", "dcn_mesh", "mesh_axes"})
_DICTS = frozenset({"mesh_shape", "roofline"})

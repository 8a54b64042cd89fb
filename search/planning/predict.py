"""A compiled step's predicted time and MFU: the roofline (search/planning/roofline/) over its optimized
HLO, priced with one device's figures (trainer/hardware.py).

    hw = hardware_for(devices, chip="v5e")     # or chip=None: from the devices' kind
    prediction = predict(program, hw)          # program: plan.build_program(..., keep_hlo=True)
    program = build_program(cfg, hlo_flops=hlo_cost)   # the trainer counts executed FLOPs with this reader

Every figure here is a prediction; a study's plan (search/planning/plans.py) keeps them as its
predicted_* figures and its roofline dict, which carries "predicted": True."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ...trainer import flops as flops_lib
from ...trainer import hardware
from ...trainer.results import FLOPS_FROM_HLO
from . import topology
from .roofline import Hardware, analyze, device_coords, step_work


@dataclass(frozen=True)
class Prediction:
    step_time_s: float | None  # None when the optimized HLO could not be read (see roofline["error"])
    mfu: float | None
    tokens_per_sec: float | None
    flops_per_step: float  # per device: the optimized HLO with loop trip counts, else XLA's cost_analysis
    hbm_bytes_per_step: float
    flops_source: str
    peak_flops_per_device: float
    roofline: dict
    hlo_source: str | None  # "as_text" | "hlo_modules" | "xla_dump" | None (plan.optimized_hlo)


def predict(program: Any, hw: Hardware) -> Prediction:
    """The roofline's prediction of a compiled program (built with keep_hlo=True) on devices of
    `hw`. An HLO the parser cannot read leaves the predictions None with the reason under
    roofline["error"], and the FLOPs XLA's cost_analysis; the plan itself stands."""
    plan = program.plan
    num_devices = plan.num_devices
    roof, error = None, None
    if plan.hlo_text is None:  # the compile stands; only its optimized HLO could not be had
        error = f"roofline failed: {plan.hlo_error or 'no optimized HLO'}"
    else:
        try:
            roof = analyze(plan.hlo_text, hw, mesh=program.mesh, num_devices=num_devices)
        except (ValueError, KeyError, IndexError, TypeError) as e:
            error = f"roofline failed: {type(e).__name__}: {e}"
    if roof is None:
        return Prediction(None, None, None, float(plan.xla_flops_per_step), float(plan.xla_bytes_accessed_per_step),
                          plan.flops_source, float(hw.peak_flops),
                          {"predicted": True, "error": error}, plan.hlo_source)
    step = roof.step_time_s
    mfu = roof.predicted_mfu(plan.model_flops_per_step, num_devices, hw.peak_flops)
    return Prediction(float(step) if step else None, float(mfu) if mfu is not None else None,
                      float(plan.tokens_per_step / step) if step else None, float(roof.flops_per_step),
                      float(roof.hbm_bytes_per_step), FLOPS_FROM_HLO, float(hw.peak_flops),
                      roof.to_dict(), plan.hlo_source)


def hlo_cost(hlo_text: str) -> tuple[float, float] | None:
    """(executed FLOPs, HBM bytes) per device of one step, read from its optimized module with every
    loop's trip count applied (the roofline's step_work), or None where the text cannot be read or
    a loop's trip count is unknown. What the trainer's build_program(hlo_flops=...) counts the
    executed FLOPs with (trainer/plan.py: one compile, no unrolled probes)."""
    try:
        work = step_work(hlo_text)
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    return None if work.unknown_trip_counts else (work.flops_per_step, work.hbm_bytes_per_step)


def hardware_for(devices: Sequence, chip: str | None = None) -> Hardware:
    """The roofline's figures of one device: trainer/hardware.py's entry for `chip` (a TPU
    target's chip name) or for the devices' kind; simulated CPU devices get the host's
    measured memory bandwidth (collectives are memory copies) and the measured matmul peak
    (matmul efficiency 1: that peak is itself a sustained matmul rate)."""
    entry = hardware.TABLE.get(chip or "") or hardware.find_device_kind(devices[0].device_kind)
    if entry is not None:
        return Hardware(name=entry.name, peak_flops=entry.peak_bf16_flops.value,
                        hbm_bandwidth=entry.hbm_bandwidth.value, ici_link_bandwidth=entry.ici_link_bandwidth,
                        dcn_bandwidth=entry.dcn_bandwidth.value, physical_dims=int(entry.torus_dims.value),
                        ici_latency_s=entry.ici_latency_s.value, dcn_latency_s=entry.dcn_latency_s.value,
                        matmul_efficiency=entry.matmul_efficiency.value,
                        hbm_efficiency=entry.hbm_efficiency.value,
                        hbm_read_efficiency=entry.hbm_read_efficiency.value if entry.hbm_read_efficiency else None,
                        hbm_write_efficiency=entry.hbm_write_efficiency.value if entry.hbm_write_efficiency else None,
                        ici_efficiency=entry.ici_efficiency.value if entry.ici_efficiency else 1.0,
                        attention_efficiency=entry.attention_efficiency.value if entry.attention_efficiency else None,
                        attention_rates=entry.attention_table(),
                        attention_grid=hardware.splash_grid_table(entry.attention_grid or ()),
                        index_rows=entry.index_table(),
                        unsorted_index=tuple((k, f.value) for k, f in entry.unsorted_index or ()),
                        ragged_shares=tuple((r.k, r.n, r.forward.value, r.backward.value)
                                            for r in entry.ragged_rates or ()),
                        megablox_shares=tuple((r.k, r.n, r.forward.value, r.backward.value)
                                              for r in entry.megablox_rates or ()),
                        int8_speedup=(entry.peak_int8_ops.value / entry.peak_bf16_flops.value
                                      if entry.peak_int8_ops else 1.0),
                        host_bandwidth=entry.host_bandwidth.value if entry.host_bandwidth else None,
                        clock_hz=entry.clock_hz.value if entry.clock_hz else None,
                        vpu_cycles=tuple((k, f.value) for k, f in entry.vpu_cycles or ()),
                        attention_in_step=tuple((k, f.value) for k, f in entry.attention_in_step or ()),
                        attention_step_grid=hardware.splash_grid_table(entry.attention_step_grid or ()),
                        dma_overlap=entry.dma_overlap,
                        torus_wrap=_torus_wrap(devices, entry.name))
    local = sum(1 for d in devices if getattr(d, "process_index", 0) == devices[0].process_index)
    peak, _ = flops_lib.peak_flops_per_device(devices[0].device_kind, devices[0].platform, local)
    bw = host_memory_bandwidth() / max(local, 1)
    return Hardware(name=devices[0].platform, peak_flops=peak, hbm_bandwidth=bw, ici_link_bandwidth=bw / 2,
                    dcn_bandwidth=bw / 2, physical_dims=1)


def _torus_wrap(devices: Sequence, chip: str) -> tuple[bool, ...] | None:
    """Which torus dims of the devices' slice wrap (topology.torus_wrap of its shape, read from
    the devices' coordinates), None where they have none (GPUs, no devices given)."""
    spec, coords = topology.CHIPS.get(chip), device_coords(devices)
    if spec is None or coords is None:
        return None
    shape = tuple(max(c[k] for c in coords) - min(c[k] for c in coords) + 1 for k in range(len(coords[0])))
    return topology.torus_wrap(spec, shape)


_HOST_BW: list[float] = []


def host_memory_bandwidth() -> float:
    """Copy bandwidth of this host (read + write bytes per second), measured once per process."""
    if not _HOST_BW:
        a = np.ones(1 << 24, dtype=np.float32)  # 64 MiB
        b = np.empty_like(a)
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            np.copyto(b, a)
            best = min(best, time.perf_counter() - t)
        _HOST_BW.append(2 * a.nbytes / best)
    return _HOST_BW[0]

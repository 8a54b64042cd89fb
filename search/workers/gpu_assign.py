"""Which GPUs each trial worker of one driver gets: `--workers K --target gpu:N` gives worker k
the k-th N of the GPUs this machine shows, by CUDA_VISIBLE_DEVICES set before its backend
starts, so an 8-GPU node runs eight 1-GPU trials or two 4-GPU trials at once. JAX-free.

    visible = visible_gpus()                      # ["0", ..., "7"], or ["GPU-3f..", ...]
    plan = assign(workers=2, per_trial=4, per_process=4, visible=visible)
    plan[1][0]                                    # "4,5,6,7": worker 1, its process 0
"""
from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess

from ..errors import UserError


class GpuAssignError(UserError, ValueError):
    """The GPUs asked for are not there (one line for the user)."""


def visible_gpus(environ: dict | None = None) -> list[str] | None:
    """The GPUs this machine shows, as CUDA_VISIBLE_DEVICES entries: the variable itself
    when set (its entries, in order), else one index per NVIDIA device (`nvidia-smi -L`,
    or /dev/nvidia<N> files). None when nothing can tell (no driver on this machine)."""
    env = os.environ if environ is None else environ
    if "CUDA_VISIBLE_DEVICES" in env:
        text = env["CUDA_VISIBLE_DEVICES"].strip()
        return [d.strip() for d in text.split(",") if d.strip()] if text else []
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20).stdout
            lines = [line for line in out.splitlines() if line.startswith("GPU ")]
            if lines:
                return [str(i) for i in range(len(lines))]
        except (OSError, subprocess.SubprocessError):
            pass
    nodes = [p for p in glob.glob("/dev/nvidia*") if re.fullmatch(r"/dev/nvidia\d+", p)]
    return [str(i) for i in range(len(nodes))] if nodes else None


def assign(workers: int, per_trial: int, per_process: int, visible: list[str] | None) -> list[list[str]]:
    """For each of `workers` workers, for each of its processes, the CUDA_VISIBLE_DEVICES
    value: worker k takes visible[k*per_trial:(k+1)*per_trial], its process p the p-th
    `per_process` of those. GpuAssignError when they do not fit."""
    if visible is None:
        raise GpuAssignError(f"--target gpu:{per_trial} needs NVIDIA GPUs and none are visible here "
                             "(no CUDA_VISIBLE_DEVICES, nvidia-smi or /dev/nvidia*); use --target cpu:N")
    need = workers * per_trial
    if need > len(visible):
        raise GpuAssignError(f"--workers {workers} x --target gpu:{per_trial} needs {need} GPUs and "
                             f"{len(visible)} are visible ({','.join(visible) or 'none'}); use "
                             f"--workers {max(1, len(visible) // per_trial)} or a smaller gpu:N")
    plan = []
    for k in range(workers):
        mine = visible[k * per_trial:(k + 1) * per_trial]
        plan.append([",".join(mine[p:p + per_process]) for p in range(0, per_trial, per_process)])
    return plan


def for_target(target, workers: int, processes: int) -> list[list[str]] | None:
    """assign() for a study's local workers on `target` (a search.targets.Target); None when
    the target is not a GPU one run here."""
    if target.platform != "gpu" or target.plan_only:
        return None
    return assign(workers, target.num_devices, target.devices_per_process(processes), visible_gpus())

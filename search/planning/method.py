"""How a plan of a target is made here: from the compiler's HLO passes or by a full compile.

    method = plan_method(target)          # "hlo_passes" | "compiled"
    notice = plan_method_notice(target)   # one line when the installed libtpu forces a full compile

A plan-only TPU target (compile-only devices, no TPU hardware) is planned from the HLO passes
(search/planning/hlo_passes.py) when the installed libtpu is one the passes were proven on and the
study's `plan_compile` setting is not "full"; everything else compiles in full. Importing this
module starts no JAX.
"""
from __future__ import annotations

import os

from ...store.compiler import package_version
from . import topology as topo
from .targets import Target

PLAN_COMPILE_ENV = "PAXSEARCH_PLAN_COMPILE"  # the study's plan_compile, for its workers


def use_plan_compile(setting: str) -> None:
    """Apply a study's `plan_compile` setting ("passes" or "full") to this process and the
    workers it starts."""
    os.environ[PLAN_COMPILE_ENV] = setting


# The libtpu versions on which plans from the HLO passes were proven equal to the full compile on every
# published row (benchmarks/bench_plan_method.py; benchmarks/RESULTS.md, "Plans from the HLO passes").
# Under 0.0.42.1 they are not: the passes' buffer assignment held 18-50% fewer temporaries than the
# full compile's (RESULTS, "v6e measured"); another version compiles in full until it is proven.
PASSES_PROVEN_LIBTPU = ("0.0.52",)


def _passes_apply(target: Target, environ=None) -> bool:
    setting = (os.environ if environ is None else environ).get(PLAN_COMPILE_ENV, "passes")
    return setting != "full" and target.platform == "tpu" and target.plan_only and not topo.has_tpu_hardware()


def libtpu_unproven_line(libtpu: str | None = None) -> str | None:
    """One line when the installed libtpu (or `libtpu`, a version) is not one the HLO passes were
    proven on (PASSES_PROVEN_LIBTPU); None when it is, or when there is no libtpu."""
    libtpu = libtpu if libtpu is not None else package_version("libtpu")
    if libtpu is None or libtpu in PASSES_PROVEN_LIBTPU:
        return None
    return (f"libtpu {libtpu}: plans from the HLO passes are proven equal to the full compile on libtpu "
            f"{', '.join(PASSES_PROVEN_LIBTPU)} only (under 0.0.42 they held 18-50% fewer temporaries), so TPU "
            f"plans compile in full here (exact, slower); install libtpu=={PASSES_PROVEN_LIBTPU[-1]} for plans in "
            "seconds")


def plan_method_notice(target: Target, environ=None, libtpu: str | None = None) -> str | None:
    """The one line a plan-only TPU target gets when its plans compile in full only because of the
    installed libtpu (libtpu_unproven_line); None otherwise."""
    return libtpu_unproven_line(libtpu) if _passes_apply(target, environ) else None


def plan_method(target: Target, environ=None, libtpu: str | None = None) -> str:
    """How a plan of `target` is made here: "hlo_passes" (compile-only TPU devices with a libtpu the
    passes were proven on, unless plan_compile is "full": search/planning/hlo_passes.py) or "compiled" (a full
    compile)."""
    return ("hlo_passes" if _passes_apply(target, environ) and libtpu_unproven_line(libtpu) is None
            else "compiled")

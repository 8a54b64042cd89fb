"""`paxsearch train RUN --trial N` on a TPU machine: a plan made with another libtpu is re-checked.

    found = planned_recheck(source, number, platform)   # None: nothing to re-check
    print(found.line)                                    # before compiling
    ...program = build_program(cfg)...                    # the local compiler: the re-check itself
    check_recheck(found, program.plan.peak_bytes, limit_bytes, limit_source)   # RecheckRefused

The logic and the lines are store/compiler.py's (pure); this module reads the trial's stored
plan and raises the typed error.
"""
from __future__ import annotations

from ...store import compiler
from ...store.outcome import plan_of
from ...store.plan import Plan
from ..errors import UserError


class RecheckRefused(UserError):
    """The local compiler's step of a planned trial exceeds this machine's chip (one line, both figures)."""


def stored_plan(source: str, number: int) -> Plan | None:
    """The plan trial `number` of the study at `source` (run folder or storage URL) stored, or None."""
    from ...analysis.load import open_study

    study = open_study(source).study
    for t in study.get_trials(deepcopy=False):
        if t.number == number:
            return plan_of(t.user_attrs)
    return None


def planned_recheck(source: str | None, number: int | None, platform: str,
                    local_libtpu: str | None = None) -> compiler.Recheck | None:
    """The re-check a stored trial needs before it trains on this machine (compiler.recheck), or
    None: not a stored trial, no TPUs here, or a plan of this machine's libtpu (or of none named)."""
    if source is None or number is None or platform != "tpu":
        return None
    local = local_libtpu if local_libtpu is not None else compiler.package_version("libtpu")
    return compiler.recheck(stored_plan(source, number), number, local, platform)


def check_recheck(found: compiler.Recheck | None, local_bytes: int, limit_bytes: int, limit_source: str) -> None:
    """RecheckRefused (one line: planned and local bytes, the chip's limit) when the re-checked step does not fit."""
    line = found.refusal(local_bytes, limit_bytes, limit_source) if found is not None else None
    if line is not None:
        raise RecheckRefused(f"{line}; plan it again with this machine's libtpu (README: \"A plan is only as good "
                             "as its compiler\") or train another trial")

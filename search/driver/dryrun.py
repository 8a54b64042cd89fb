"""Static feasibility of a space's points (no compilation): `run --dry-run` and the pre-flight
check that refuses a space none of whose points can run on the target."""
from __future__ import annotations

from typing import Iterator

from ..planning.targets import Target
from ..study import configio
from ..study.data_check import data_problem
from ..study.settings import OBJECTIVES, StudySettings, format_bytes
from ..study.space import Space, SpaceError

PREFLIGHT_MAX_POINTS = 5000


def static_message(space: Space, point: dict, target: Target, processes: int) -> str | None:
    """None when the point passes trainer.validate.check on the target, else why not."""
    from ...trainer import validate
    from ...trainer.errors import ConfigError

    try:
        cfg = configio.build(space.config(point))
        target = target.for_config(cfg)  # slices=auto: the point's own slice count
        validate.check(cfg, target.num_devices, target.platform, processes)
    except (ConfigError, SpaceError) as e:
        return str(e)
    return data_problem(cfg.data)


def static_status(space: Space, target: Target, processes: int) -> Iterator[tuple[dict, str | None]]:
    for point in space.points():
        yield point, static_message(space, point, target, processes)


def preflight(space: Space, target: Target, processes: int) -> str | None:
    """An error line when no point of a (not too large) finite space passes the static checks."""
    if not space.finite or (space.raw_size() or 0) > PREFLIGHT_MAX_POINTS:
        return None
    first = None
    for point, msg in static_status(space, target, processes):
        if msg is None:
            return None
        first = first or (point, msg)
    if first is None:
        return "the space has no point left (its constraint or --set excludes every point)"
    point, msg = first
    shown = " ".join(f"{k}={v}" for k, v in point.items())
    return f"no point of the space can run on {target.text}: e.g. {shown}: {msg}"


def describe(space: Space, settings: StudySettings, target: Target) -> str:
    lines = [f"space {space.path}: {len(space.decisions)} decision(s)"]
    lines += [f"  {d.describe()}" for d in space.decisions]
    for name, value in space.fixed.items():
        lines.append(f"  {name} = {value} (fixed by --set)")
    if space.overrides:
        lines.append(f"  config overrides: {', '.join(space.overrides)}")
    raw = space.raw_size()
    if raw is None:
        lines.append("size: continuous (not enumerable)")
    else:
        size = space.size()
        lines.append(f"size: {size} point(s)" + (f" ({raw} before the constraint)" if size != raw else ""))
    objectives = ", ".join(f"{o} ({OBJECTIVES[o][:3]})" for o in settings.objectives)
    budget = format_bytes(settings.memory_budget) if settings.memory_budget else \
        f"chip HBM {format_bytes(target.hbm_bytes_per_device)}" if target.hbm_bytes_per_device else "device memory"
    lines.append(f"study: objectives {objectives}; tuner {settings.tuner}; {settings.trials} trial(s); "
                 f"target {target.text} x {settings.processes} process(es); memory budget {budget}; "
                 f"timeout {settings.timeout:.0f} s")
    if target.plan_only:
        lines.append(f"plan-only: {target.text} has no TPU here; trials are compiled for its topology, never run, "
                     "and scored by predicted MFU and compiled memory")
    if target.slices_auto:
        lines.append(f"slices=auto: each trial is compiled for prod(mesh.dcn) slices of {target.slice_name} "
                     f"({target.num_devices} chips a slice)")
    return "\n".join(lines)


def dry_run(space: Space, settings: StudySettings, target: Target, limit: int = 1000) -> str:
    lines = [describe(space, settings, target)]
    if not space.finite:
        lines.append("static feasibility: the space is continuous; every trial is checked when proposed")
        return "\n".join(lines)
    lines.append("static feasibility (no compilation):")
    ok = bad = 0
    for i, (point, msg) in enumerate(static_status(space, target, settings.processes)):
        ok, bad = (ok + 1, bad) if msg is None else (ok, bad + 1)
        if i < limit:
            shown = " ".join(f"{k}={v}" for k, v in point.items())
            lines.append(f"  {'ok     ' if msg is None else 'invalid'}  {shown}" + (f"  ({msg})" if msg else ""))
    if ok + bad > limit:
        lines.append(f"  ... {ok + bad - limit} more")
    lines.append(f"{ok + bad} point(s): {ok} pass the static checks, {bad} invalid")
    return "\n".join(lines)

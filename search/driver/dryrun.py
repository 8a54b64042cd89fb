"""Static feasibility of a space's points (no compilation): `run --dry-run` and the pre-flight
check that refuses a space none of whose points can run on the target."""
from __future__ import annotations

import math
import random
from typing import Callable, Iterable, Iterator

from ...store.units import format_bytes
from ..planning.targets import Target
from ..planning.topology import libtpu_available
from ..study import configio
from ..study.data_check import data_problem
from ..study.settings import OBJECTIVES, StudySettings
from ..study.space import Space, SpaceError

PREFLIGHT_MAX_POINTS = 5000


def static_message(space: Space, point: dict, target: Target, processes: int) -> str | None:
    """None when the point passes trainer.validate.check on the target, else why not."""
    from ...trainer import validate
    from ...trainer.errors import ConfigError

    try:
        cfg = configio.build(space.config(point))
        target = target.for_config(cfg)  # slices=auto: the point's own slice count
        validate.check(cfg, target.num_devices, target.platform, processes, target.chip)
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


def describe(space: Space, settings: StudySettings, target: Target, size: int | None = None) -> str:
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
        size = space.size() if size is None else size
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
    if target.platform == "tpu" and not libtpu_available():
        lines.append(f"libtpu is not installed: this dry run compiles nothing, but a run for {target.text} needs it "
                     "(pip install 'paxsearch[tpu]')")
    if target.slices_auto:
        lines.append(f"slices=auto: each trial is compiled for prod(mesh.dcn) slices of {target.slice_name} "
                     f"({target.num_devices} chips a slice)")
    return "\n".join(lines)


def dry_run(space: Space, settings: StudySettings, target: Target, emit: Callable[[str], None] = print,
            check_all: int = 200, sample: int = 100, seed: int = 0) -> None:
    """`run --dry-run`, line by line through `emit` as each point is checked (building a point's
    config costs ~45 ms). The size is exact (space.size(): the constraint is called, no config
    built). Static checks: every point when the space has at most `check_all`, else `sample`
    points drawn uniformly at random (seed `seed`), with the coverage and the estimated share
    that passes stated."""
    size = space.size() if space.finite else None
    emit(describe(space, settings, target, size))
    if size is None:
        emit("static feasibility: the space is continuous; every trial is checked when proposed")
        return
    if size <= check_all:
        emit("static feasibility (no compilation), every point:")
        points: Iterable[dict] = space.points()
    else:
        n = min(sample, size)
        emit(f"static feasibility (no compilation) of {n:,} of {size:,} points ({100 * n / size:.2g}% coverage), "
             f"drawn uniformly at random (seed {seed}):")
        points = _sample(space, n, random.Random(seed))
    ok = bad = 0
    for point in points:
        msg = static_message(space, point, target, settings.processes)
        ok, bad = (ok + 1, bad) if msg is None else (ok, bad + 1)
        shown = " ".join(f"{k}={v}" for k, v in point.items())
        emit(f"  {'ok     ' if msg is None else 'invalid'}  {shown}" + (f"  ({msg})" if msg else ""))
    if ok + bad == size:
        emit(f"{ok + bad} point(s): {ok} pass the static checks, {bad} invalid")
        return
    low, high = _interval(ok, ok + bad)
    removed = round(size * bad / (ok + bad)), round(size * (1 - high)), round(size * (1 - low))
    emit(f"{ok + bad:,} sampled point(s): {ok} pass the static checks, {bad} invalid; so {100 * low:.0f}-"
         f"{100 * high:.0f}% of the {size:,} points pass (95% interval): the static checks remove about "
         f"{removed[0]:,} of them ({removed[1]:,}-{removed[2]:,}). Every trial is checked again when proposed")


def _sample(space: Space, n: int, rng: random.Random) -> Iterator[dict]:
    """`n` distinct points drawn uniformly from the space (the constraint's points), by index
    into the grid of free decisions; a constraint that keeps few points costs more draws."""
    raw = space.raw_size() or 0
    seen: set[int] = set()
    draws = 0
    while len(seen) < n and draws < 1000 * n:
        draws += 1
        index = rng.randrange(raw)
        if index in seen:
            continue
        point = space.point_at(index)
        if space.excluded(point):
            continue
        seen.add(index)
        yield point


def _interval(ok: int, n: int) -> tuple[float, float]:
    """The 95% (Wilson score) interval of the share of points that pass, from `ok` of `n` sampled."""
    z = 1.96
    p = ok / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)

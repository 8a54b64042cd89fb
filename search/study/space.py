"""Space files: a search space over trainer configs, written as plain Python.

A space file is a Python file (read by path, never imported by the library) that defines:

``def space():`` (required)
    Builds and returns the trainer config as Fiddle (``fdl.Config(TrainConfig, ...)``) or
    a ``TrainConfig``. Choices are marked inline with PyGlove primitives, each with a stable,
    readable ``name`` (used as the Optuna parameter name and as a report column)::

        mesh = pg.oneof(["8x1x1", "2x2x2", "1x8x1"], name="mesh")
        remat = pg.oneof(["none", "full"], name="remat")
        lr = pg.floatv(1e-4, 1e-2, scale="log", name="peak_lr")
        layers = intv(2, 8, name="n_layers")    # paxsearch.search.study.space.intv: an int range

    Candidates of ``pg.oneof`` are JSON scalars (str, int, float, bool); map richer values
    inside the function (``"2x2x2"`` -> ``(2, 2, 2)``, ``"small"`` -> a ModelConfig). The
    function is called once to trace the space (``pg.hyper.trace``, every primitive named)
    and once per trial with the trial's decisions (``DynamicEvaluationContext.apply``), so
    it must be cheap and free of side effects: it never touches JAX devices.

``STUDY = dict(...)`` (optional): the study's settings, see settings.StudySettings::

        STUDY = dict(objectives=["loss", "mfu", "memory"], trials=16, tuner="tpe",
                     target="cpu:8", memory_budget="2GiB", timeout=300)

``def constraint(d):`` (optional)
    A predicate over the decisions (a dict name -> value); points where it returns False
    are left out of the space: never proposed, never counted in its size.

Model presets (paxsearch.trainer.presets: llama3-8b, llama2-7b, gpt3-xl, ...) come in as
``preset(name, **fields)``, a Fiddle ModelConfig; a ``pg.oneof`` of names makes the preset a
decision, and fields still change per trial::

        model = preset(pg.oneof(["llama2-7b", "llama3-8b"], name="model"), seq_len=2048,
                       attention=pg.oneof(["dot_product", "flash"], name="attention"))

Command-line ``--set name=value`` fixes a decision to one of its values (or, for a config
field such as ``steps`` or ``model.d_model``, overrides it in every trial's config).
``--set model=llama3-8b`` (when no decision is named ``model``) replaces every trial's whole
ModelConfig by the preset, model fields set by decisions included; a later
``--set model.seq_len=1024`` changes a field of it.
"""
from __future__ import annotations

import ast
import itertools
import json
import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import fiddle as fdl
import pyglove as pg

from ..errors import UserError
from . import configio
from .settings import SettingsError, StudySettings

INT_HINT = "paxsearch:int"


class SpaceError(UserError, ValueError):
    """The space file cannot be used; the message says why (one line)."""


def intv(low: int, high: int, *, name: str, log: bool = False):
    """An integer in [low, high] (both included): a PyGlove choice that tuners treat as an
    integer range (Optuna IntDistribution, log scale when `log`)."""
    if low > high:
        raise SpaceError(f"intv {name!r}: low {low} > high {high}")
    return pg.oneof(list(range(int(low), int(high) + 1)), name=name,
                    hints={"kind": INT_HINT, "log": bool(log)})


def preset(name: str, **fields) -> fdl.Config:
    """The ModelConfig of a model preset (paxsearch.trainer.presets) as a Fiddle config, with
    `fields` changed; `name` may be a pg.oneof of preset names (a decision)."""
    from ...trainer import presets

    return configio.to_fiddle(presets.replace(name, **fields))


@dataclass(frozen=True)
class Decision:
    """One named decision of a space."""

    name: str
    kind: str  # "choice" | "int" | "float"
    values: tuple = ()  # choice/int: candidate values in order
    low: float | None = None  # float
    high: float | None = None
    log: bool = False

    @property
    def finite(self) -> bool:
        return self.kind != "float"

    def describe(self) -> str:
        if self.kind == "float":
            return f"{self.name}: float in [{self.low:g}, {self.high:g}]" + (" (log)" if self.log else "")
        if self.kind == "int":
            return f"{self.name}: int in [{self.values[0]}, {self.values[-1]}]" + (" (log)" if self.log else "")
        return f"{self.name}: one of {', '.join(map(str, self.values))}"

    def coerce(self, value):
        """`value` (from --set text or stored params) as one of this decision's values."""
        if self.kind == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float, str)):
                raise SpaceError(f"{self.name}={value!r} is not a number in [{self.low:g}, {self.high:g}]")
            try:
                v = float(value)
            except ValueError:
                raise SpaceError(f"{self.name}={value!r} is not a number in [{self.low:g}, {self.high:g}]") from None
            if not self.low <= v <= self.high:
                raise SpaceError(f"{self.name}={v:g} is outside [{self.low:g}, {self.high:g}]")
            return v
        for cand in self.values:
            if cand == value or (isinstance(value, str) and str(cand) == value):
                return cand
        raise SpaceError(f"{self.name}={value!r} is not one of its values: {', '.join(map(str, self.values))}")


def _decision_from_primitive(name: str, hp) -> Decision:
    if isinstance(hp, pg.hyper.Float):
        return Decision(name, "float", low=float(hp.min_value), high=float(hp.max_value),
                        log=hp.scale in ("log", "rlog"))
    if isinstance(hp, pg.hyper.OneOf):
        values = tuple(hp.candidates)
        for v in values:
            if not (v is None or isinstance(v, (str, int, float, bool))):
                raise SpaceError(
                    f"decision {name!r}: candidate {v!r} is a {type(v).__name__}; use JSON scalars "
                    "(str, int, float, bool) and map them to richer values inside space()")
        if len({json.dumps(v) for v in values}) != len(values):
            raise SpaceError(f"decision {name!r} lists a candidate twice: {values}")
        hints = hp.hints if isinstance(hp.hints, dict) else {}
        if hints.get("kind") == INT_HINT:
            return Decision(name, "int", values=values, log=bool(hints.get("log")))
        return Decision(name, "choice", values=values)
    raise SpaceError(f"decision {name!r}: {type(hp).__name__} is not supported; use pg.oneof, "
                     "pg.floatv or paxsearch.search.study.space.intv")


class Space:
    """A traced space file: its decisions, settings, constraint, and configs per point."""

    def __init__(self, path: str, function: Callable, settings: StudySettings,
                 constraint: Callable | None):
        self.path = path
        self.function = function
        self.settings = settings
        self.constraint = constraint
        self.fixed: dict[str, Any] = {}
        self.overrides: list[str] = []
        try:
            self._context = pg.hyper.trace(function, require_hyper_name=True)
        except SpaceError:
            raise
        except ValueError as e:  # e.g. an unnamed primitive, or two different ones under one name
            raise SpaceError(f"{path}: cannot trace space(): {_one_line(e)}") from None
        except Exception as e:  # the user's function failed
            raise SpaceError(f"{path}: space() raised {type(e).__name__}: {_one_line(e)}") from None
        self._spec = self._context.dna_spec
        hyper = self._context.hyper_dict
        self.all_decisions = [_decision_from_primitive(el.name, hyper[el.name]) for el in self._spec.elements]
        if not self.all_decisions:
            raise SpaceError(f"{path}: space() marks no choice; use pg.oneof(..., name=...)")
        self._by_name = {d.name: d for d in self.all_decisions}

    # ----- decisions -----
    @property
    def name(self) -> str:
        return os.path.splitext(os.path.basename(self.path))[0]

    @property
    def decisions(self) -> list[Decision]:
        """The decisions still searched over (those not fixed by --set)."""
        return [d for d in self.all_decisions if d.name not in self.fixed]

    def decision(self, name: str) -> Decision:
        return self._by_name[name]

    def fix(self, name: str, value) -> None:
        if name not in self._by_name:
            raise SpaceError(f"unknown decision {name!r} in --set; decisions of {self.name}: "
                             f"{', '.join(self._by_name)}")
        self.fixed[name] = self._by_name[name].coerce(value)

    def apply_sets(self, items: list[str]) -> None:
        """--set name=value: a decision is fixed; a config field (steps, model.d_model) is
        overridden in every trial's config; anything else is an error."""
        for item in items or []:
            if "=" not in item:
                raise SpaceError(f"--set {item!r} is not of the form name=value")
            name, text = (s.strip() for s in item.split("=", 1))
            if name in self._by_name:
                self.fix(name, configio.parse_value(text))
                continue
            probe = self.first_config()
            try:
                configio.apply_overrides(probe, [f"{name}={text}"])
            except configio.UnknownField:
                raise SpaceError(f"unknown decision {name!r} in --set; decisions of {self.name}: "
                                 f"{', '.join(self._by_name)} (or a config field such as steps, "
                                 "model.d_model, or model=<preset>)") from None
            except configio.ConfigFileError as e:  # a known field with a bad value (model=<unknown preset>)
                raise SpaceError(str(e)) from None
            self.overrides.append(f"{name}={text}")

    # ----- points -----
    @property
    def finite(self) -> bool:
        return all(d.finite for d in self.decisions)

    def full(self, decisions: dict) -> dict:
        """Decisions of one point including the fixed ones, in the space's order."""
        merged = {**decisions, **self.fixed}
        return {d.name: merged[d.name] for d in self.all_decisions}

    def excluded(self, decisions: dict) -> bool:
        """True when the space's constraint leaves this point out."""
        if self.constraint is None:
            return False
        try:
            return not self.constraint(dict(decisions))
        except Exception as e:
            raise SpaceError(f"{self.path}: constraint({decisions}) raised "
                             f"{type(e).__name__}: {_one_line(e)}") from None

    def points(self) -> Iterator[dict]:
        """Every point of a finite space (fixed decisions applied, constraint honoured)."""
        if not self.finite:
            raise SpaceError(f"the space has continuous decisions "
                             f"({', '.join(d.name for d in self.decisions if not d.finite)}); it has no finite grid")
        free = self.decisions
        for combo in itertools.product(*(d.values for d in free)):
            point = self.full(dict(zip((d.name for d in free), combo, strict=True)))
            if not self.excluded(point):
                yield point

    def size(self) -> int | None:
        """The number of points (after constraint and --set), or None when continuous: the
        product of the decisions' value counts; with a constraint, the points it keeps (the
        constraint is called on each point's decisions; no config is built)."""
        if not self.finite:
            return None
        return self.raw_size() if self.constraint is None else sum(1 for _ in self.points())

    def point_at(self, index: int) -> dict:
        """Point number `index` (0 <= index < raw_size()) of the grid of free decisions, in
        points()' order before the constraint: a mixed-radix reading of the index."""
        chosen = {}
        for d in reversed(self.decisions):
            index, digit = divmod(index, len(d.values))
            chosen[d.name] = d.values[digit]
        return self.full(chosen)

    def raw_size(self) -> int | None:
        return math.prod(len(d.values) for d in self.decisions) if self.finite else None

    # ----- configs -----
    def to_dna(self, decisions: dict) -> pg.DNA:
        full = self.full(decisions)
        numbers = []
        for d in self.all_decisions:
            v = d.coerce(full[d.name])
            numbers.append(float(v) if d.kind == "float" else d.values.index(v))
        return pg.DNA.from_numbers(numbers, self._spec)

    def from_dna(self, dna: pg.DNA) -> dict:
        numbers = dna.to_numbers()
        out = {}
        for d, n in zip(self.all_decisions, numbers, strict=False):
            out[d.name] = float(n) if d.kind == "float" else d.values[int(n)]
        return self.full({k: v for k, v in out.items() if k not in self.fixed})

    @property
    def dna_spec(self):
        return self._spec

    def config(self, decisions: dict) -> fdl.Config:
        """The complete Fiddle config of one point (--set overrides applied)."""
        dna = self.to_dna(decisions)
        try:
            with self._context.apply(dna):
                raw = self.function()
            cfg = configio.normalize(raw)
        except configio.ConfigFileError as e:
            raise SpaceError(f"{self.path}: {e}") from None
        except Exception as e:
            raise SpaceError(f"{self.path}: space() with {self.full(decisions)} raised "
                             f"{type(e).__name__}: {_one_line(e)}") from None
        return configio.apply_overrides(cfg, self.overrides) if self.overrides else cfg

    def first_config(self) -> fdl.Config:
        first = {d.name: (d.low if d.kind == "float" else d.values[0]) for d in self.all_decisions}
        return self.config(first)


def decisions_key(decisions: dict) -> str:
    """A canonical text key of a point, for deduplication."""
    return json.dumps({k: decisions[k] for k in sorted(decisions)}, sort_keys=True)


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:300]


def load_space(path: str) -> Space:
    """Load and trace a space file; raises SpaceError with one clear line."""
    if not os.path.exists(path):
        raise SpaceError(f"space file {path!r} does not exist")
    if os.path.isdir(path):
        raise SpaceError(f"{path!r} is a folder; pass a space file (e.g. spaces/mesh_sweep.py)")
    try:
        source = configio.read_text(path, "space file")  # a regular file, not too large, UTF-8
    except configio.ConfigFileError as e:
        raise SpaceError(str(e)) from None
    try:
        ast.parse(source, filename=path)
    except SyntaxError as e:
        raise SpaceError(f"{path}:{e.lineno or 1}: syntax error: {e.msg}") from None
    except ValueError as e:  # Python 3.11: null bytes in the source
        raise SpaceError(f"{path}: not Python source: {_one_line(e)}") from None
    try:
        module = configio.load_python_file(path)
    except configio.ConfigFileError as e:
        raise SpaceError(str(e)) from None
    except ModuleNotFoundError as e:
        moved = (e.name or "").startswith("paxsearch.search.")  # a module of the layout before search/'s rooms
        fix = "; space files import intv and preset from paxsearch.search" if moved else ""
        raise SpaceError(f"{path}: importing it raised ModuleNotFoundError: {_one_line(e)}{fix}") from None
    except Exception as e:
        raise SpaceError(f"{path}: importing it raised {type(e).__name__}: {_one_line(e)}") from None
    function = getattr(module, "space", None)
    if not callable(function):
        raise SpaceError(f"{path} has no space function; define `def space():` returning the trainer config "
                         "with pg.oneof(..., name=...) choices")
    try:
        settings = StudySettings.from_dict(getattr(module, "STUDY", None) or {})
    except SettingsError as e:
        raise SpaceError(f"{path}: STUDY: {e}") from None
    constraint = getattr(module, "constraint", None)
    if constraint is not None and not callable(constraint):
        raise SpaceError(f"{path}: `constraint` must be a function of the decisions dict")
    return Space(os.path.abspath(path), function, settings, constraint)


def config_json(cfg: fdl.Config) -> str:
    return configio.dumps(cfg)


def config_dict(cfg: fdl.Config) -> dict:
    return configio.to_json_dict(configio.build(cfg))


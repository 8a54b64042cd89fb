"""Trainer configs as Fiddle: load from a Fiddle JSON or a Python file, apply --set overrides,
serialize. The trainer itself only ever sees the plain dataclasses that fdl.build returns."""
from __future__ import annotations

import ast
import copy
import dataclasses
import importlib.util
import json
import math
import os
import types
import typing

import fiddle as fdl
from fiddle.experimental import serialization

from ...trainer import presets
from ...trainer.config import TrainConfig
from ...trainer.errors import ConfigError
from ..errors import UserError


class ConfigFileError(UserError, ValueError):
    """A config file or override cannot be used; the message says why and how to fix it."""


class UnknownField(ConfigFileError):
    """An override names no config field or section."""


def to_fiddle(obj) -> fdl.Config:
    """A fully spelled-out fdl.Config of a (nested) dataclass instance."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return fdl.Config(type(obj), **{f.name: to_fiddle(getattr(obj, f.name)) for f in dataclasses.fields(obj)})
    return obj


def normalize(cfg) -> fdl.Config:
    """Any fdl.Config / TrainConfig -> a complete fdl.Config(TrainConfig, ...), every field of
    the type its dataclass declares (ConfigFileError naming the field otherwise)."""
    built = fdl.build(cfg) if isinstance(cfg, fdl.Buildable) else cfg
    if not isinstance(built, TrainConfig):
        raise ConfigFileError(f"the config builds a {type(built).__name__}, not a TrainConfig; "
                              "return fdl.Config(TrainConfig, ...) or a TrainConfig")
    check_types(built)
    return to_fiddle(built)


def _type_ok(value, hint) -> bool:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, a) for a in args)
    if hint is type(None):
        return value is None
    if origin is tuple:
        if not isinstance(value, (tuple, list)):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_type_ok(v, args[0]) for v in value)
        return len(value) == len(args) and all(_type_ok(v, a) for v, a in zip(value, args, strict=True))
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True  # a hint this check does not know (Literal, Any): the trainer checks it


def _hint_text(hint) -> str:
    return getattr(hint, "__name__", None) if isinstance(hint, type) else str(hint).replace("typing.", "")


def check_field(cls, name: str, value, where: str) -> None:
    """ConfigFileError unless `value` fits the declared type of field `name` of dataclass `cls`."""
    hint = typing.get_type_hints(cls).get(name)
    if hint is not None and not _type_ok(value, hint):
        raise ConfigFileError(f"{where}: {value!r} is a {type(value).__name__}, but {name} must be "
                              f"{_hint_text(hint)}")
    if any(isinstance(v, float) and not math.isfinite(v) for v in (value if isinstance(value, tuple) else (value,))):
        raise ConfigFileError(f"{where}: {name} must be a finite number, got {value!r}")


def check_types(obj, prefix: str = "") -> None:
    """Every field of a (nested) config dataclass has its declared type."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        path = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            check_types(value, path + ".")
        else:
            check_field(type(obj), f.name, value, f"config field {path}")


CONFIG_MODULE = "paxsearch.trainer.config"  # the only classes a serialized config may build
_FIDDLE_SYMBOLS = {("fiddle._src.config", "Config"), ("fiddle._src.config", "BuildableTraverserMetadata"),
                   ("builtins", "tuple"), ("builtins", "list"), ("builtins", "dict")}


class ConfigOnlyPolicy(serialization.PyrefPolicy):
    """Fiddle JSON may name paxsearch's config dataclasses (and Fiddle's own containers), nothing
    else: a config read from a file or a shared database never imports nor calls other code."""

    def allows_import(self, module: str, symbol: str) -> bool:
        return (module == CONFIG_MODULE and "." not in symbol) or (module, symbol) in _FIDDLE_SYMBOLS

    def allows_value(self, value) -> bool:
        if getattr(value, "__module__", None) == CONFIG_MODULE:
            return isinstance(value, type) and dataclasses.is_dataclass(value)
        return True  # one of _FIDDLE_SYMBOLS (checked before the import)


def dumps(cfg: fdl.Config) -> str:
    return serialization.dump_json(cfg, indent=2)


def loads(text: str) -> fdl.Config:
    """A Fiddle JSON TrainConfig; anything naming other code is refused before it is imported."""
    try:
        return normalize(serialization.load_json(text, pyref_policy=ConfigOnlyPolicy()))
    except serialization.PyrefPolicyError as e:
        ref = f"{getattr(e, 'module', '?')}.{getattr(e, 'symbol', '?')}"
        raise ConfigFileError(f"the config names {ref}, which is not a paxsearch config class "
                              f"({CONFIG_MODULE}); refusing to load it (configs may not run code)") from None


MAX_SOURCE_BYTES = 16 * 2**20  # a space file or config file larger than this is not one


def read_text(path: str, what: str) -> str:
    """The text of a user's space or config file, after checking it is a regular file of at most
    MAX_SOURCE_BYTES (a device, a FIFO or /dev/zero would read forever) and UTF-8 (Python's own
    source encoding); ConfigFileError, one line, otherwise."""
    import stat

    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            kind = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file (a device, FIFO or socket)"
            raise ConfigFileError(f"{what} {path!r} is {kind}; pass a {what} on disk")
        if st.st_size > MAX_SOURCE_BYTES:
            raise ConfigFileError(f"{what} {path!r} is {st.st_size:,} bytes, over the {MAX_SOURCE_BYTES:,} a "
                                  f"{what} may have; is it the right file?")
        with open(path, "rb") as f:
            data = f.read(MAX_SOURCE_BYTES + 1)  # the file may grow after the stat
    except OSError as e:
        raise ConfigFileError(f"cannot read {what} {path!r}: {e.strerror or e}") from None
    if len(data) > MAX_SOURCE_BYTES:
        raise ConfigFileError(f"{what} {path!r} is over the {MAX_SOURCE_BYTES:,} bytes a {what} may have")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise ConfigFileError(f"{path}:{line}: {what} is not UTF-8 text (byte {data[e.start]:#04x} at offset "
                              f"{e.start}); save it as UTF-8") from None


def load(path: str, function: str | None = None) -> fdl.Config:
    """A config from a Fiddle JSON file, or from a Python file's function (default `config`)."""
    if not os.path.exists(path):
        raise ConfigFileError(f"config file {path!r} does not exist; pass a Fiddle JSON file or a Python file")
    text = read_text(path, "config file")
    if path.endswith(".json"):
        try:
            return loads(text)
        except ConfigFileError as e:
            raise ConfigFileError(f"{path}: {e}") from None
        except (ValueError, KeyError, TypeError, AttributeError, ImportError) as e:
            raise ConfigFileError(f"{path}: not a Fiddle-serialized TrainConfig ({type(e).__name__}: {e})") from None
    module = load_python_file(path)
    name = function or "config"
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ConfigFileError(f"{path} has no function {name!r}; define `def {name}():` returning the trainer config")
    return normalize(fn())


def load_python_file(path: str):
    spec = importlib.util.spec_from_file_location(f"paxsearch_user_{abs(hash(os.path.abspath(path)))}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        raise ConfigFileError(f"{path}:{e.lineno or 1}: syntax error: {e.msg}") from None
    except SystemExit as e:  # sys.exit() at import would end paxsearch with the file's own status
        raise ConfigFileError(f"{path}: importing it called sys.exit({e.code!r}); the file should only "
                              "define functions and settings") from None
    return module


def parse_value(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def apply_overrides(cfg: fdl.Config, overrides: list[str]) -> fdl.Config:
    """Apply `a.b=value` overrides (values parsed as Python literals, else strings)."""
    cfg = copy.deepcopy(cfg)
    for item in overrides or []:
        if "=" not in item:
            raise ConfigFileError(f"override {item!r} is not of the form name=value (e.g. model.d_model=256)")
        path, text = item.split("=", 1)
        *parents, leaf = path.strip().split(".")
        node = cfg
        for p in parents:
            node = getattr(node, p, None) if isinstance(node, fdl.Buildable) else None
            if not isinstance(node, fdl.Buildable):
                raise UnknownField(f"override {path!r}: {p!r} is not a config section; see `paxsearch train --help`")
        known = {f.name for f in dataclasses.fields(fdl.get_callable(node))}
        if leaf not in known:
            raise UnknownField(f"override {path!r}: unknown field {leaf!r}; known: {', '.join(sorted(known))}")
        if path.strip() == "model":  # model=<preset name> replaces the whole ModelConfig
            setattr(node, leaf, _model_preset(text.strip()))
            continue
        value = parse_value(text)
        value = tuple(value) if isinstance(value, list) else value
        # a whole section too (optimizer=5): only a Fiddle config of its class may replace one
        check_field(fdl.get_callable(node), leaf, value, f"override {item.strip()!r}")
        setattr(node, leaf, value)
    return cfg


def _model_preset(name: str) -> fdl.Config:
    """`model=NAME`: the whole ModelConfig of a preset (trainer/presets.py); later `model.x=...` overrides
    still apply on top of it."""
    try:
        return to_fiddle(presets.get(name))
    except ConfigError as e:
        raise ConfigFileError(f"override 'model={name}': {e} (or set one field: model.seq_len=2048)") from None


def build(cfg: fdl.Config) -> TrainConfig:
    return fdl.build(cfg)


def to_json_dict(cfg: TrainConfig) -> dict:
    return json.loads(json.dumps(dataclasses.asdict(cfg)))

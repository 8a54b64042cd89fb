"""A plan cache shared by every study and run folder: one JSON file per compiled plan.

    folder = plan_cache.folder()                 # None when the cache is off
    key = plan_cache.cache_key(cfg, target)      # what changes the compiled step or its reading
    record = plan_cache.load(folder, key)        # a valid record, else None (one warning line)
    plan_cache.store(folder, key, record)        # atomic: a temporary file, then os.replace

The folder is $PAXSEARCH_CACHE/plans (the cache root of trainer/flops.py) unless
PAXSEARCH_PLAN_CACHE says "off" or names another folder; a study's `plan_cache` setting
(`paxsearch run --plan-cache off|on|DIR`) is put there by `use` before its driver starts, so
the driver (which reads the cache, screen.py) and its workers (which write it after a
compile, search/trial/execute.py) agree.

The key is the study's plan key (keys.plan_keys: model, mesh, batch, remat, flag set name,
memory knobs, pipeline, rules on the concrete target) plus what a plan key does not change
within one study: the jax / jaxlib / libtpu versions, the compiler flags the worker compiles
with (the flag set's contents merged into the user's XLA_FLAGS / LIBTPU_INIT_ARGS, the CPU
device count aside), a digest of the code that builds and reads the program (trainer/ and
search/planning/: model, sharding, roofline, hardware table), the plan method (method.plan_method:
the HLO passes or a full compile) and FORMAT, bumped when the record
changes. A record is plain JSON data: the compile's plan in its stored form (store/plan.py; or
the compiler's memory refusal) and the compile's environment. Nothing read from it names a file, a module or a
callable; a record that is not valid JSON, of another format or key, or of the wrong shape
is ignored with one warning line, and the plan is compiled again (and stored over it).
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

from ...store import plan as stored_form
from ...store.compiler import package_version
from ...store.plan import Plan
from ...trainer import flagsets
from ...trainer import flops as flops_lib
from .keys import plan_key
from .method import plan_method
from .targets import Target

FORMAT = 1  # bump when a record's fields or their meaning change
ENV = "PAXSEARCH_PLAN_CACHE"  # "off", or a folder; unset: <cache root>/plans
KINDS = ("plan", "refused")  # a compiled plan; the compiler's memory refusal (predicted_oom)


def folder(environ=None) -> Path | None:
    """The cache folder this process uses, or None when the cache is off."""
    value = (os.environ if environ is None else environ).get(ENV, "").strip()
    if value.lower() == "off":
        return None
    if value and value.lower() != "on":
        return Path(value)
    return flops_lib.cache_root() / "plans"


def use(setting: str) -> None:
    """Apply a study's `plan_cache` setting to this process and the workers it starts: "off"
    or a folder replaces PAXSEARCH_PLAN_CACHE; "on" keeps it (unset: the default folder)."""
    if setting != "on":
        os.environ[ENV] = setting


# ----------------------------------------------------------------------------- the key

_version = package_version  # the installed version of a package (a module name tests can swap)


@functools.cache
def code_digest() -> str:
    """A digest of the source that builds and reads the compiled step: every module of the
    trainer (model, sharding, step, the program builder, hardware table), every module of this
    planning package (targets, how a plan is made and read: the compile, the HLO passes, the
    roofline, the prediction, plans.py) and store/plan.py (its stored form)."""
    trainer_dir = Path(flops_lib.__file__).parent
    planning_dir = Path(__file__).parent
    files = sorted(trainer_dir.rglob("*.py")) + sorted(planning_dir.rglob("*.py")) + [Path(stored_form.__file__)]
    h = hashlib.sha256()
    for path in files:
        h.update(str(path.relative_to(trainer_dir.parent)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def compiler_flags(flag_set: str, platform: str, environ=None) -> dict[str, list[str]]:
    """The XLA_FLAGS and LIBTPU_INIT_ARGS a worker compiles with under `flag_set` (what
    workers/pool.py starts it with: the user's flags, the CPU device count aside, with the
    set's laid over them), each sorted: the same in the driver and in the worker."""
    env = os.environ if environ is None else environ
    base = {"XLA_FLAGS": flagsets.with_device_count(env.get("XLA_FLAGS"), None),
            "LIBTPU_INIT_ARGS": env.get("LIBTPU_INIT_ARGS", "")}
    merged = flagsets.env_for(flag_set, platform, base)
    return {name: sorted(merged.get(name, "").split()) for name in ("XLA_FLAGS", "LIBTPU_INIT_ARGS")}


def key_fields(cfg, target: Target, environ=None) -> dict:
    """Everything the cache key digests (see the module docstring)."""
    target = target.for_config(cfg)
    return {"format": FORMAT, "plan_key": plan_key(cfg, target), "target": target.name,
            "versions": {p: _version(p) for p in ("jax", "jaxlib", "libtpu")},
            "flags": compiler_flags(cfg.flags, target.platform, environ), "code": code_digest(),
            "method": plan_method(target, environ)}


def cache_key(cfg, target: Target, environ=None) -> str:
    """The file name (without .json) of `cfg`'s plan on `target` in the cache."""
    fields = key_fields(cfg, target, environ)
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:32]


# ----------------------------------------------------------------------------- records

def make_record(key: str, kind: str, plan: Plan, message: str = "", env: dict | None = None) -> dict:
    """A record of one compile: `plan` in its stored form (without where it came from: its
    plan_method and screen), and for kind "refused" the compiler's message."""
    return {"format": FORMAT, "key": key, "kind": kind, "plan": plan.without("plan_method", "screen").to_stored(),
            "message": message, "env": dict(env or {})}


def record_plan(record: dict) -> Plan:
    """The Plan of a valid record (load)."""
    plan = Plan.from_stored(record["plan"])
    assert plan is not None
    return plan


def _problem(record, key: str) -> str | None:
    """Why `record` is not a valid record of `key` (None when it is)."""
    if not isinstance(record, dict):
        return f"not a JSON object but {type(record).__name__}"
    if record.get("format") != FORMAT:
        return f"format {record.get('format')!r}, this release reads format {FORMAT}"
    if record.get("key") != key:
        return "the record is of another key"
    if record.get("kind") not in KINDS:
        return f"unknown kind {record.get('kind')!r}"
    stored = record.get("plan")
    if not isinstance(stored, dict):
        return "no plan object"
    peak = record_plan(record).peak_bytes
    if isinstance(peak, bool) or not isinstance(peak, int) or peak < 0:
        if not (peak is None and record["kind"] == "refused"):  # the compiler may name no bytes
            return f"plan.peak_bytes {peak!r} is not a byte count"
    if not isinstance(record.get("message"), str) or not isinstance(record.get("env"), dict):
        return "message or env of the wrong type"
    return None


def warn(line: str) -> None:
    print(f"paxsearch: warning: {line}", file=sys.stderr, flush=True)


def load(where: Path | None, key: str) -> dict | None:
    """The valid record of `key` in folder `where`, or None: none there (or the cache off),
    or one that cannot be used (a warning line says why; the plan is compiled again)."""
    if where is None:
        return None
    path = Path(where) / f"{key}.json"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        warn(f"plan cache entry {path} is unreadable ({type(e).__name__}: {str(e)[:120]}); compiling the plan again")
        return None
    try:
        record = json.loads(text)
    except ValueError as e:
        problem: str | None = f"not valid JSON: {str(e)[:120]}"
    else:
        problem = _problem(record, key)
    if problem is not None:
        warn(f"plan cache entry {path} ignored ({problem}); compiling the plan again")
        return None
    return record


def store(where: Path | None, key: str, record: dict) -> None:
    """Write `record` as `key`'s entry in folder `where` (nothing when the cache is off):
    a temporary file in the same folder, then os.replace, so a reader sees the old entry or
    the whole new one. A folder that cannot be written is one warning line, not a failure."""
    if where is None:
        return
    where = Path(where)
    tmp = None
    try:
        where.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{key}.", suffix=".tmp", dir=where)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(record, f, sort_keys=True, allow_nan=False)
        os.replace(tmp, where / f"{key}.json")
        tmp = None
    except (OSError, ValueError) as e:  # ValueError: a NaN figure, not plain JSON
        warn(f"plan cache entry {where / (key + '.json')} not written ({type(e).__name__}: {str(e)[:120]})")
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def remember(where: Path | None, cfg, target: Target, kind: str, plan: Plan, message: str = "",
             env: dict | None = None) -> None:
    """Store a worker's compile of `cfg` (kind, plan, message: search/trial/execute.py plan_outcome) with the
    environment it compiled in (nothing when the cache is off)."""
    if where is not None:
        key = cache_key(cfg, target)
        store(where, key, make_record(key, kind, plan, message, env))

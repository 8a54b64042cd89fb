"""The one tiny model of the search tests, and the one space factory built on it.

Every search test that runs a study trains the same tiny Transformer (a trial is mostly fixed
costs: compile ~2 s, a few steps). Its config and the spaces over it come from here, never
from a hand-made copy:

    tiny_config(mesh="8x1x1", per_device_batch=1, steps=2)     # a Fiddle TrainConfig
    STUDY, space = tiny_space()                                # tests/spaces/tiny_space.py
    STUDY, space = tiny_space(study=dict(trials=2),            # a variant: 2 trials over flag sets
                              decisions=dict(flags=["default", "cpu_eigen_dots"]), mesh="8x1x1")
    write_space(path, study=..., decisions=..., **fields)      # a space file on disk
    write_config(path, **fields)                               # a `paxsearch train` config file

Space files in tests/spaces/ (tiny_space.py, gang_space.py, ...) are two lines calling
tiny_space; tests that need a variant write one with write_space (the `make_space` fixture).
The study name of a space file is its file name, so write the variant as `<name>.py`.
"""
from __future__ import annotations

import os

import fiddle as fdl
import pyglove as pg

from paxsearch.trainer.config import (
    DataConfig,
    EvalConfig,
    LogConfig,
    MeshConfig,
    ModelConfig,
    OptimizerConfig,
    TrainConfig,
)

TINY_MODEL = dict(d_model=32, n_layers=1, n_heads=2, head_dim=16, d_ff=64, seq_len=32, scan_layers=False)
STUDY_DEFAULTS = dict(objectives=["loss", "mfu", "memory"], trials=6, tuner="grid", target="cpu:8", timeout=120,
                      count_flops=False)
# tests/spaces/tiny_space.py: 3 meshes x 2 per-device batches = 6 points, 4 steps, a log line every 2
TINY_DECISIONS = dict(mesh=["8x1x1", "2x2x2", "4x2x1"], per_device_batch=[1, 2])
TINY_FIELDS = dict(steps=4, log_every=2)
# a decision's name -> the tiny_config argument it sets (by default the argument of its own name)
DECISION_ARGS = {"ici_mesh": "mesh", "lr": "peak_lr"}


def study_settings(**settings) -> dict:
    """A STUDY dict: the test defaults (grid over cpu:8, loss/mfu/memory, no FLOP count) with
    `settings` changed."""
    return {**STUDY_DEFAULTS, **settings}


def _mesh(value) -> tuple:
    return tuple(int(x) for x in value.split("x")) if isinstance(value, str) else tuple(value)


def tiny_config(mesh="8x1x1", *, dcn_data: int = 1, per_device_batch=1, steps=2, log_every: int = 1,
                evaluate: bool = False, eval_batches: int | None = None, peak_lr=None, warmup_steps=None,
                data: dict | None = None, model: dict | None = None, **fields) -> fdl.Config:
    """The tiny model's TrainConfig as Fiddle. `mesh` is "AxBxC" (a decision's value as is) or a
    tuple; `dcn_data` slices or processes on the DCN data axis; `data`/`model` change fields of
    DataConfig/the tiny ModelConfig; other keywords are TrainConfig fields (flags, remat, ...)."""
    optimizer = {k: v for k, v in (("peak_lr", peak_lr), ("warmup_steps", warmup_steps)) if v is not None}
    evaluation = dict(enabled=evaluate, **({"max_batches": eval_batches} if eval_batches is not None else {}))
    extra = {"optimizer": fdl.Config(OptimizerConfig, **optimizer)} if optimizer else {}
    if data:
        extra["data"] = fdl.Config(DataConfig, **data)
    return fdl.Config(
        TrainConfig,
        model=fdl.Config(ModelConfig, **{**TINY_MODEL, **(model or {})}),
        mesh=fdl.Config(MeshConfig, ici=_mesh(mesh), **({"dcn": (dcn_data, 1, 1)} if dcn_data != 1 else {})),
        per_device_batch=per_device_batch,
        steps=steps,
        eval=fdl.Config(EvalConfig, **evaluation),
        log=fdl.Config(LogConfig, every_steps=log_every),
        **extra, **fields)


def tiny_space(*, study: dict | None = None, decisions: dict | None = None, **fields):
    """(STUDY, space) of a space file over the tiny model: each decision `name: [values]` is a
    pg.oneof named `name` that sets tiny_config's argument of that name (DECISION_ARGS maps
    the others); `fields` are tiny_config's fixed arguments. With no arguments it is
    tests/spaces/tiny_space.py: 3 meshes x 2 per-device batches, 4 steps; each argument given
    replaces that part of it (`study` settings are merged into the defaults)."""
    settings = study_settings(**(study or {}))
    decisions = dict(TINY_DECISIONS if decisions is None else decisions)
    fields = {**TINY_FIELDS, **fields}

    def space():
        chosen = {DECISION_ARGS.get(name, name): pg.oneof(values, name=name) for name, values in decisions.items()}
        return tiny_config(**{**fields, **chosen})

    return settings, space


def space_text(*, doc: str = "A tiny test space (tests/space_factory.py).", **kwargs) -> str:
    """The source of a space file that calls tiny_space(**kwargs) (values as Python literals)."""
    args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    return (f'"""{doc}"""\nfrom paxsearch.tests.space_factory import tiny_space\n\n'
            f"STUDY, space = tiny_space({args})\n")


def write_space(path, **kwargs) -> str:
    """Write a space file over the tiny model (see tiny_space) to `path`; returns the path."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write(space_text(**kwargs))
    return str(path)


def config_text(**fields) -> str:
    """The source of a `paxsearch train` config file: config() is tiny_config(**fields)."""
    args = ", ".join(f"{k}={v!r}" for k, v in fields.items())
    return ('"""A tiny config for `paxsearch train` (tests/space_factory.py)."""\n'
            "from paxsearch.tests.space_factory import tiny_config\n\n\n"
            f"def config():\n    return tiny_config({args})\n")


def write_config(path, **fields) -> str:
    with open(path, "w") as f:
        f.write(config_text(**fields))
    return str(path)

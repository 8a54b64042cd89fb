"""The study builder the analysis tests share (not a test module).

Studies are built straight through Optuna (create_trial + add_trial) in the run-folder layout
that search/ writes: RUN/study.db, RUN/study.json, RUN/trials/<n>/{config.json,tb/}.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path

import fiddle as fdl
import optuna
from fiddle.experimental import serialization

optuna.logging.set_verbosity(optuna.logging.WARNING)

GIB = 2 ** 30
OBJECTIVES = [{"name": "loss", "direction": "minimize"},
              {"name": "mfu", "direction": "maximize"},
              {"name": "memory", "direction": "minimize"}]
ENV = {"jax": "0.10.2", "jaxlib": "0.10.2", "libtpu": None, "device_kind": "cpu",
       "platform": "cpu", "num_devices": 8,
       "xla_flags": "--xla_force_host_platform_device_count=8",
       "peak_flops_per_device": 5.0e10, "peak_flops_source": "measured matmul"}
SPACE = {"mesh": ["1x8x1", "2x4x1", "1x4x2", "8x1x1"], "per_device_batch": [1, 2, 4],
         "remat": ["none", "dots", "full"], "model_size": ["tiny", "small"]}


@dataclasses.dataclass
class FakeTrainConfig:
    """Stands in for the trainer's TrainConfig: analysis never imports the trainer."""
    mesh: str = "1x8x1"
    per_device_batch: int = 1
    remat: str = "none"
    model_size: str = "tiny"


def distributions() -> dict:
    return {name: optuna.distributions.CategoricalDistribution(values)
            for name, values in SPACE.items()}


def trial_spec(number: int, decisions: dict, *, values=None, failure_kind=None,
               predicted=False, measured=True) -> dict:
    """A trial's state, values and user_attrs as search/ stores them."""
    peak = int((1 + decisions["per_device_batch"]) * (3 - SPACE["remat"].index(
        decisions["remat"])) * (2 if decisions["model_size"] == "small" else 1) * 0.25 * GIB)
    plan = {"peak_bytes": peak, "argument_bytes": peak // 4, "output_bytes": peak // 4,
            "temp_bytes": peak // 2, "xla_flops_per_step": 1.5e12,
            "model_flops_per_step": 10 ** 12, "param_count": 10 ** 6, "compile_seconds": 2.5,
            "global_batch": 8 * decisions["per_device_batch"],
            "predicted_step_time": 0.5 + 0.1 * number, "predicted_mfu": 0.3}
    config = fdl.Config(FakeTrainConfig, **decisions)
    attrs = {"decisions": decisions, "config": serialization.dump_json(config),
             "config_dict": dataclasses.asdict(FakeTrainConfig(**decisions)), "plan": plan,
             "timings": {"plan_s": 2.5, "train_s": 10.0, "total_s": 12.5}, "env": ENV,
             "predicted": predicted, "trial_dir": None}
    if values is None:
        kind = failure_kind or "crash"
        attrs.update(failure_kind=kind, failure_message=f"{kind}: trial {number} | failed")
        if kind == "invalid":
            del attrs["plan"]
        return {"state": optuna.trial.TrialState.FAIL, "values": None, "attrs": attrs}
    loss, mfu, memory = values
    attrs["memory_bytes"] = memory
    if measured and not predicted:
        attrs["measured"] = {"loss": loss, "eval_loss": loss + 0.1, "mfu": mfu,
                             "hfu": mfu * 1.3, "tokens_per_sec": 1000.0 * mfu,
                             "step_time": 0.6 + 0.1 * number, "peak_bytes": memory,
                             "steps": 20}
    return {"state": optuna.trial.TrialState.COMPLETE, "values": list(values),
            "attrs": attrs}


def make_run(run_dir: Path, specs: list[dict], *, objectives=OBJECTIVES, plan_only=False,
             study_name: str = "sweep", storage: str | None = None,
             with_tensorboard: bool = False) -> Path:
    """Create the run folder and its study with the given trial specs (in number order)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    url = storage or f"sqlite:///{run_dir / 'study.db'}"
    study = optuna.create_study(storage=url, study_name=study_name,
                                directions=[o["direction"] for o in objectives])
    study.set_user_attr("objectives", objectives)
    study.set_user_attr("space_file", "spaces/mesh_sweep.py")
    study.set_user_attr("target", "cpu:8")
    study.set_user_attr("mfu_convention", "model FLOPs = 3 x forward matmul FLOPs; "
                        "causal attention at half; embedding lookup not counted")
    study.set_user_attr("plan_only", plan_only)
    (run_dir / "study.json").write_text(json.dumps({"study_name": study_name,
                                                    "storage": storage}))
    for number, spec in enumerate(specs):
        trial_dir = run_dir / "trials" / str(number)
        trial_dir.mkdir(parents=True, exist_ok=True)
        attrs = dict(spec["attrs"], trial_dir=str(trial_dir))
        (trial_dir / "config.json").write_text(json.dumps(attrs["config_dict"]))
        if with_tensorboard and spec["values"] is not None:
            write_trainer_scalars(trial_dir / "tb", loss=spec["values"][0])
        study.add_trial(optuna.trial.create_trial(
            state=spec["state"], values=spec["values"],
            params={name: attrs["decisions"][name] for name in SPACE},
            distributions=distributions(), user_attrs=attrs))
    return run_dir


def write_trainer_scalars(tb_dir: Path, loss: float) -> None:
    """A few scalars as the trainer writes them (tags train/loss, train/mfu); no TensorFlow."""
    from tensorboard.compat.proto import event_pb2
    from tensorboard.plugins.scalar.summary_v2 import scalar_pb
    from tensorboard.summary.writer.record_writer import RecordWriter
    tb_dir.mkdir(parents=True, exist_ok=True)
    with open(tb_dir / "events.out.tfevents.1.trainer", "wb") as f:
        records = RecordWriter(f)
        records.write(event_pb2.Event(file_version="brain.Event:2").SerializeToString())
        for step in (10, 20):
            for tag, value in (("train/loss", loss + 1.0 / step), ("train/mfu", 0.3)):
                event = event_pb2.Event(wall_time=1e9 + step, step=step,
                                        summary=scalar_pb(tag, value))
                records.write(event.SerializeToString())


def grid_specs(n_failed_every: int = 5) -> list[dict]:
    """A deterministic sweep over SPACE: scores from the decisions, some typed failures."""
    specs = []
    kinds = ["predicted_oom", "compile_error", "invalid", "runtime_oom"]
    for number, combo in enumerate(itertools.product(*SPACE.values())):
        decisions = dict(zip(SPACE, combo, strict=True))
        if number % n_failed_every == 3:
            specs.append(trial_spec(number, decisions,
                                    failure_kind=kinds[number % len(kinds)]))
            continue
        mesh_rank = SPACE["mesh"].index(decisions["mesh"])
        batch = decisions["per_device_batch"]
        remat = SPACE["remat"].index(decisions["remat"])
        small = decisions["model_size"] == "small"
        mfu = 0.1 + 0.05 * mesh_rank + 0.04 * batch - 0.03 * remat + 0.02 * small
        memory = float((1 + batch) * (3 - remat) * (2 if small else 1) * 0.25 * GIB)
        loss = 3.0 - 0.4 * small - 0.05 * batch + 0.01 * mesh_rank
        specs.append(trial_spec(number, decisions, values=(loss, mfu, memory)))
    return specs

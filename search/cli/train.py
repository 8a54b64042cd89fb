"""`paxsearch train CONFIG`: a full training run of one config, with Orbax checkpoints."""
from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Sequence

from ...trainer.config import TrainConfig
from ..errors import UserError
from .envsetup import configure_jax_env


def add_parser(sub) -> None:
    p = sub.add_parser("train", help="train one config (Fiddle JSON, Python file, or a trial of a run)",
                       description="Train one config for real, with checkpoints, TensorBoard and a progress bar.")
    p.add_argument("config", nargs="?", default=None,
                   help="Fiddle JSON file, Python file with `def config()`, or a run folder with --trial; without "
                        "it, the trainer's default config (e.g. `paxsearch train --set model=llama-tiny`)")
    p.add_argument("--trial", default=None, help="with a run folder: trial number, or 'best'")
    p.add_argument("--function", default=None, help="function of a Python config file (default: config)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="A.B=VALUE",
                   help="override a config field, e.g. --set model.d_model=256 (repeatable)")
    p.add_argument("--steps", type=int, default=None, help="number of training steps")
    p.add_argument("--run-dir", default=None,
                   help="folder for checkpoints and TensorBoard (default: runs/train-<name>, "
                        "runs/train-<run>-trial<N> for a trial of a run, runs/train-<preset> without CONFIG)")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in the run folder")
    p.add_argument("--checkpoint-every", type=int, default=None, help="save a checkpoint every N steps")
    p.add_argument("--cpu-devices", type=int, default=8, help="simulated CPU devices when running on CPU (default 8)")
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                   help="a module to import first, e.g. one that registers the seqio task of data.task (repeatable)")
    p.set_defaults(func=main)


def from_storage(args) -> bool:
    """The config is a trial's, read from a study (a run folder or a storage URL with --trial)."""
    return args.trial is not None or args.config is not None and os.path.isdir(args.config)


def without_stored_paths(cfg, args):
    """A config read from a study writes only where the user says (--run-dir, --set): its own
    run_dir and checkpoint.directory are dropped, as whoever can write the study could name any folder."""
    if not from_storage(args):
        return cfg
    given = {item.split("=", 1)[0].strip() for item in args.overrides}
    if "run_dir" not in given:
        cfg = dataclasses.replace(cfg, run_dir=None)
    if "checkpoint.directory" not in given:
        cfg = dataclasses.replace(cfg, checkpoint=dataclasses.replace(cfg.checkpoint, directory=None))
    return cfg


def resolve_config(args) -> tuple[object, int | None]:
    """(the Fiddle config with --set applied, the trial number when it is a stored trial's)."""
    from ..study import configio

    number = None
    if args.config is None:
        if args.trial is not None:
            raise UserError("--trial needs the run folder (or storage URL) of the study: "
                            "paxsearch train RUN --trial N")
        cfg = configio.to_fiddle(TrainConfig())  # the trainer's defaults, then --set (model=<preset>)
    elif from_storage(args):
        from ..study.trial_config import trial_config_json  # run folder or storage: the stored trial's config
        number, text = trial_config_json(args.config, args.trial or "best")
        cfg = configio.loads(text)
    else:
        cfg = configio.load(args.config, args.function)
    return configio.apply_overrides(cfg, args.overrides), number  # ConfigFileError: a UserError, one line


def default_run_dir(config_arg: str | None, trial: int | None, overrides: Sequence[str] = ()) -> str:
    """runs/train-<config or run folder name>, and -trial<N> for a stored trial: two trials of one
    study train into two folders. Without a config: runs/train-<the model preset of --set model=>,
    or runs/train-default."""
    from ...store.paths import sanitized_folder_name

    if config_arg is None:
        presets = [v.strip() for k, _, v in (o.partition("=") for o in overrides) if k.strip() == "model"]
        name = presets[-1] if presets else "default"
    else:
        name = os.path.splitext(os.path.basename(os.path.normpath(config_arg)))[0]
    suffix = f"-trial{trial}" if trial is not None else ""
    return os.path.join("runs", sanitized_folder_name(f"train-{name}{suffix}"))


def _platform() -> str:
    """The platform JAX will start here: JAX_PLATFORMS when set, else the accelerator found."""
    first = os.environ.get("JAX_PLATFORMS", "").split(",")[0].strip().lower()
    if first:
        return {"cuda": "gpu", "rocm": "gpu"}.get(first, first)
    if os.path.exists("/dev/accel0") or os.path.exists("/dev/vfio/0"):
        return "tpu"
    return "gpu" if os.path.exists("/dev/nvidia0") else "cpu"


def apply_flag_set(name: str) -> None:
    """Run with the config's compiler flag set (trainer/flagsets.py): its flags go into this
    process's environment before JAX starts its backend. Should JAX already be imported here
    (a Python config file that imports it), the command starts again with them set."""
    from ...trainer import flagsets

    platform = _platform()
    flagsets.check(name)  # ConfigError: one line (cli.main)
    if flagsets.applied(name, os.environ, platform):  # "default" always is
        os.environ[flagsets.SET_ENV] = name
        return
    if name != "default":
        flagsets.validate(name, platform)  # one line instead of XLA's abort on an unknown flag
    env = flagsets.env_for(name, platform)
    if "jax" not in sys.modules:
        os.environ.update(env)
        return
    if os.environ.get("PAXSEARCH_TRAIN_RESTARTED"):  # started again and still not applied
        raise UserError(f"compiler flag set {name!r} is not applied in this process; set XLA_FLAGS / "
                        f"LIBTPU_INIT_ARGS as `{flagsets.describe(name)}` says")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, sys.orig_argv, {**os.environ, **env, "PAXSEARCH_TRAIN_RESTARTED": "1"})


RESUME_MAY_CHANGE = ("steps", "log", "checkpoint", "run_dir")  # what --resume may change in the config


def _differences(old, new, prefix: str = "") -> list[tuple[str, object, object]]:
    if isinstance(old, dict) and isinstance(new, dict):
        return [d for k in sorted(set(old) | set(new))
                for d in _differences(old.get(k), new.get(k), f"{prefix}{k}.")]
    return [] if old == new else [(prefix.rstrip("."), old, new)]


def check_resume(cfg, run_dir: str, ckpt_dir: str) -> None:
    """--resume continues the run folder's own training: it needs a checkpoint there and the
    same config (only steps, logging and checkpointing may change); one line otherwise."""
    from ..study import configio

    if not (os.path.isdir(ckpt_dir) and any(n.isdigit() for n in os.listdir(ckpt_dir))):
        raise UserError(f"--resume: {ckpt_dir} holds no checkpoint; drop --resume to start at step 0")
    path = os.path.join(run_dir, "config.json")
    try:
        with open(path) as f:
            stored = configio.to_json_dict(configio.build(configio.loads(f.read())))
    except OSError:
        raise UserError(f"--resume: {path} is missing, so the checkpoint's config is unknown; "
                        "use a new --run-dir") from None
    except (configio.ConfigFileError, ValueError, TypeError) as e:
        raise UserError(f"--resume: {path} is unreadable ({e}); use a new --run-dir") from None
    diffs = [(k, a, b) for k, a, b in _differences(stored, configio.to_json_dict(cfg))
             if k.split(".")[0] not in RESUME_MAY_CHANGE]
    if diffs:
        shown = ", ".join(f"{k} ({a!r} -> {b!r})" for k, a, b in diffs[:4]) + (", ..." if len(diffs) > 4 else "")
        raise UserError(f"--resume: the config differs from the checkpoint's ({path}) in {shown}; resume with "
                        "the same config (only steps, log and checkpoint may change), or use a new --run-dir")


def check_shell_xla_flags() -> None:
    """XLA aborts (a fatal log, no Python error) on a flag of XLA_FLAGS it does not know, after
    the run folder is written: the shell's own flags are probed first, and refused in one line."""
    from ...trainer import flagsets

    own = flagsets.own_flags()
    if not own or flagsets.SET_ENV in os.environ and os.environ[flagsets.SET_ENV] != "default":
        return  # nothing of the user's own, or a flag set's flags (apply_flag_set probed them)
    flagsets.validate("default", _platform())  # ConfigError: one line (cli.main)


def main(args) -> int:
    configure_jax_env(cpu_devices=args.cpu_devices)
    from ..study.user_imports import import_modules

    import_modules(args.imports)  # ImportFailed: one line, before anything is written
    fcfg, trial = resolve_config(args)
    from ..study import configio

    cfg = without_stored_paths(configio.build(fcfg), args)
    apply_flag_set(cfg.flags)  # before JAX starts
    run_dir = args.run_dir or cfg.run_dir or default_run_dir(args.config, trial, args.overrides)
    ckpt = dataclasses.replace(cfg.checkpoint, enabled=True,
                               every_steps=args.checkpoint_every or cfg.checkpoint.every_steps or 0)
    cfg = dataclasses.replace(cfg, run_dir=run_dir, checkpoint=ckpt, steps=args.steps or cfg.steps,
                              log=dataclasses.replace(cfg.log, progress=True))
    ckpt_dir = os.path.join(run_dir, "checkpoints") if not ckpt.directory else ckpt.directory
    from ..study.run_folder import check_writable

    check_writable(run_dir)  # a file, under a file, read-only: one line before anything starts
    if ckpt.directory:
        check_writable(ckpt_dir, "checkpoint folder")
    if not args.resume and os.path.isdir(ckpt_dir) and os.listdir(ckpt_dir):
        raise UserError(f"{ckpt_dir} already holds checkpoints; pass --resume to continue, or a new --run-dir")
    if args.resume:  # before anything is written: a refused resume leaves the run folder as it was
        check_resume(cfg, run_dir, ckpt_dir)
    check_shell_xla_flags()
    from ...trainer import distributed
    from ...trainer.plan import build_program  # JAX only: a refused mesh pays no seqio/TensorFlow import
    from ..planning.predict import hlo_cost
    from .recheck import check_recheck, planned_recheck

    # Every refusal before the first write: the mesh against this machine's devices (e.g. a
    # --resume with another --cpu-devices), remat, memory, the data vocabulary. A refused run
    # leaves the run folder as it was (config.json, env.json, checkpoints untouched).
    distributed.maybe_initialize(cfg.distributed)
    memory = device_memory()
    recheck = planned_recheck(args.config if trial is not None else None, trial, _device_platform())
    if recheck is not None:  # a plan of another libtpu: the compile below is its memory's re-check
        print(f"paxsearch: {recheck.line}", file=sys.stderr, flush=True)
    check_state_fits(cfg, memory)  # parameters and optimizer state alone: no compile
    program = build_program(cfg, hlo_flops=hlo_cost)  # ConfigError: one line (cli.main); HFU from the HLO
    check_recheck(recheck, program.plan.peak_bytes, memory.bytes, memory.source)
    check_compiled_fits(program.plan.peak_bytes, memory)
    from ...trainer.train import check_vocab, train

    check_vocab(cfg)
    from ..trial.execute import environment

    env = environment()
    os.makedirs(run_dir, exist_ok=True)
    _write_whole(os.path.join(run_dir, "config.json"), configio.dumps(configio.to_fiddle(cfg)))
    _write_whole(os.path.join(run_dir, "env.json"), json.dumps(env, indent=2))  # versions, devices, compiler flags
    result = train(cfg, program=program)  # ConfigError / DataError: exit 2, NonFiniteLoss: exit 3 (cli.main)
    _summary(result, run_dir)
    return 0


def _device_platform() -> str:
    """The platform of this process's first device (jax.devices()[0].platform)."""
    import jax

    return jax.devices()[0].platform


MEMORY_FIX = ("use a smaller model (e.g. --set model=llama-tiny), a smaller model.seq_len or per_device_batch, "
              "a remat policy (--set remat=full) or more devices")


@dataclasses.dataclass(frozen=True)
class DeviceMemory:
    bytes: int  # per device
    source: str  # what the figure is


def device_memory() -> DeviceMemory:
    """The bytes one local device may use: its bytes_limit where it reports one (GPU, TPU), else
    (CPU) the host's RAM over the local devices, which share it. The same figure the search holds
    a CPU trial against (search/planning/topology.py local_device_memory)."""
    import jax
    import psutil

    from ..planning.topology import local_device_memory

    device = jax.local_devices()[0]
    limit, reported = local_device_memory()
    if reported:
        return DeviceMemory(limit, f"{device.device_kind} bytes_limit")
    total, count = psutil.virtual_memory().total, jax.local_device_count()
    return DeviceMemory(limit, f"host RAM {total / 2**30:.2f} GiB shared by {count} local "
                               f"{device.platform.upper()} devices")


def check_state_fits(cfg, memory: DeviceMemory) -> None:
    """UserError (one line) when the parameters, gradients and AdamW moments alone exceed a device's
    memory: a config far too large is refused in an instant, before it is compiled."""
    import jax

    from ...trainer import validate
    from ...trainer.errors import ConfigError
    from ..planning.analytic import prescreen
    from ..planning.targets import Target

    devices = jax.devices()
    try:  # a config the static checks refuse is left to build_program, which says why
        validate.check(cfg, len(devices), devices[0].platform, jax.process_count())
    except ConfigError:
        return
    oom = prescreen(cfg, Target(f"{devices[0].platform}:{len(devices)}", devices[0].platform, len(devices)),
                    memory.bytes)
    if oom is not None:
        raise UserError(f"the config does not fit a device here: {oom} ({memory.source}); {MEMORY_FIX}")


def check_compiled_fits(peak_bytes: int, memory: DeviceMemory) -> None:
    """UserError (one line) when the compiled step's per-device memory (XLA's memory analysis)
    exceeds a device's memory: refused before any array is allocated."""
    if peak_bytes > memory.bytes:
        raise UserError(f"the config does not fit a device here: the compiled step needs {peak_bytes / 2**30:.2f} "
                        f"GiB per device (XLA's memory analysis), above {memory.bytes / 2**30:.2f} GiB per device "
                        f"({memory.source}); {MEMORY_FIX}")


def _write_whole(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _summary(result, run_dir: str) -> None:
    f = result.final
    plan = result.plan
    lines = [
        f"steps {result.start_step}->{result.start_step + result.steps_run}"
        + (" (stopped early)" if result.stopped_early else ""),
        f"params {plan.param_count:,}  devices {plan.num_devices} ({plan.device_kind})  mesh {plan.mesh_shape}",
    ]
    if f:
        eval_loss = f"  eval loss {result.eval_loss:.4f}" if result.eval_loss is not None else ""
        lines.append(f"loss {f.loss:.4f}{eval_loss}")
        lines.append(f"{f.tokens_per_sec:,.0f} tokens/s  step {f.step_time * 1e3:.1f} ms  "
                     f"MFU {f.mfu:.1%}  HFU {f.hfu:.1%}")
        if f.load_balance_loss is not None:  # a mixture of experts: dropped routes raise MFU, lower quality
            lines.append(f"MoE: load-balance loss {f.load_balance_loss:.4f}  "
                         f"dropped {f.dropped_fraction:.2%} of routes")
        lines.append(f"memory per device: compiled {plan.peak_bytes / 2**20:.1f} MiB, " + _measured_text(plan, f))
    if result.checkpoint_seconds is not None:
        lines.append(_checkpoint_line(result.checkpoint_seconds))
    lines.append(f"run folder {run_dir} (checkpoints/, tb/, config.json, env.json)")
    print("\n".join(lines))


def _measured_text(plan, f) -> str:
    """The measured side of the memory line: the process's RSS on CPU, the device's peak elsewhere."""
    mib = f.measured_peak_bytes / 2**20
    if plan.platform == "cpu":
        return f"process peak RSS {mib:.1f} MiB (CPU: the whole process)"
    if not f.measured_peak_bytes:
        return "measured peak: not measured (an earlier run in this process set the device's high-water marks)"
    return f"measured peak {mib:.1f} MiB (buffers + program temporaries)"


def _checkpoint_line(c) -> str:
    """What the checkpoint saves cost the run (trainer/results.py CheckpointSeconds), apart from step time."""
    waited = (f", {c.waiting_for_previous_s:.1f} s of it waiting for the previous write"
              if c.waiting_for_previous_s >= 0.05 else "")
    return (f"checkpoints: {c.saves} save{'s' if c.saves != 1 else ''}, {c.blocking_s:.1f} s blocking "
            f"({c.blocking_per_save_s:.2f} s a save{waited}), {c.final_wait_s:.1f} s waiting for the last write at "
            "exit; not counted in step time")

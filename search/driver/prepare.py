"""A trial's config and static checks in the driver, before any worker: the config built from
the trial's decisions, its token budget (STUDY tokens= or compute=), the static check and the compiler flag
set probed; in plan-only mode the trial is settled here when the study already knows its answer.
A trial that ends here never reaches a worker.

The trainer modules that import JAX are imported inside the functions, so that the driver
(which never runs a step) does not import JAX.
"""
from __future__ import annotations

import os

import optuna

from ...store.outcome import TrialOutcome
from ...trainer import flagsets
from ..planning import screen as plan_screen
from ..planning.targets import flag_probe
from ..study import configio
from ..study import storage as storage_lib
from ..study.run_folder import write_whole
from ..study.settings import SettingsError, steps_for_tokens, tokens_for_compute
from ..study.space import SpaceError, config_dict
from ..trial.classify import Phase, classify
from ..tuning import steer
from .context import StudyContext


def _set_attr(trial, key: str, value) -> None:
    """trial.set_user_attr through storage_lib.retry: a database that blips while a trial is prepared
    is waited for, and one that stays away stops the driver with one line (StorageError)."""
    storage_lib.retry(trial.set_user_attr, key, value)


def worker_flags(cfg) -> str:
    """The compiler flag set a config's worker runs with: its own when known, else "default"
    (an unknown name fails the trial in the driver, before any worker)."""
    return cfg.flags if flagsets.known(cfg.flags) else "default"


def first_flag_set(ctx: StudyContext) -> str:
    """The compiler flag set the study's workers start with: the first config's."""
    return worker_flags(configio.build(ctx.space.first_config()))


def token_budget(cfg, tokens: int | None, num_devices: int, compute: int | None = None) -> dict:
    """The steps that give `cfg` a budget of `tokens` training tokens on `num_devices`
    (settings.steps_for_tokens), or of `compute` model FLOPs (the tokens that spend them at this
    model's FLOPs per token: settings.tokens_for_compute), with the figures stored on the trial.
    Loss is then scored on held-out data, so a config that does not evaluate cannot be scored
    (ConfigError)."""
    from ...trainer import flops as flops_lib
    from ...trainer import mesh as mesh_lib
    from ...trainer.errors import ConfigError

    what = "compute=" if compute else "tokens="
    if not cfg.eval.enabled:
        raise ConfigError(f"STUDY {what} scores loss as the held-out eval loss, and this config has "
                          "eval.enabled=False; enable eval in space() (eval=EvalConfig(enabled=True))")
    extra = {}
    if compute:
        per_token = 3 * flops_lib.forward_flops_per_token(cfg.model)
        tokens = tokens_for_compute(compute, per_token)
        extra = {"compute": int(compute), "flops_per_token": int(per_token)}
    assert tokens is not None
    batch = mesh_lib.global_batch_size(cfg, num_devices)
    steps = steps_for_tokens(tokens, batch, cfg.model.seq_len)
    per_step = batch * cfg.model.seq_len
    return {"tokens": int(tokens), "global_batch": int(batch), "seq_len": int(cfg.model.seq_len),
            "tokens_per_step": int(per_step), "steps": int(steps), "tokens_trained": int(steps * per_step), **extra}


def prepare(ctx: StudyContext, trial: optuna.Trial, decisions: dict,
            trial_dir: str) -> tuple[TrialOutcome | None, str | None, str]:
    """Config and static checks in the driver: (the outcome when the trial ends here, config
    JSON, compiler flag set). With STUDY tokens= or compute=, the config's steps are the token budget's."""
    from ...trainer import validate
    from ...trainer.errors import ConfigError

    try:
        cfg = ctx.space.config(decisions)
        built = configio.build(cfg)
    except (SpaceError, configio.ConfigFileError, TypeError, ValueError) as e:
        return TrialOutcome.failure(*classify(e, Phase.SETUP)), None, "default"
    flags = worker_flags(built)
    budget = None
    if (ctx.settings.tokens or ctx.settings.compute) and not ctx.target.plan_only:
        try:
            budget = token_budget(built, ctx.settings.tokens, ctx.target.num_devices, ctx.settings.compute)
        except (ConfigError, SettingsError) as e:
            return TrialOutcome.failure(*classify(e, Phase.SETUP)), None, flags
        cfg.steps = budget["steps"]
        built = configio.build(cfg)
        _set_attr(trial, "token_budget", budget)
    config_json = configio.dumps(cfg)
    _set_attr(trial, "config", config_json)
    _set_attr(trial, "config_dict", config_dict(cfg))
    write_whole(os.path.join(trial_dir, "config.json"), config_json)
    try:
        target = ctx.target.for_config(built)  # slices=auto: prod(mesh.dcn) slices for this trial
        validate.check(built, target.num_devices, target.platform, ctx.settings.processes, target.chip)
        if built.flags != "default":  # XLA aborts on a flag it does not know: one probe per set
            flagsets.validate(built.flags, target.platform, probe=flag_probe(target),
                              compile_only=target.plan_only)
    except ConfigError as e:
        return TrialOutcome.failure(*classify(e, Phase.CHECK)), config_json, flags
    if not target.plan_only:  # steering and the math group's loss (Driver._inherit_group_loss) read it
        _set_attr(trial, "math_key", steer.math_key(built, target.num_devices))
    if target.plan_only:  # settled here when the study already knows the answer
        _set_attr(trial, "plan_target", target.name)  # the trial's concrete target
        keys = plan_screen.keys_attrs(built, target)
        for key, value in keys.items():
            _set_attr(trial, key, value)
        trials = ctx.study.get_trials(deepcopy=False)
        return (plan_screen.screen(built, target, keys, trials, ctx.settings.memory_budget), config_json,
                flags)
    return None, config_json, flags

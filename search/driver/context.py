"""Create or reopen a study and everything a driver needs about it (StudyContext).

The study's user attributes keep what any later driver needs to continue it on any machine:
objectives, settings, the space file (path and source), fixed decisions and overrides.
"""
from __future__ import annotations

import os
import re
import socket
import time
from dataclasses import dataclass

import optuna

from ...store.paths import UnsafeFolderName, folder_name
from ...trainer import flagsets
from ...trainer.errors import ConfigError
from ...trainer.flops import MFU_CONVENTION
from ..errors import UserError
from ..planning.targets import Target, TargetError, check_available, flag_probe, parse_target
from ..planning.topology import LibtpuMissing
from ..study import storage as storage_lib
from ..study.run_folder import check_writable
from ..study.settings import OBJECTIVES, SettingsError, StudySettings
from ..study.space import Space, SpaceError, load_space
from ..study.user_imports import ImportFailed, import_modules
from ..tuning.tuners import TunerError, make_proposer

PLAN_OBJECTIVES = ("mfu", "memory", "time_to_train")  # a plan-only trial: predicted MFU and step time, compiled memory


class SetupError(UserError, ValueError):
    """The study cannot be set up; one line for the user."""


@dataclass
class StudyContext:
    study: optuna.Study
    storage: optuna.storages.BaseStorage
    url: str
    run_dir: str
    space: Space
    settings: StudySettings
    target: Target
    lock: storage_lib.StudyLock
    seed: int
    created: bool = False  # `run` created the study: removed again when the run fails before any trial

    @property
    def name(self) -> str:
        return self.study.study_name


def check_settings(settings: StudySettings, space: Space, compiles: bool = True) -> Target:
    """Settings that cannot work with this space: one clear line each. `compiles=False` (a dry
    run, which compiles nothing) does not need libtpu for a TPU target."""
    try:
        target = parse_target(settings.target)
        target.devices_per_process(settings.processes)
        if compiles:
            check_available(target)
    except (TargetError, LibtpuMissing) as e:
        raise SetupError(str(e)) from None
    if target.plan_only:
        unknown = [o for o in settings.objectives if o not in PLAN_OBJECTIVES]
        if unknown:
            raise SetupError(f"target {target.text} is planned, never run, so {', '.join(unknown)} cannot be scored; "
                             f"use objectives from {', '.join(PLAN_OBJECTIVES)} (--objective mfu,memory)")
        if settings.pruner != "none":
            raise SetupError(f"target {target.text} is planned, never run: no intermediate loss to prune on; "
                             "use --pruner none")
        if settings.steer != "none":
            raise SetupError(f"target {target.text} is planned, never run: every trial is a prediction already, "
                             "so there is no training to skip; use --steer none")
    if settings.pruner != "none" and len(settings.objectives) > 1:
        raise SetupError(f"pruner {settings.pruner} needs a single objective; pass --objective loss|mfu|memory")
    try:
        make_proposer(settings, space, 0)
    except TunerError as e:
        raise SetupError(str(e)) from None
    try:  # before anything is written: an unimportable module leaves no study behind
        import_modules(settings.imports)
    except ImportFailed as e:
        raise SetupError(str(e)) from None
    return target


def neighbour_configs(space: Space) -> list:
    """The built configs of the first point and of every point one decision away from it (each
    value of each decision once): what a setting that one decision selects (flag set, data
    source) can be, without building the whole space. Points space() cannot build are left to
    the driver to report."""
    from ..study import configio

    base = space.full({d.name: (d.low if d.kind == "float" else d.values[0]) for d in space.decisions})
    points = [base] + [{**base, d.name: v} for d in space.decisions
                       for v in ((d.low, d.high) if d.kind == "float" else d.values[1:])]
    built = []
    for point in points:
        try:
            built.append(configio.build(space.config(point)))
        except (SpaceError, configio.ConfigFileError, TypeError, ValueError):
            continue
    return built


def flag_sets_of(space: Space, configs: list | None = None) -> list[str]:
    """The compiler flag sets the space's configs name (neighbour_configs; the driver checks
    every trial's set again)."""
    return list(dict.fromkeys(cfg.flags for cfg in (neighbour_configs(space) if configs is None else configs)))


def _own_flags() -> bool:
    """The shell sets compiler flags of its own (XLA_FLAGS beyond the simulated device count
    and paxsearch's collective timeout, or LIBTPU_INIT_ARGS)."""
    return bool(flagsets.own_flags().strip() or os.environ.get("LIBTPU_INIT_ARGS", "").strip())


def check_data(configs: list) -> None:
    """Every data source the configs name can be read here: a registered seqio task (after the
    study's imports), text files that exist (SetupError, one line, before anything is written)."""
    from ..study.data_check import data_problem

    for cfg in configs:
        problem = data_problem(cfg.data)
        if problem:
            raise SetupError(problem)


def check_configs(space: Space, settings: StudySettings, target: Target) -> None:
    """Before any worker starts: every data source the space names can be read, every compiler
    flag set it names exists, and the installed XLA / libtpu knows its flags (one probe process
    per non-default set that applies to the target's TPU generation; a set that does not apply
    fails each trial naming it in the static check); with
    STUDY tokens= or compute=, the configs evaluate (loss is then the held-out eval loss)."""
    configs = neighbour_configs(space)
    check_data(configs)
    try:
        for name in flag_sets_of(space, configs):
            flagsets.check(name)
            # "default" adds nothing, but a plan-only target compiles with another XLA than this
            # process's (libtpu's own), which may not know a flag of the shell's XLA_FLAGS: each
            # trial's worker would exit on it, so those flags are probed too (one line here)
            probe = name != "default" or (target.plan_only and _own_flags())
            if probe and flagsets.applies(name, target.platform, target.chip):
                flagsets.validate(name, target.platform, probe=flag_probe(target),
                                  compile_only=target.plan_only)
    except ConfigError as e:
        raise SetupError(str(e)) from None
    if (settings.tokens or settings.compute) and not target.plan_only:
        from ..study import configio

        first = configio.build(space.first_config())
        what = f"tokens={settings.tokens}" if settings.tokens else f"compute={settings.compute}"
        if not first.eval.enabled:
            raise SetupError(f"STUDY {what} scores loss as the held-out eval loss, and the space's "
                             "config has eval.enabled=False; enable eval in space() (eval=EvalConfig(enabled=True))")


def loss_objective(space: Space, settings: StudySettings, target: Target) -> str | None:
    """What the objective `loss` is in this study, for reports (None when nothing is trained)."""
    from ..study import configio

    if target.plan_only:
        return None
    if settings.tokens:
        return (f"loss = held-out eval loss after {settings.tokens:,} tokens per trial (steps = tokens / "
                "(global batch x seq_len), to the nearest step)")
    if settings.compute:
        return (f"loss = held-out eval loss after {settings.compute:.3g} model FLOPs per trial (equal compute: "
                "tokens = compute / the model's FLOPs per token; steps = tokens / (global batch x seq_len), to "
                "the nearest step)")
    try:
        evaluates = configio.build(space.first_config()).eval.enabled
    except (SpaceError, configio.ConfigFileError, TypeError, ValueError):
        return None
    if evaluates:
        return ("loss = held-out eval loss after each config's own steps (no token budget: trials may see "
                "different numbers of tokens; set STUDY tokens=, or compute= across model sizes)")
    return "loss = last training batch's loss after each config's own steps (eval disabled, no token budget)"


def study_attrs(space: Space, settings: StudySettings, target: Target) -> dict:
    try:
        source = open(space.path).read()
    except OSError:
        source = None
    return {
        "objectives": [{"name": o, "direction": OBJECTIVES[o]} for o in settings.objectives],
        "space_file": space.path,
        "space_source": source,
        "target": settings.target,
        "mfu_convention": MFU_CONVENTION,
        "plan_only": target.plan_only,
        "loss_objective": loss_objective(space, settings, target),
        "settings": settings.to_dict(),
        "fixed": dict(space.fixed),
        "overrides": list(space.overrides),
        "created_on": socket.gethostname(),
        "created_at": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def _open(url: str, create: bool = True):
    try:
        return storage_lib.open_storage(url, create=create)
    except storage_lib.StorageError as e:
        raise SetupError(str(e)) from None


def create_or_continue(space: Space, settings: StudySettings, run_dir: str, url: str | None,
                       study_name: str | None, seed: int | None = None) -> StudyContext:
    """`paxsearch run`: a new study, or the one already in this run folder / storage."""
    target = check_settings(settings, space)
    check_configs(space, settings, target)
    meta = storage_lib.read_study_json(run_dir) or {}
    if url is None and meta.get("storage") and "***" in meta["storage"]:
        raise SetupError(f"{run_dir} uses storage {meta['storage']}; pass --storage with the password")
    url = url or meta.get("storage") or storage_lib.default_url(run_dir)
    name = study_name or meta.get("study_name") or space.name
    with storage_lib.removed_on_failure(url):  # a new study.db that fails (e.g. a full disk) is not left behind
        try:
            return _create_or_continue(space, settings, target, run_dir, url, name, seed)
        except Exception as e:
            lasting = storage_lib.lasting_error(e, then="")
            if lasting is not None:
                raise SetupError(f"storage {storage_lib.mask_url(url)}: {lasting}") from None
            raise


def _create_or_continue(space: Space, settings: StudySettings, target: Target, run_dir: str, url: str, name: str,
                        seed: int | None) -> StudyContext:
    storage = _open(url)
    try:
        study = optuna.create_study(study_name=name, storage=storage, load_if_exists=True,
                                    directions=settings.directions)
    except ValueError as e:  # directions differ from the stored study
        raise SetupError(f"study {name!r} in {storage_lib.mask_url(url)} has other objectives: {e}") from None
    except Exception as e:
        if storage_lib.lasting_error(e) is not None:
            raise
        raise SetupError(f"cannot use storage {storage_lib.mask_url(url)}: "
                         f"{storage_lib.scrub(str(e).splitlines()[0] if str(e) else type(e).__name__, url)}") from None
    attrs = study.user_attrs
    created = not attrs.get("settings")
    if attrs.get("settings"):
        stored = [o["name"] for o in attrs.get("objectives", [])]
        if stored != list(settings.objectives):
            raise SetupError(f"study {name!r} was created with objectives {stored}; use a new --run-dir "
                             f"for objectives {list(settings.objectives)}")
        if attrs.get("fixed", {}) != dict(space.fixed):
            raise SetupError(f"study {name!r} was created with --set {attrs.get('fixed')}; use the same --set or "
                             "a new --run-dir")
    if created:  # optuna-dashboard and optuna.visualization label the objectives with these
        study.set_metric_names(list(settings.objectives))
    for key, value in study_attrs(space, settings, target).items():
        if key in ("created_on", "created_at") and key in attrs:
            continue
        study.set_user_attr(key, value)
    storage_lib.write_study_json(run_dir, name, url, space.path)
    return StudyContext(study, storage, url, run_dir, space, settings, target,
                        storage_lib.StudyLock(url, name), settings.seed if seed is None else seed, created)


def reopen(url: str, study_name: str | None, run_dir: str | None, overrides: dict,
           seed: int | None = None, trust_stored_space: bool = False) -> StudyContext:
    """`paxsearch worker` / `resume`: continue a stored study with its own space and settings.
    The study's stored space source (code) runs only when `trust_stored_space`. The storage must
    exist already (a missing SQLite file is refused, nothing created)."""
    storage = _open(url, create=False)
    try:
        names = [s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)]
    except Exception as e:
        raise SetupError(f"cannot read storage {storage_lib.mask_url(url)}: "
                         f"{storage_lib.scrub(type(e).__name__ + ': ' + str(e).splitlines()[0], url)}") from None
    if study_name is None:
        if len(names) != 1:
            raise SetupError(f"storage {storage_lib.mask_url(url)} holds {len(names)} studies ({', '.join(names)}); "
                             "pass --study NAME")
        study_name = names[0]
    if study_name not in names:
        raise SetupError(f"no study {study_name!r} in {storage_lib.mask_url(url)}; "
                         f"studies: {', '.join(names) or 'none'}")
    study = optuna.load_study(study_name=study_name, storage=storage)
    attrs = study.user_attrs
    if "settings" not in attrs:
        raise SetupError(f"study {study_name!r} was not created by paxsearch run (no settings stored)")
    if run_dir is None:  # runs/<study name>: a name from storage, never a path
        try:
            run_dir = os.path.join("runs", folder_name(study_name))
        except UnsafeFolderName as e:
            raise SetupError(f"{e}, so it cannot name the run folder runs/<study>; pass --run-dir DIR") from None
    check_writable(run_dir)  # before the stored space copy or study.json is written
    space = _stored_space(attrs, run_dir, trust_stored_space)
    try:
        stored = dict(attrs["settings"])
        stored["objectives"] = tuple(stored["objectives"])
        if stored.get("plan_cache", "on") not in ("on", "off"):
            # a folder in storage never chooses where this machine writes plans: its own default
            # ($PAXSEARCH_PLAN_CACHE, else the cache root) holds them; off stays off
            stored["plan_cache"] = "on"
        settings = StudySettings.from_dict(stored).replace(**overrides)
        for name, value in attrs.get("fixed", {}).items():
            space.fix(name, value)
        space.apply_sets(list(attrs.get("overrides", [])))  # checked as --set is: storage may hold anything
    except (SettingsError, SpaceError) as e:
        raise SetupError(str(e)) from None
    target = check_settings(settings, space)
    check_configs(space, settings, target)
    if storage_lib.read_study_json(run_dir) is None:
        storage_lib.write_study_json(run_dir, study_name, url, space.path)
    return StudyContext(study, storage, url, run_dir, space, settings, target,
                        storage_lib.StudyLock(url, study_name), settings.seed if seed is None else seed)


def _stored_space(attrs: dict, run_dir: str, trust_stored_space: bool = False) -> Space:
    path = attrs.get("space_file")
    if not path or not os.path.exists(path):
        source = attrs.get("space_source")
        if not source:
            raise SetupError(f"the study's space file {path} is not on this machine and the study holds no copy")
        if not trust_stored_space:  # whoever can write the database could put any code there
            raise SetupError(f"the study's space file {path} is not on this machine; copy it here, or pass "
                             "--trust-stored-space to run the copy stored in the study (it is Python code: "
                             "trust everyone who can write that database)")
        path = os.path.join(run_dir, stored_space_name(path))
        print(f"running the space source stored in the study (--trust-stored-space), as {path}", flush=True)
        os.makedirs(run_dir, exist_ok=True)
        with open(path, "w") as f:
            f.write(source)
    try:
        return load_space(path)
    except SpaceError as e:
        raise SetupError(str(e)) from None


def stored_space_name(stored_path: str | None) -> str:
    """The file name the stored space source is written under in the run folder: the stored
    path's own name when it is a plain `NAME.py`, else space.py (never a path, never study.db)."""
    name = os.path.basename(str(stored_path or ""))
    return name if re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\.py", name) else "space.py"


def with_cli(settings: StudySettings, **cli) -> StudySettings:
    """Settings with the command line's values (None = not given) laid over them."""
    try:
        return settings.replace(**cli)
    except SettingsError as e:
        raise SetupError(str(e)) from None


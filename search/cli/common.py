"""Options and output shared by `run`, `worker` and `resume`."""
from __future__ import annotations

import collections
import contextlib
import os
import sys

from ...store import compiler
from ...store.outcome import kind_of, plan_of
from ..errors import ShutDown
from ..study.settings import STEERS


def add_study_options(p, *, for_new: bool) -> None:
    p.add_argument("--trials", type=int, default=None, help="trial budget (default: the space file's)")
    p.add_argument("--timeout", type=float, default=None, metavar="S", help="wall-clock limit per trial, seconds")
    p.add_argument("--workers", type=int, default=None, help="trials run at once by this driver (default 1)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (trial lines only)")
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                   help="a module the driver and every worker import first, e.g. one that registers the seqio "
                        "task of --set data.task=NAME (repeatable; stored in the study by name)")
    if for_new:
        p.add_argument("--tuner", default=None, help="tpe | nsga2 | random | grid | evolution")
        p.add_argument("--objective", dest="objectives", action="append", default=[], metavar="NAME[,NAME]",
                       help="objectives instead of loss, mfu and memory: loss | mfu | memory | time_to_train "
                            "(repeatable or comma-separated, e.g. mfu,memory)")
        p.add_argument("--memory-budget", default=None, metavar="B",
                       help="per-device bytes a plan may use, e.g. 2GiB (default: the device's memory)")
        p.add_argument("--pruner", default=None, help="none | median | hyperband (single objective only)")
        p.add_argument("--processes", type=int, default=None,
                       help="processes per trial (jax.distributed, devices split between them)")
        p.add_argument("--target", default=None, help="devices of one trial, e.g. cpu:8")
        p.add_argument("--seed", type=int, default=None, help="seed of the tuner")
        p.add_argument("--steer", default=None, choices=STEERS,
                       help="predicted: skip a trial after compiling when its predicted MFU (times its own "
                            "measured/predicted bound, from a model learned from the measured trials) and "
                            "compiled memory say a finished trial dominates it; global: the same with one bound "
                            "for every point; learned: predicted's earlier name (default none)")
    else:
        p.add_argument("--trust-stored-space", action="store_true",
                       help="when the study's space file is not on this machine, run the copy stored in the "
                            "study (Python code: trust everyone who can write the database)")


def objective_names(values: list[str]) -> tuple[str, ...] | None:
    """The objectives of `--objective A --objective B,C`, in order (None: none given). Names are
    checked with the study's settings (one line naming the known ones)."""
    names = tuple(n.strip() for v in values for n in v.split(","))
    return names or None


def cli_settings(args, *, for_new: bool) -> dict:
    out = {"trials": args.trials, "timeout": args.timeout, "workers": args.workers,
           "imports": tuple(args.imports) or None}
    if for_new:
        out.update(tuner=args.tuner, objectives=objective_names(args.objectives),
                   memory_budget=args.memory_budget, pruner=args.pruner, processes=args.processes,
                   target=args.target, seed=args.seed, steer=args.steer)
    return out


@contextlib.contextmanager
def user_errors():
    """A command's block with Optuna kept quiet. The search's typed errors derive from
    UserError (search/errors.py) and reach cli.main, which alone maps them to exit codes."""
    quiet_optuna()
    yield


def quiet_optuna() -> None:
    """Optuna's per-trial INFO lines and experimental-feature warnings would drown ours."""
    import warnings

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


EXIT_GRACE_S = 10.0  # after a driver's bounded stop, the most its process may take to exit


def exit_after(seconds: float, status: int, line: str) -> None:
    """Arm a last resort: when this process still runs `seconds` from now (an interpreter exit
    held by something nobody bounded), print `paxsearch: LINE` and end it with `status`."""
    import sys
    import threading
    import time

    def fire() -> None:
        time.sleep(seconds)
        try:
            print(f"paxsearch: {line}", file=sys.stderr, flush=True)
        finally:
            os._exit(status)

    threading.Thread(target=fire, daemon=True, name="exit-after").start()


def bounded(fn, seconds: float, *args) -> None:
    """fn(*args) in a daemon thread given `seconds`; whatever it raises or however long it
    blocks, the caller goes on by then."""
    import threading

    def call() -> None:
        try:
            fn(*args)
        except Exception:  # noqa: BLE001 - best effort only
            pass

    th = threading.Thread(target=call, daemon=True)
    th.start()
    th.join(timeout=seconds)


def run_driver(ctx, progress: bool, slots=None) -> int:
    from ..driver.loop import Driver
    from ..planning import method, plan_cache
    from ..study.storage import mask_url

    plan_cache.use(ctx.settings.plan_cache)  # read by the driver's screen and by its workers
    method.use_plan_compile(ctx.settings.plan_compile)  # read by the workers and the plan cache's key

    print(f"study {ctx.name}: {ctx.settings.tuner}, budget {ctx.settings.trials} trial(s), "
          f"objectives {', '.join(ctx.settings.objectives)}, target {ctx.target.text} "
          f"({compiler.describe(compiler.made_here())}); storage {mask_url(ctx.url)}; run folder {ctx.run_dir}",
          flush=True)
    other = None if ctx.created else other_libtpu_line(ctx)
    if other:
        print(f"paxsearch: {other}", file=sys.stderr, flush=True)
    try:
        with user_errors():
            summary = Driver(ctx, progress=progress, slots=slots).run()
    except ShutDown as e:  # Ctrl-C / SIGTERM: the driver stopped within its bound
        exit_after(EXIT_GRACE_S, e.status, f"{e.line}; the process did not exit within {EXIT_GRACE_S:.0f} s "
                                           "more and was ended")
        if ctx.created and e.maybe_empty:
            bounded(remove_if_empty, 3.0, ctx)
        raise
    except BaseException:
        if ctx.created:
            remove_if_empty(ctx)
        raise
    print(summarize(ctx.study, summary["elapsed_s"], ctx.run_dir))
    return 0


def other_libtpu_line(ctx, local_libtpu: str | None = None) -> str | None:
    """Once per session: the study's earlier plans came from another libtpu than this TPU
    machine's (`local_libtpu`, default the installed one; store/compiler.study_line); None
    elsewhere. The trials run where the target says: on TPUs when it is a TPU target with TPUs
    here (not plan-only)."""
    platform = "cpu" if ctx.target.plan_only else ctx.target.platform
    if platform != "tpu":
        return None
    plans = (plan_of(t.user_attrs) for t in ctx.study.get_trials(deepcopy=False)
             if not t.user_attrs.get("superseded"))
    local = local_libtpu if local_libtpu is not None else compiler.package_version("libtpu")
    return compiler.study_line(plans, local, platform)


def remove_if_empty(ctx) -> None:
    """A study this `run` created and that failed before any trial is not left behind: the
    study, its study.json and (when nothing else is in it) the run folder's study.db go; the
    worker logs stay, for the error line may point to them."""
    import optuna

    from ..study.storage import default_url

    try:
        if ctx.study.get_trials(deepcopy=False):
            return
        optuna.delete_study(study_name=ctx.name, storage=ctx.storage)
        paths = [os.path.join(ctx.run_dir, "study.json")]
        if ctx.url == default_url(ctx.run_dir) and not optuna.get_all_study_names(ctx.storage):
            ctx.storage.engine.dispose()
            db = os.path.join(ctx.run_dir, "study.db")
            paths += [db, db + ".lock"]
        for path in paths:
            if os.path.exists(path):
                os.remove(path)
    except Exception:  # the storage is what failed: the error the user sees says so
        pass


def summarize(study, elapsed_s: float, run_dir: str) -> str:
    counts = state_counts(study.get_trials(deepcopy=False))
    parts = ", ".join(f"{n} {k}" for k, n in counts.items())
    minutes, seconds = divmod(int(elapsed_s), 60)
    return (f"study {study.study_name}: {sum(counts.values())} trial(s) ({parts}); this session took "
            f"{minutes}m{seconds:02d}s; run folder {run_dir}; next: paxsearch report {run_dir}")


def state_counts(trials) -> dict[str, int]:
    """complete / failure kinds / pruned / skipped / running / waiting counts (superseded trials apart)."""
    c = collections.Counter()
    for t in trials:
        if t.user_attrs.get("superseded"):
            c["superseded"] += 1
        elif t.user_attrs.get("steered"):
            c["skipped"] += 1
        elif kind_of(t.user_attrs).failed:
            c[kind_of(t.user_attrs).value] += 1
        else:
            c[t.state.name.lower()] += 1
    order = ["complete", "pruned", "skipped", "running", "waiting"]
    return dict(sorted(c.items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order else 10, kv[0])))


def default_run_dir(name: str) -> str:
    return os.path.join("runs", name)

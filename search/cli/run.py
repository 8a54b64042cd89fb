"""`paxsearch run SPACE_FILE`: search a space file's configs (see search/study/space.py for the format)."""
from __future__ import annotations

import sys

from ..errors import UserError
from .common import add_study_options, cli_settings, default_run_dir, run_driver, user_errors


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="search the configs of a space file",
                       description="Propose, screen (compile ahead of time) and train trials of a space file; "
                                   "results go to an Optuna study in the run folder.")
    p.add_argument("space_file", help="a space file, e.g. spaces/mesh_sweep.py")
    p.add_argument("--run-dir", default=None, help="run folder (default: runs/<space name>)")
    p.add_argument("--storage", default=None, help="Optuna storage URL, or env:NAME for the URL in $NAME (default: sqlite:///RUN/study.db)")
    p.add_argument("--study", default=None, help="study name (default: the space file's name)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="NAME=VALUE",
                   help="fix a decision (mesh=2x2x2) or override a config field (steps=10); repeatable")
    p.add_argument("--dry-run", action="store_true",
                   help="print the space, its size and the static feasibility of every point; compile nothing")
    p.add_argument("--create-only", action="store_true",
                   help="create (or update) the study in --storage and stop, running no trial: the hosts of a "
                        "slice then run `paxsearch worker` on it")
    p.add_argument("--plan-cache", default=None, metavar="on|off|DIR",
                   help="plan-only targets: reuse plans compiled by any study (on, the default: "
                        "$PAXSEARCH_CACHE/plans), compile every plan (off), or keep the plans in DIR")
    p.add_argument("--plan-compile", default=None, choices=("passes", "full"),
                   help="plan-only TPU targets: stop the compiler after its HLO passes and buffer assignment "
                        "(passes, the default: seconds) or compile to the end (full: minutes, the figures of "
                        "a real run's compile)")
    add_study_options(p, for_new=True)
    p.set_defaults(func=main)


def main(args) -> int:
    from ..driver import dryrun
    from ..driver.context import check_settings, create_or_continue, with_cli
    from ..planning.method import PLAN_COMPILE_ENV, plan_method_notice
    from ..planning.targets import planning_notice
    from ..study.run_folder import check_writable
    from ..study.space import load_space
    from ..workers import gpu_assign
    from ..workers.pool import check_chip_workers

    with user_errors():
        space = load_space(args.space_file)
        settings = with_cli(space.settings, **cli_settings(args, for_new=True), plan_cache=args.plan_cache,
                            plan_compile=args.plan_compile)
        space.apply_sets(args.sets)
        target = check_settings(settings, space, compiles=not args.dry_run)  # a dry run needs no libtpu
        notice = planning_notice(target)  # a GPU node XLA cannot compile for here: planned analytically
        if notice:
            print(f"paxsearch: {notice}", file=sys.stderr, flush=True)
        slow = plan_method_notice(target, {PLAN_COMPILE_ENV: settings.plan_compile})  # this libtpu: full compiles
        if slow and not args.dry_run:
            print(f"paxsearch: {slow}", file=sys.stderr, flush=True)
        gpu_assign.for_target(target, settings.workers, settings.processes)  # enough GPUs, before anything is written
        check_chip_workers(target, settings.workers)  # one program holds a TPU chip
        if args.dry_run:
            dryrun.dry_run(space, settings, target, emit=lambda line: print(line, flush=True))
            return 0
        problem = dryrun.preflight(space, target, settings.processes)
        if problem:
            raise UserError(problem)
        run_dir = args.run_dir or default_run_dir(space.name)
        check_writable(run_dir)  # a file, under a file, read-only: one line before the first write
        ctx = create_or_continue(space, settings, run_dir, args.storage, args.study)
    if args.create_only:
        from ..study.storage import mask_url

        print(f"study {ctx.name} ready in {mask_url(ctx.url)} ({ctx.settings.trials} trial(s), target "
              f"{ctx.target.text}); run `paxsearch worker --storage URL --study {ctx.name}` on every host")
        return 0
    return run_driver(ctx, progress=not args.no_progress)

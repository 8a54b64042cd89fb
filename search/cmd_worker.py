"""`paxsearch worker --storage URL --study NAME`: one more driver for a shared study.

It runs the study's own space file (from its path; the copy kept in the study only with
--trust-stored-space) with the study's settings; any number of workers on any number of machines share the budget, and
the study lock keeps them from running a config twice.
"""
from __future__ import annotations

import os

from .cli_common import add_study_options, cli_settings, run_driver, user_errors


def add_parser(sub) -> None:
    p = sub.add_parser("worker", help="run trials of a shared study (e.g. on PostgreSQL)",
                       description="Pull trials from a stored study and run them, with the study's space and "
                                   "settings, until its budget is used up.")
    p.add_argument("--storage", required=True, help="Optuna storage URL, e.g. postgresql://user@host/db (password from PGPASSWORD), or env:NAME for the URL in $NAME")
    p.add_argument("--study", default=None, help="study name (needed when the storage holds several)")
    p.add_argument("--run-dir", default=None, help="local folder for trial logs (default: runs/<study>)")
    add_study_options(p, for_new=False)
    p.set_defaults(func=main)


def main(args) -> int:
    from .study_setup import reopen

    with user_errors():
        stub = reopen(args.storage, args.study, args.run_dir, cli_settings(args, for_new=False),
                      trust_stored_space=args.trust_stored_space)
        # distinct seeds, so that several workers do not propose the same points
        stub.seed = stub.settings.seed + os.getpid()
    return run_driver(stub, progress=not args.no_progress)

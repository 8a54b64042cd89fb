"""`paxsearch resume RUN`: continue the study of a run folder after its driver stopped.

Trials its dead driver left RUNNING are marked FAIL (crash, "driver died") and queued again;
completed ones are kept. (`paxsearch run SPACE --run-dir RUN` does the same.)
"""
from __future__ import annotations

import os

from ..errors import UserError
from .common import add_study_options, cli_settings, run_driver, user_errors


def add_parser(sub) -> None:
    p = sub.add_parser("resume", help="continue the study of a run folder",
                       description="Continue a stopped study: stale trials are failed and queued again.")
    p.add_argument("run_dir", help="run folder (with study.json)")
    p.add_argument("--storage", default=None, help="storage URL when the run folder's study is not its study.db "
                                                   "(needed when its URL holds a password)")
    add_study_options(p, for_new=False)
    p.set_defaults(func=main)


def main(args) -> int:
    from ..driver.context import reopen
    from ..study.storage import default_url, read_study_json

    meta = read_study_json(args.run_dir)
    if meta is None:
        if not os.path.isdir(args.run_dir):
            raise UserError(f"run folder {args.run_dir!r} does not exist")
        raise UserError(f"{args.run_dir} has no study.json; is it a paxsearch run folder?")
    url = args.storage or meta.get("storage") or default_url(args.run_dir)
    if "***" in url:
        raise UserError(f"{args.run_dir} uses storage {url}; pass --storage with the password")
    with user_errors():
        ctx = reopen(url, meta.get("study_name"), args.run_dir, cli_settings(args, for_new=False),
                     trust_stored_space=args.trust_stored_space)
    return run_driver(ctx, progress=not args.no_progress)

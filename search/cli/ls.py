"""`paxsearch ls [DIR]`: run folders (or the studies of a storage) with trial counts by state."""
from __future__ import annotations

import os
import sys

from ..errors import UserError
from .common import state_counts, user_errors


def add_parser(sub) -> None:
    p = sub.add_parser("ls", help="list run folders / studies with trial counts",
                       description="List the studies under a folder of run folders (default runs/), "
                                   "a single run folder, or a storage URL.")
    p.add_argument("path", nargs="?", default="runs", help="folder of run folders, or one run folder (default runs)")
    p.add_argument("--storage", default=None, help="list the studies of this storage URL (or env:NAME) instead")
    p.set_defaults(func=main)


def _run_folders(path: str) -> list[str]:
    def is_run(d):
        return os.path.exists(os.path.join(d, "study.json")) or os.path.exists(os.path.join(d, "study.db"))

    if is_run(path):
        return [path]
    if not os.path.isdir(path):
        raise UserError(f"{path!r} is not a folder")
    return [os.path.join(path, n) for n in sorted(os.listdir(path)) if is_run(os.path.join(path, n))]


def _line(where: str, study) -> str:
    trials = study.get_trials(deepcopy=False)
    counts = state_counts(trials)
    text = ", ".join(f"{n} {k}" for k, n in counts.items()) or "no trials"
    budget = (study.user_attrs.get("settings") or {}).get("trials")
    of_budget = f" / {budget}" if budget else ""
    return f"{where:32s} {study.study_name:20s} {len(trials):4d} trials{of_budget}  {text}"


def main(args) -> int:
    import optuna

    from ..study.storage import default_url, mask_url, open_storage, read_study_json, scrub

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with user_errors():
        if args.storage:
            storage = open_storage(args.storage, create=False)
            for s in optuna.get_all_study_summaries(storage, include_best_trial=False):
                print(_line(mask_url(args.storage), optuna.load_study(study_name=s.study_name, storage=storage)))
            return 0
        folders = _run_folders(args.path)
    if not folders:
        print(f"no run folders under {args.path}")
    unreadable = 0
    for folder in folders:  # one unreadable folder is reported and the listing goes on
        meta = read_study_json(folder) or {}
        url = meta.get("storage") or default_url(folder)
        if "***" in url:
            print(f"{folder:32s} {meta.get('study_name', '?'):20s} on {url} (pass --storage to count)")
            continue
        try:
            storage = open_storage(url, create=False)
            names = [meta["study_name"]] if meta.get("study_name") else [
                s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)]
            lines = [_line(folder, optuna.load_study(study_name=name, storage=storage)) for name in names]
        except Exception as e:  # a corrupt or unreachable database, a study that is gone
            unreadable += 1
            text = str(e).strip().splitlines()
            why = scrub(text[0] if text else type(e).__name__, url)[:300]
            print(f"paxsearch: error: run folder {folder}: cannot read its study on {mask_url(url)}: {why}",
                  file=sys.stderr, flush=True)
            continue
        print("\n".join(lines), flush=True)
    return 1 if unreadable else 0

"""`paxsearch report RUN` and `paxsearch best RUN`: Pareto reports and the chosen trial's config."""
from __future__ import annotations

import os

from ...store.paths import sanitized_folder_name
from ...store.urls import mask_url
from ..errors import UserError
from .common import default_run_dir


def add_parser(sub) -> None:
    p = sub.add_parser("report", help="write report.html, report.md, trials.csv/parquet and a TensorBoard log dir",
                       description="Pareto front of loss / MFU / memory over a study, written into the run folder "
                                   "(or --out). For a storage URL the output folder is --out, else "
                                   "runs/report-<--study>; never a folder the storage names. The files are "
                                   "written beside the output and moved into place: a failure leaves none.")
    p.add_argument("run", help="run folder, or a storage URL (or env:NAME) with --study")
    p.add_argument("--study", default=None, help="study name (with a storage URL)")
    p.add_argument("--out", default=None,
                   help="output folder (default: the run folder; for a storage URL runs/report-<study>, "
                        "the name from --study)")
    p.add_argument("--tolerance", type=float, default=0.0,
                   help="relative difference below which scores count as ties (e.g. 0.02)")
    p.add_argument("--no-tensorboard", action="store_true", help="skip the TensorBoard HParams export")
    p.set_defaults(func=report_main)

    b = sub.add_parser("best", help="print the best trial and export its config as Fiddle JSON",
                       description="Pick a trial (best on one objective, or the knee of the Pareto front).")
    b.add_argument("run", help="run folder, or a storage URL with --study")
    b.add_argument("--study", default=None, help="study name (with a storage URL)")
    b.add_argument("--objective", default="knee", choices=("mfu", "loss", "memory", "time_to_train", "knee"))
    b.add_argument("--export", default=None, metavar="FILE", help="write the trial's config (Fiddle JSON) here")
    b.set_defaults(func=best_main)


def _is_url(run: str) -> bool:
    return "://" in run or run.startswith("env:")


def _check_source(run: str) -> None:
    if not _is_url(run) and not any(os.path.exists(os.path.join(run, name)) for name in ("study.db", "study.json")):
        raise UserError(f"{run} is not a run folder (no study.db or study.json); pass the folder `paxsearch run` wrote")


def output_folder(args) -> str:
    """Where `report` writes: --out; else the run folder named; for a storage URL
    runs/report-<--study> (the name made one plain folder name). Never a path from storage."""
    if args.out:
        return args.out
    if not _is_url(args.run):
        return args.run
    if not args.study:
        raise UserError(f"report of a storage URL: pass --out DIR (or --study NAME to write into "
                        f"{default_run_dir('report-NAME')})")
    return default_run_dir(f"report-{sanitized_folder_name(args.study)}")


def report_main(args) -> int:
    from ...analysis.report import write_report
    from ...analysis.tensorboard import export_tensorboard

    _check_source(args.run)
    out = output_folder(args)
    try:
        paths = write_report(args.run, out_dir=out, study_name=args.study, rtol=args.tolerance)
        if not args.no_tensorboard:
            paths["tensorboard"] = export_tensorboard(args.run, os.path.join(out, "tensorboard"),
                                                      study_name=args.study)
    except (LookupError, OSError, ValueError) as e:
        raise UserError(str(e)) from None
    for key in ("html", "markdown", "csv", "parquet", "tensorboard"):
        if key in paths:
            print(f"{key:12s} {paths[key]}")
    return 0


def best_main(args) -> int:
    from ...analysis.best import choose

    _check_source(args.run)
    try:
        chosen = choose(args.run, args.objective, study_name=args.study)
    except (LookupError, FileNotFoundError, ValueError) as e:
        raise UserError(str(e)) from None
    what = "knee of the Pareto front" if args.objective == "knee" else f"best {args.objective}"
    print(f"trial {chosen.number} ({what})")
    print("  decisions: " + (" ".join(f"{k}={v}" for k, v in chosen.decisions.items()) or "none"))
    print("  scores:    " + ("  ".join(f"{k} {v}" for k, v in chosen.scores.items()) or "none"))
    if chosen.compiler:
        print(f"  compiler:  {chosen.compiler}")
    for note in chosen.notes:  # what dropping tokens or int8 cost in quality (analysis/quality.py)
        print(f"  note:      {note}")
    source = args.run
    if _is_url(args.run):  # the URL as given, its password masked (never printed)
        source = mask_url(args.run) + (f" --study {args.study}" if args.study else "")
    if args.export:
        tmp = args.export + ".tmp"
        with open(tmp, "w") as f:
            f.write(chosen.config)
        os.replace(tmp, args.export)
        print(f"config written to {args.export}; run it with: paxsearch train {args.export} --steps N")
    else:
        print(f"run it with: paxsearch train {source} --trial {chosen.number} --steps N")
    return 0

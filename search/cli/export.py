"""`paxsearch export RUN --trial N|best|knee|mfu|loss|memory --to maxtext|paxml`: a trial's config
in MaxText's or Paxml's terms (search/export/)."""
from __future__ import annotations

import os
import sys

from ..errors import UserError


def add_parser(sub) -> None:
    p = sub.add_parser("export", help="write a trial's config as a MaxText command (or YAML) or a Paxml class",
                       description="The chosen trial's config in another trainer's terms. Knobs without an "
                                   "equivalent that change the model's math are refused in one line; layout knobs "
                                   "without one are written as '# dropped ...' comment lines (and on stderr).")
    p.add_argument("run", help="run folder, or a storage URL with --study")
    p.add_argument("--study", default=None, help="study name (with a storage URL)")
    p.add_argument("--trial", default="best", help="trial number, or best | knee | mfu | loss | memory (default best)")
    p.add_argument("--to", required=True, choices=("maxtext", "maxtext-yaml", "paxml"),
                   help="maxtext: a shell script with the flag set's environment and the MaxText command; "
                        "maxtext-yaml: the same overrides as a YAML file after base.yml; paxml: an experiment class")
    p.add_argument("--target", default=None,
                   help="devices to export for, e.g. tpu:v5e-16 (default: the target the trial was planned or run on)")
    p.add_argument("--run-name", default=None, help="MaxText run_name (default paxsearch-<study>-trial<N>)")
    p.add_argument("--out", default=None, metavar="FILE", help="write here instead of stdout")
    p.set_defaults(func=main)


def trial_attrs(run: str, trial: str, study_name: str | None):
    """(study name, trial number, the trial's user_attrs, the study's target text, the line naming
    the compiler of its plan, None without a plan: analysis.best.compiler_line)."""
    from ...analysis.best import best_trial, compiler_line
    from ...analysis.load import open_study
    from ..study.trial_config import OBJECTIVE_WORDS

    try:
        study = open_study(run, study_name).study
        if trial in OBJECTIVE_WORDS:
            number = best_trial(study, "knee" if trial == "best" else trial)[0]
        else:
            try:
                number = int(trial)
            except ValueError:
                raise UserError(f"--trial {trial!r} is neither a trial number nor one of "
                                f"{', '.join(OBJECTIVE_WORDS)}") from None
    except (LookupError, FileNotFoundError, ValueError) as e:
        raise UserError(str(e)) from None
    trials = study.get_trials(deepcopy=False)
    found = [t for t in trials if t.number == number]
    if not found or not isinstance(found[0].user_attrs.get("config_dict"), dict):
        raise UserError(f"study {study.study_name!r} has no trial {number} with a stored config; see `paxsearch "
                        "report` for the trial numbers")
    return (study.study_name, number, found[0].user_attrs, study.user_attrs.get("target"),
            compiler_line(found[0], trials))


def export_text(to: str, cfg, target, *, run_name: str, header: str) -> str:
    from ..export import maxtext, paxml

    if to == "paxml":
        return paxml.snippet(cfg, target.platform, target.num_devices, header=header)
    if to == "maxtext-yaml":
        return maxtext.yaml_overrides(cfg, target.platform, target.num_devices, target.num_slices,
                                      run_name=run_name, header=header)
    topology = target.slice_name
    if target.platform == "tpu" and topology:
        from ..planning.topology import parse_slice

        tpu_slice = parse_slice(topology)
        topology, shape = tpu_slice.base_name, tpu_slice.chosen_topology
        if shape:  # tpu:v5p-1024@4x8x16: MaxText names only the slice
            header += (f"; the plan's slice topology is {shape}: create the slice with --topology={shape} "
                       f"(MaxText's compile_topology={topology} compiles for that slice's usual topology)")
    return maxtext.command(cfg, target.platform, target.num_devices, target.num_slices, run_name=run_name,
                           compile_topology=topology, header=header)


def main(args) -> int:
    from ...store.paths import sanitized_folder_name
    from ...trainer.config import from_dict
    from ..planning.targets import parse_target

    study, number, attrs, study_target, planned = trial_attrs(args.run, args.trial, args.study)
    target_text = args.target or attrs.get("plan_target") or study_target
    if not target_text:
        raise UserError(f"study {study!r} stores no target; pass --target (e.g. tpu:v5e-16)")
    cfg = from_dict(attrs["config_dict"])
    target = parse_target(target_text).for_config(cfg)
    run_name = args.run_name or sanitized_folder_name(f"paxsearch-{study}-trial{number}")
    text = export_text(args.to, cfg, target, run_name=run_name,
                       header=f"study {study}, trial {number}, target {target.name}"
                              + (f"; {planned}" if planned else ""))
    for line in text.splitlines():  # what was dropped or approximated, also where the user looks
        if line.startswith(("# dropped", "# approximated")):
            print(f"paxsearch: {line[2:]}", file=sys.stderr)
    if args.out:
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, args.out)
        print(f"trial {number} ({target.name}) written to {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0

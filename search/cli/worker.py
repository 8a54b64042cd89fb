"""`paxsearch worker --storage URL --study NAME`: one more driver for a shared study.

It runs the study's own space file (from its path; the copy kept in the study only with
--trust-stored-space) with the study's settings; any number of workers on any number of machines share the budget, and
the study lock keeps them from running a config twice.

On the hosts of one slice (or of a multi-node GPU job), the same command forms a slice
gang: one trial at a time run by all of them as one jax.distributed program, host 0
asking the tuner and writing the study (search/gang/slice_gang.py). Membership is detected
under SLURM, GKE/JobSet and on Cloud TPU VMs, or given with --coordinator, --num-hosts and
--host-index (search/gang/membership.py); --no-gang makes every host a worker of its own.
"""
from __future__ import annotations

import os

from ..errors import UserError
from .common import add_study_options, cli_settings, run_driver, user_errors


class GangSetupError(UserError, ValueError):
    """The study cannot run as a slice gang (one line for the user)."""


def add_parser(sub) -> None:
    p = sub.add_parser("worker", help="run trials of a shared study (e.g. on PostgreSQL)",
                       description="Pull trials from a stored study and run them, with the study's space and "
                                   "settings, until its budget is used up. On every host of a slice, the hosts "
                                   "run each trial together (a slice gang).")
    p.add_argument("--storage", required=True,
                   help="Optuna storage URL, e.g. postgresql://user@host/db (password from PGPASSWORD), "
                        "or env:NAME for the URL in $NAME")
    p.add_argument("--study", default=None, help="study name (needed when the storage holds several)")
    p.add_argument("--run-dir", default=None, help="local folder for trial logs (default: runs/<study>)")
    add_study_options(p, for_new=False)
    g = p.add_argument_group("slice gang (one trial across the hosts of a slice)")
    g.add_argument("--coordinator", default=None, metavar="HOST:PORT",
                   help="host 0's address for jax.distributed (default: detected under SLURM, GKE, Cloud TPU)")
    g.add_argument("--num-hosts", type=int, default=None, metavar="N", help="hosts in the gang")
    g.add_argument("--host-index", type=int, default=None, metavar="I",
                   help="this host's index, 0..N-1 (0 asks the tuner)")
    g.add_argument("--join-timeout", type=float, default=None, metavar="S",
                   help="seconds to wait for every host to join the gang (default 300)")
    g.add_argument("--no-gang", action="store_true", help="do not detect a gang: this host works on its own")
    p.set_defaults(func=main)


def main(args) -> int:
    from ..driver.context import reopen
    from ..gang.membership import resolve

    with user_errors():
        membership = resolve(args.coordinator, args.num_hosts, args.host_index, detect=not args.no_gang)
        stub = reopen(args.storage, args.study, args.run_dir, cli_settings(args, for_new=False),
                      trust_stored_space=args.trust_stored_space)
        # distinct seeds, so that several workers do not propose the same points
        stub.seed = stub.settings.seed + os.getpid()
        if membership is not None:
            _as_gang(stub, membership)
    if membership is None:
        return run_driver(stub, progress=not args.no_progress)
    from ..gang.slice_gang import JOIN_TIMEOUT_S, SliceSlot, follow

    join_timeout = args.join_timeout or JOIN_TIMEOUT_S
    print(f"paxsearch worker: {membership.describe()}", flush=True)
    if membership.leader:
        return run_driver(stub, progress=not args.no_progress,
                          slots=lambda i: SliceSlot(stub.target, membership, stub.run_dir, stub.settings.imports,
                                                    join_timeout))
    return follow(stub, membership, join_timeout)


def _as_gang(ctx, membership) -> None:
    """The study's settings for a gang of membership.num_hosts processes, or one line why not."""
    s, n = ctx.settings, membership.num_hosts
    if ctx.target.plan_only:
        raise GangSetupError(f"target {ctx.target.text} is planned (compiled on one machine), not run on a slice; "
                             "run `paxsearch worker --no-gang` (or without --num-hosts)")
    if s.workers != 1:
        raise GangSetupError(f"a slice gang runs one trial at a time on all {n} hosts; drop --workers {s.workers}")
    if s.processes not in (1, n):
        raise GangSetupError(f"the study runs each trial on {s.processes} local processes and this gang has {n} "
                             "hosts; a gang runs one process per host")
    if ctx.target.num_devices % n:
        raise GangSetupError(f"target {ctx.target.text} has {ctx.target.num_devices} devices, which do not split "
                             f"over {n} hosts")
    ctx.settings = s.replace(processes=n)

"""Errors of the search layer that reach the user."""


class UserError(Exception):
    """Bad input: printed as one line `paxsearch: error: ...` with exit status 2.

    The base of every error of the search layer that is the user's to fix: SpaceError,
    SettingsError, SetupError, StorageError (study/), TunerError (tuning/), DriverError
    (driver/), GpuAssignError (workers/), TargetError (planning/), GangSetupError,
    MembershipError (gang/, cli/), ConfigFileError, ImportFailed (study/). cli.main alone maps
    them, store.StorageUrlError, and the trainer's ConfigError and DataError, to exit status 2
    (a diverged `train` to 3)."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, as SLURM, Kubernetes and preemptible VMs send it before a kill: handled as Ctrl-C
    (running trials are marked interrupted and queued again), then exit status 143."""


class ShutDown(KeyboardInterrupt):
    """A driver's bounded stop after Ctrl-C or SIGTERM (search/driver/shutdown.py): `line` says what
    was queued again and what was left RUNNING for `resume`; `status` is the exit status (130
    for Ctrl-C, 143 for SIGTERM); `maybe_empty` is False when the driver created a trial (so
    the study it may have created is not empty)."""

    def __init__(self, line: str, status: int, maybe_empty: bool = True):
        super().__init__(line)
        self.line, self.status, self.maybe_empty = line, status, maybe_empty

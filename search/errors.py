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

"""The study loop shared by `run`, `worker` and `resume`: the study a driver runs (created or
reopened, its settings checked: context.py), the dry run, and the loop itself: propose under the
study lock, run each trial on a worker gang, record its outcome, recover trials a dead driver
left running (loop.py)."""
from .context import SetupError, StudyContext, create_or_continue, reopen
from .loop import Driver, DriverError, recover_stale, study_finished

__all__ = ["Driver", "DriverError", "SetupError", "StudyContext", "create_or_continue", "recover_stale", "reopen",
           "study_finished"]

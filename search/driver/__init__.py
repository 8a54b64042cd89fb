"""The study loop shared by `run`, `worker` and `resume`: the study a driver runs (created or
reopened, its settings checked: context.py), the dry run (dryrun.py), and the loop itself: propose
under the study lock, run each trial on a worker gang, record its outcome (loop.py), a trial's
config and static checks before any worker (prepare.py), the budget left (budget.py), taking over
trials a dead driver left running (takeover.py), and the bounded stop on Ctrl-C or SIGTERM
(shutdown.py)."""
from .budget import study_finished
from .context import SetupError, StudyContext, create_or_continue, reopen
from .loop import Driver, DriverError
from .takeover import recover_stale

__all__ = ["Driver", "DriverError", "SetupError", "StudyContext", "create_or_continue", "recover_stale", "reopen",
           "study_finished"]

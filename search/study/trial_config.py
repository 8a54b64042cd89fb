"""The stored config of one trial of a study (for `paxsearch train RUN --trial N|best|knee`)."""
from __future__ import annotations

from .configio import ConfigFileError

OBJECTIVE_WORDS = ("best", "knee", "mfu", "loss", "memory", "time_to_train")


def trial_config_json(source: str, trial: str) -> tuple[int, str]:
    """(trial number, Fiddle JSON) for a trial number or an objective word ('best' = knee)."""
    from ...analysis.best import best_trial
    from ...analysis.load import open_study

    try:
        if trial in OBJECTIVE_WORDS:
            return best_trial(source, "knee" if trial == "best" else trial)
        number = int(trial)
    except ValueError:
        raise ConfigFileError(f"--trial {trial!r} is neither a trial number nor one of "
                              f"{', '.join(OBJECTIVE_WORDS)}") from None
    except (LookupError, FileNotFoundError) as e:
        raise ConfigFileError(str(e)) from None
    try:
        study = open_study(source).study
    except (LookupError, FileNotFoundError, ValueError) as e:
        raise ConfigFileError(str(e)) from None
    found = [t for t in study.get_trials(deepcopy=False) if t.number == number]
    if not found or "config" not in found[0].user_attrs:
        raise ConfigFileError(f"study {study.study_name!r} has no trial {number} with a stored config; "
                              "see `paxsearch report` for the trial numbers")
    return number, found[0].user_attrs["config"]

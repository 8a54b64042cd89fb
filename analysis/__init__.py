"""paxsearch.analysis: read a stored study and its run folder; report, export, pick a trial.

Never imports the trainer (nor JAX): everything comes from the Optuna study and RUN/trials/.
"""
from .best import best_trial
from .load import load_trials, mask_url, open_study, study_info
from .pareto import best_per_objective, knee, pareto_front, pareto_mask
from .report import write_report
from .tensorboard import export_tensorboard

__all__ = ["best_per_objective", "best_trial", "export_tensorboard", "knee", "load_trials",
           "mask_url", "open_study", "pareto_front", "pareto_mask", "study_info",
           "write_report"]

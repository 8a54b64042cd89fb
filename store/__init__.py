"""What a study stores, as every part of paxsearch reads it: the trial outcome record, its plan
and storage URLs. search writes through it, analysis reads through it; it imports neither."""
from .outcome import FAILURE_KINDS, MEASURED_KEYS, Counters, Kind, Measured, TrialOutcome, kind_of
from .plan import Plan
from .urls import StorageUrlError, driver_url, mask_url, scrub

__all__ = ["FAILURE_KINDS", "MEASURED_KEYS", "Counters", "Kind", "Measured", "Plan", "StorageUrlError", "TrialOutcome",
           "driver_url", "kind_of", "mask_url", "scrub"]

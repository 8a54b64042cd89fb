"""Typed trainer failures. Callers decide a trial's fate from the type, never from text."""


class TrainerError(Exception):
    """Base class of the trainer's own errors."""


class ConfigError(TrainerError, ValueError):
    """The config cannot run on these devices (mesh size, divisibility, unknown names).

    The message is one line that names the problem, the numbers and the fix.
    """


class UnsupportedOnPlatform(ConfigError):
    """The config asks for something this platform lacks (e.g. host offload on CPU)."""


class DataError(TrainerError):
    """The requested dataset cannot be loaded (never silently replaced)."""


class NonFiniteLoss(TrainerError, FloatingPointError):
    """Training diverged: loss is NaN/inf or far above its start."""

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step

"""Environment that must be set before JAX is imported (device count, platform, quiet logs)."""
from __future__ import annotations

import logging
import os

VERBOSE_ENV = "PAXSEARCH_VERBOSE"  # "1": third-party log lines shown (trainer/quiet.py reads it too)
# Python loggers of libraries that print lines a user cannot act on (absl: seqio's "uncached
# FunctionDataset" warning, Orbax's INFO lines; TensorFlow; JAX's backend probing). Quiet below
# ERROR unless --verbose; errors still show.
QUIET_LOGGERS = ("absl", "tensorflow", "orbax", "etils", "jax._src.xla_bridge")


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0")


def configure_logs(show: bool = False) -> None:
    """Third-party logs quiet by default, shown with `show` (the CLI's --verbose) or
    PAXSEARCH_VERBOSE=1. The choice goes into the environment, so the processes this one starts
    (trial workers) and TensorFlow's native logging (TF_CPP_MIN_LOG_LEVEL) follow it."""
    if show:
        os.environ[VERBOSE_ENV] = "1"
    if verbose():
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0")
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)


def configure_jax_env(cpu_devices: int | None = None, platform: str | None = None) -> None:
    """Set XLA_FLAGS / JAX_PLATFORMS for this process. Call before importing jax."""
    if cpu_devices:
        from ...trainer.flagsets import with_device_count

        os.environ["XLA_FLAGS"] = with_device_count(os.environ.get("XLA_FLAGS"), cpu_devices)
    if platform:
        os.environ["JAX_PLATFORMS"] = platform
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    # Installed libtpu without TPUs: stay on CPU quietly unless a platform was chosen.
    os.environ.setdefault("JAX_PLATFORMS", "cpu" if not _has_accelerator() else "")
    if not os.environ["JAX_PLATFORMS"]:
        del os.environ["JAX_PLATFORMS"]


def _has_accelerator() -> bool:
    return os.path.exists("/dev/nvidia0") or os.path.exists("/dev/accel0") or os.path.exists("/dev/vfio")

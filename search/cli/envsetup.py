"""Environment that must be set before JAX is imported (device count, platform, quiet logs)."""
from __future__ import annotations

import os


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

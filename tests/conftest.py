"""Test session setup: 8 simulated CPU devices, set before anything imports JAX."""
import os

os.environ["JAX_PLATFORMS"] = "cpu"
_flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "xla_force_host_platform_device_count" not in f]
os.environ["XLA_FLAGS"] = " ".join(_flags + ["--xla_force_host_platform_device_count=8"])
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

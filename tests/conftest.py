"""Test session setup: 8 simulated CPU devices, set before anything imports JAX."""
import os

os.environ["JAX_PLATFORMS"] = "cpu"
from paxsearch.trainer.flagsets import with_device_count  # noqa: E402  (imports no JAX)

os.environ["XLA_FLAGS"] = with_device_count(os.environ.get("XLA_FLAGS"), 8)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

"""JAX's persistent compilation cache: compiles that must not be written to it.

    with no_persistent_cache_writes():
        lowered.compile(...)

Importing this module loads nothing (JAX is imported when the block is entered).
"""
from __future__ import annotations

import contextlib


@contextlib.contextmanager
def no_persistent_cache_writes():
    """Nothing compiled meanwhile is written to JAX's persistent compilation cache (no compile
    takes forever). What compile-only devices compile cannot be loaded back from it without a
    client: each later read of such an entry would only warn and compile again."""
    import jax

    setting = "jax_persistent_cache_min_compile_time_secs"
    before = getattr(jax.config, setting)  # (jax's Config types no attribute per setting)
    jax.config.update(setting, float("inf"))
    try:
        yield
    finally:
        jax.config.update(setting, before)

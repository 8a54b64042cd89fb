"""Silence what native libraries print straight to file descriptor 2 while they load.

TensorFlow 2.21 (imported by seqio) writes absl start-up lines ("All log messages before
absl::InitializeLog() ...", "Could not find cuda drivers ...") on every import, whatever
TF_CPP_MIN_LOG_LEVEL says; they would break every one-line error of the CLI. PAXSEARCH_VERBOSE=1
keeps them."""
from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def native_stderr_silenced() -> Iterator[None]:
    """fd 2 points at /dev/null inside the block (Python's own exceptions still propagate)."""
    if os.environ.get("PAXSEARCH_VERBOSE", "") not in ("", "0"):
        yield
        return
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # no real stderr (captured): nothing to silence
        yield
        return
    sys.stderr.flush()
    saved = os.dup(fd)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
        yield
    finally:
        os.dup2(saved, fd)
        os.close(saved)
        os.close(devnull)

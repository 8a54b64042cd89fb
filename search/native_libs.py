"""How paxsearch's own processes (the CLI, trial workers) load native libraries."""
from __future__ import annotations

import os
import sys


def bind_symbols_lazily() -> None:
    """Native libraries loaded from now on bind each symbol when it is first called, not all at
    load (RTLD_LAZY, what the dynamic linker does for programs, instead of Python's RTLD_NOW for
    extension modules). A trial worker loads jaxlib and then TensorFlow (seqio's, over 1 GB of
    C++): with jaxlib loaded RTLD_NOW, TensorFlow's import costs ~8 CPU-s, lazily ~4.5
    (benchmarks/RESULTS.md, "Worker start-up"). Call it before JAX is imported; a library
    missing a symbol then fails where it calls it instead of at import."""
    if hasattr(sys, "getdlopenflags"):  # a POSIX dlopen
        sys.setdlopenflags((sys.getdlopenflags() & ~os.RTLD_NOW) | os.RTLD_LAZY)

"""search/native_libs.py: paxsearch's processes bind native symbols lazily, keeping the rest of
Python's dlopen flags."""
import os
import sys

import pytest

from paxsearch.search.native_libs import bind_symbols_lazily


@pytest.mark.skipif(not hasattr(sys, "getdlopenflags"), reason="no POSIX dlopen on this platform")
def test_lazy_binding_replaces_rtld_now_and_keeps_the_other_flags():
    saved = sys.getdlopenflags()
    try:
        sys.setdlopenflags(os.RTLD_NOW | os.RTLD_GLOBAL)
        bind_symbols_lazily()
        assert sys.getdlopenflags() == os.RTLD_LAZY | os.RTLD_GLOBAL
    finally:
        sys.setdlopenflags(saved)

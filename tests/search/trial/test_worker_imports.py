"""A trial worker imports seqio and TensorFlow (~6 CPU-s) only when it trains: a plan-only
worker (a TPU or GPU plan on this CPU) loads the trainer and the compiler, not the data stack."""
import subprocess
import sys

import pytest

from ...search_util import REPO


@pytest.mark.slow  # quick-loop budget (issue 18): two worker processes; CI runs it
def test_a_worker_imports_tensorflow_only_when_it_builds_data():
    code = ("import sys; import paxsearch.search.trial.execute; "
            "print(sorted(m for m in ('seqio', 'tensorflow') if m in sys.modules)); "
            "from paxsearch.trainer import train; train._data(); "
            "print(sorted(m for m in ('seqio', 'tensorflow') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-2:] == ["[]", "['seqio', 'tensorflow']"]

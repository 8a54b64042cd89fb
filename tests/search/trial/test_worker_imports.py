"""A trial worker imports seqio and TensorFlow (~7 CPU-s) only when it reads a seqio source (a
user's task, text files): a plan-only worker (a TPU or GPU plan on this CPU) loads the trainer and
the compiler, not the data stack, and one that trains on the synthetic corpus (NumPy,
trainer/synthetic_data.py) and writes TensorBoard scalars does not either."""
import subprocess
import sys

import pytest

from ...search_util import REPO


@pytest.mark.slow  # quick-loop budget (issue 18): a worker process importing TensorFlow; CI runs it
def test_a_worker_imports_tensorflow_only_when_it_reads_a_seqio_source():
    mods = "print(sorted(m for m in ('seqio', 'tensorflow') if m in sys.modules)); "
    code = ("import sys, tempfile; import paxsearch.search.trial.execute; " + mods +
            "from paxsearch.trainer import train, tb; from paxsearch.trainer.config import DataConfig; "
            "data = train._data(); next(data.train_batches(DataConfig(), 128, 8, 0, 1)); "
            "data.eval_batches(DataConfig(), 128, 8, 0, 1); data.data_vocab_size(DataConfig()); "
            "w = tb.ScalarWriter(tempfile.mkdtemp()); w.scalars(1, {'loss': 1.0}); w.close(); " + mods +
            "data.data_vocab_size(DataConfig(text_files=('README.md',))); " + mods)
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-3:] == ["[]", "[]", "['seqio', 'tensorflow']"]


def test_a_worker_imports_neither_the_space_system_nor_the_storage_nor_orbax():
    """A trial worker reads a config file (Fiddle) and the steering rule, never a space file, the
    study's storage or a checkpoint: importing its module must not import PyGlove, Optuna or Orbax
    (~0.6 CPU-s at each worker's start). The rooms' names stay importable and load on first use."""
    heavy = ("pyglove", "optuna", "orbax.checkpoint")
    code = ("import sys; import paxsearch.search.trial.execute; "
            f"print(sorted(m for m in {heavy!r} if m in sys.modules)); "
            "from paxsearch.search.study import load_space, StudyLock; "
            "from paxsearch.search.tuning import make_sampler; "
            f"print(sorted(m for m in {heavy!r} if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-2:] == ["[]", "['optuna', 'pyglove']"]
    from paxsearch.search import study
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        study.nothing  # noqa: B018

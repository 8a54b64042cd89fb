"""A restore that fails leaves Orbax's other reads of that checkpoint running; when asyncio later
collects them it logs "Task/Future exception was never retrieved". The failed restore has already
said what went wrong in one line, so those records are dropped, and only those: the filter knows
the folders whose restore failed (trainer/checkpoint.py). Seen on a slow machine, where a Future's
record came after the restore's stderr hold had ended and printed a traceback under the one line."""
import logging
import os

import jax.numpy as jnp
import numpy as np

from paxsearch.trainer import checkpoint
from paxsearch.trainer.config import CheckpointConfig


def _record(message: str) -> logging.LogRecord:
    return logging.LogRecord("asyncio", logging.ERROR, __file__, 1, message, None, None)


def _future(path: str) -> str:
    return ("Future exception was never retrieved\nfuture: <Future finished exception=ValueError('OUT_OF_RANGE: "
            f'Error opening "zarr" driver: Error reading "w/.zarray" in OCDBT database at local file '
            f'"{path}/1/default/"\')>')


def test_only_reads_of_a_checkpoint_whose_restore_failed_are_dropped(tmp_path):
    run = tmp_path / "run"
    ckpt = checkpoint.Checkpointer(CheckpointConfig(enabled=True, async_save=False), str(run))
    state = {"w": jnp.arange(4096, dtype=jnp.float32)}
    ckpt.maybe_save(1, state, force=True)
    ckpt.close()
    for path in (run / "checkpoints" / "1").rglob("*"):
        if path.is_file() and path.parent.name == "d":  # the array data of an OCDBT checkpoint
            path.write_bytes(os.urandom(64))
    folder = str(run / "checkpoints")
    other = str(tmp_path / "elsewhere")
    keep = checkpoint._AbandonedReadErrors()
    assert keep.filter(_record(_future(folder)))  # no restore has failed: nothing is dropped

    ckpt = checkpoint.Checkpointer(CheckpointConfig(enabled=True), str(run))
    try:
        ckpt.restore_latest({"w": np.zeros(4096, np.float32)})
    except checkpoint.CheckpointError as e:
        assert "can be read" in str(e)
    else:
        raise AssertionError("a garbled checkpoint restored")
    drop = checkpoint._ABANDONED_READ_ERRORS
    assert any(d.startswith(folder) for d in drop.directories)
    assert not drop.filter(_record(_future(folder)))  # the abandoned read of the failed restore
    assert not drop.filter(_record("Task exception was never retrieved\n... in async_deserialize ..."))
    assert drop.filter(_record(_future(other)))  # another folder's read: not ours to hide
    assert drop.filter(_record("Future exception was never retrieved\nfuture: <Future exception=KeyError('x')>"))
    assert drop.filter(_record(f"some other asyncio error about {folder}"))

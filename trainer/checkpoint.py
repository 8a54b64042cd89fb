"""Orbax checkpoints of the train state: save every N steps and at the end, keep K, resume.

A save blocks the training loop only for what must block: the previous save's write, when it is
still running (Orbax keeps one save in flight), and the copy of the state to host memory, which
has to finish before the next step is given (donated) the state's buffers. Serializing and
writing the files run in Orbax's background thread while training goes on. The seconds blocked
are counted here (CheckpointSeconds), and the loop keeps them out of step time."""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
import threading
import time

import orbax.checkpoint as ocp

from .config import CheckpointConfig
from .errors import DataError
from .results import CheckpointSeconds


class CheckpointError(DataError):
    """No checkpoint of the run folder can be restored (one line naming the folder and the fix)."""


def checkpoint_dir(ckpt: CheckpointConfig, run_dir: str | None) -> str | None:
    if ckpt.directory:
        return os.path.abspath(ckpt.directory)
    return os.path.abspath(os.path.join(run_dir, "checkpoints")) if run_dir else None


class _AbandonedReadErrors(logging.Filter):
    """Drops asyncio's "Task exception was never retrieved" / "Future exception was never
    retrieved" for Orbax's reads of a restore that failed: when such a task or future is
    collected (at any time, up to interpreter exit, later on a slow machine than the stderr hold
    below waits), asyncio logs its exception, which the failed restore has already reported as one
    line. A read is Orbax's when the task ran `async_deserialize` or its error names a file under
    a checkpoint folder whose restore failed (`directories`); any other such record passes."""

    def __init__(self):
        super().__init__()
        self.directories: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if "exception was never retrieved" not in text:
            return True
        return not ("async_deserialize" in text or any(d in text for d in self.directories))


_ABANDONED_READ_ERRORS = _AbandonedReadErrors()


@contextlib.contextmanager
def _without_abandoned_reads(settle_s: float = 0.5, wait_s: float = 10.0):
    """Hold this process's stderr (file descriptor 2) while a restore is tried. When it fails
    (the caller sets the yielded event), the other reads Orbax had started go on finishing for a
    while, and each prints an 'Event loop is closed' traceback from TensorStore's own threads
    (Orbax closes the restore's event loop without waiting for them), several at once and
    interleaved even inside a line. Then wait until stderr has been quiet for `settle_s` (at most
    `wait_s`) and drop what the failed attempt printed: its exception, which the caller reports,
    says what went wrong. A restore that succeeds passes on everything it printed."""
    failed = threading.Event()
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield failed
        finally:
            if failed.is_set():
                size, start = -1, time.monotonic()
                quiet_since = start
                while time.monotonic() - start < wait_s and time.monotonic() - quiet_since < settle_s:
                    time.sleep(0.05)
                    now = os.fstat(held.fileno()).st_size
                    if now != size:
                        size, quiet_since = now, time.monotonic()
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            if not failed.is_set():
                held.seek(0)
                os.write(2, held.read())


class Checkpointer:
    def __init__(self, ckpt: CheckpointConfig, run_dir: str | None):
        directory = checkpoint_dir(ckpt, run_dir)
        if directory is None:
            raise ValueError("checkpointing needs a run_dir or checkpoint.directory")
        self.every = ckpt.every_steps
        options = ocp.CheckpointManagerOptions(
            max_to_keep=ckpt.keep, create=True, enable_async_checkpointing=ckpt.async_save)
        self.manager = ocp.CheckpointManager(directory, options=options)
        self.last_blocking_s = 0.0  # the latest maybe_save's seconds blocked (0 when it did not save)
        self.last_waiting_s = 0.0  # of which waiting for the previous save's write
        self._saves, self._blocking_s, self._waiting_s, self._final_wait_s = 0, 0.0, 0.0, 0.0

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def restore_latest(self, abstract_state) -> tuple:
        """(state, step) of the newest checkpoint that restores. A step that does not (files
        truncated or garbled, a save cut short) is moved aside as `<step>.unreadable` (so a
        later save of that step is not skipped) and the next older one is tried; the fallback
        is said on stderr. CheckpointError (one line) when none restores."""
        bad: list[tuple[int, str]] = []
        for step in sorted(self.manager.all_steps(), reverse=True):
            try:
                with _without_abandoned_reads() as failed:
                    try:
                        state = self.restore(abstract_state, step)
                    except BaseException:
                        failed.set()
                        _ABANDONED_READ_ERRORS.directories.add(os.path.join(str(self.manager.directory), ""))
                        logging.getLogger("asyncio").addFilter(_ABANDONED_READ_ERRORS)  # once: a set
                        raise
            except Exception as e:  # noqa: BLE001 - Orbax/TensorStore raise many types for a bad file
                bad.append((step, f"{type(e).__name__}: {' '.join(str(e).split())[:160]}"))
                continue
            if bad:
                self._set_aside([b for b, _ in bad])
                print(f"checkpoint step(s) {', '.join(str(b) for b, _ in bad)} could not be read ({bad[0][1]}); "
                      f"moved aside as <step>.unreadable; resuming from step {step}", file=sys.stderr, flush=True)
            return state, step
        if not bad:
            raise CheckpointError(f"no checkpoint in {self.manager.directory}; start without resuming")
        raise CheckpointError(f"no checkpoint in {self.manager.directory} can be read (step(s) "
                              f"{', '.join(str(b) for b, _ in bad)}; newest: {bad[0][1]}); start a new run folder")

    def _set_aside(self, steps: list[int]) -> None:
        directory = str(self.manager.directory)
        for step in steps:
            path = os.path.join(directory, str(step))
            if os.path.isdir(path):
                os.replace(path, f"{path}.unreadable")
        self.manager.reload()

    def restore(self, abstract_state, step: int | None = None):
        """The state at `step` (default: latest), placed with abstract_state's shardings."""
        step = self.manager.latest_step() if step is None else step
        return self.manager.restore(step, args=ocp.args.StandardRestore(abstract_state))

    def due(self, step: int) -> bool:
        """A periodic save falls at `step`."""
        return bool(self.every) and step % self.every == 0

    def maybe_save(self, step: int, state, force: bool = False) -> bool:
        """Save `state` as `step` when one is due (or `force`) and that step is not saved yet.
        Returns once the state is in host memory; the write goes on in the background (with
        async_save). The caller should have waited for the state itself (jax.block_until_ready):
        otherwise the copy also waits for the step that computes it, and that is step time."""
        self.last_blocking_s = self.last_waiting_s = 0.0
        if not force and not self.due(step):
            return False
        if step in self.manager.all_steps():  # Orbax's cached list: no file system read
            return False
        start = time.perf_counter()
        self.manager.wait_until_finished()  # the previous save's write (save() would wait for it too)
        waited = time.perf_counter()
        saved = self.manager.save(step, args=ocp.args.StandardSave(state), force=True)
        self.last_blocking_s, self.last_waiting_s = time.perf_counter() - start, waited - start
        self._saves += int(bool(saved))
        self._blocking_s += self.last_blocking_s
        self._waiting_s += self.last_waiting_s
        return saved

    def seconds(self) -> CheckpointSeconds:
        """The saves so far and the seconds they blocked the loop (final_wait_s: after close)."""
        return CheckpointSeconds(saves=self._saves, blocking_s=self._blocking_s,
                                 waiting_for_previous_s=self._waiting_s, final_wait_s=self._final_wait_s)

    def close(self) -> None:
        """Wait for the last save's write (its seconds: seconds().final_wait_s), then close."""
        start = time.perf_counter()
        self.manager.wait_until_finished()
        self._final_wait_s += time.perf_counter() - start
        self.manager.close()

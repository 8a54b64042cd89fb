"""TensorBoard scalar events, written without TensorFlow (tensorboard's own record writer).

tensorboard's EventFileWriter opens its file through `tensorboard.compat.tf`, which imports
TensorFlow whenever it is installed (~6 CPU-s a process): the file is written here with its
RecordWriter over a plain file instead, in the same format (a file_version event first)."""
from __future__ import annotations

import itertools
import os
import socket

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.record_writer import RecordWriter

_FILES = itertools.count()  # a writer's file name stays unique within the process


class _EventFile:
    def __init__(self, logdir: str):
        name = (f"events.out.tfevents.{int(_now()):010d}.{socket.gethostname()}.{os.getpid()}."
                f"{next(_FILES)}")
        self._file = open(os.path.join(logdir, name), "wb")
        self._records = RecordWriter(self._file)
        self.add_event(event_pb2.Event(wall_time=_now(), file_version="brain.Event:2"))

    def add_event(self, event: event_pb2.Event) -> None:
        self._records.write(event.SerializeToString())

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class ScalarWriter:
    """Writes scalars as simple_value summaries; a no-op when logdir is None."""

    def __init__(self, logdir: str | None):
        self._writer = None
        if logdir:
            os.makedirs(logdir, exist_ok=True)
            self._writer = _EventFile(logdir)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        if self._writer is None:
            return
        summary = summary_pb2.Summary(value=[
            summary_pb2.Summary.Value(tag=tag, simple_value=float(v)) for tag, v in values.items() if v is not None])
        self._writer.add_event(event_pb2.Event(step=int(step), summary=summary, wall_time=_now()))

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def _now() -> float:
    import time

    return time.time()

"""TensorBoard scalar events, written without TensorFlow (tensorboard's own event writer)."""
from __future__ import annotations

import os

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter


class ScalarWriter:
    """Writes scalars as simple_value summaries; a no-op when logdir is None."""

    def __init__(self, logdir: str | None):
        self._writer = None
        if logdir:
            os.makedirs(logdir, exist_ok=True)
            self._writer = EventFileWriter(logdir)

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

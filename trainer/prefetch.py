"""Input off the critical path: a background thread prepares the next batches and places
them on the devices while the current step runs.

`Prefetcher(source, place, depth)` yields `place(next(source))` in source order. With
depth > 0 a daemon thread keeps up to `depth` placed batches ready; an error raised by the
source or by `place` in that thread is raised again, as the same exception object, by the
`next()` that would have returned the failing batch (never a hang). depth 0 reads and
places each batch in the caller's thread, as a plain loop would.
"""
from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

_POLL_S = 0.1  # how often a blocked producer checks whether it was closed


class _Failure:
    def __init__(self, error: BaseException):
        self.error = error


_END = object()


class Prefetcher:
    def __init__(self, source: Iterator, place: Callable[[Any], Any], depth: int = 2):
        if depth < 0:
            raise ValueError(f"prefetch depth must be >= 0, got {depth}")
        self._source, self._place, self._depth = source, place, depth
        self._closed = threading.Event()
        self._done = False
        self._thread = None
        if depth:
            self._queue: queue.Queue = queue.Queue(maxsize=depth)
            self._thread = threading.Thread(target=self._produce, name="paxsearch-prefetch", daemon=True)
            self._thread.start()

    def __iter__(self) -> "Prefetcher":
        return self

    def __next__(self):
        if self._done:
            raise StopIteration
        if not self._depth:
            return self._place(next(self._source))
        item = self._queue.get()
        if item is _END:
            self._done = True
            raise StopIteration
        if isinstance(item, _Failure):
            self._done = True
            raise item.error
        return item

    def _produce(self) -> None:
        try:
            for raw in self._source:
                if self._closed.is_set() or not self._offer(self._place(raw)):
                    return
        except BaseException as e:  # handed to the consumer, raised there
            self._offer(_Failure(e))
            return
        self._offer(_END)

    def _offer(self, item) -> bool:
        """Queues `item`, waiting for room; False when the prefetcher was closed meanwhile."""
        while not self._closed.is_set():
            try:
                self._queue.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def close(self, timeout: float = 5.0) -> None:
        """Stops the thread (it may still finish the batch it is reading) and drops what it
        had ready."""
        self._closed.set()
        self._done = True
        if self._thread is None:
            return
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._thread.join(timeout)

    def __enter__(self) -> "Prefetcher":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

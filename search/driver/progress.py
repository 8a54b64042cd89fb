"""The progress bar over trials (n of N, best so far per objective, ETA) and trial lines."""
from __future__ import annotations

import math
import sys
import threading

from tqdm import tqdm

from ...store.units import format_bytes, format_duration
from ..study.settings import OBJECTIVES


def _fmt(name: str, v: float) -> str:
    if name == "mfu":
        return f"{100 * v:.2f}%"
    if name == "memory":
        return format_bytes(v)
    if name == "time_to_train":
        return format_duration(v)
    return f"{v:.3f}"


class Progress:
    def __init__(self, total: int, done: int, objectives, enabled: bool = True, stream=None,
                 predicted: bool = False):
        self.objectives = list(objectives)
        self.label = "best predicted " if predicted else "best "
        self.best: dict[str, float] = {}
        self._lock = threading.Lock()
        self.stream = stream or sys.stderr
        self.bar = tqdm(total=total, initial=min(done, total), desc="trials", unit="trial",
                        dynamic_ncols=True, file=self.stream, disable=not enabled)

    def seed_best(self, values_list) -> None:
        for values in values_list:
            self._update_best(values)
        self._postfix()

    def _update_best(self, values) -> None:
        if not values:
            return
        for name, v in zip(self.objectives, values, strict=True):  # values are in objective order
            if v is None or not math.isfinite(v):
                continue
            better = max if OBJECTIVES[name] == "maximize" else min
            self.best[name] = better(self.best.get(name, v), v)

    def _postfix(self) -> None:
        if self.best:
            self.bar.set_postfix_str(self.label + "  ".join(f"{k} {_fmt(k, v)}" for k, v in self.best.items()))

    def finished(self, line: str, values=None, feasible: bool = True, counts: bool = True) -> None:
        """`counts`: the trial uses one of the budget (a steered skip does not)."""
        with self._lock:
            if feasible:
                self._update_best(values)
            self.bar.write(line, file=sys.stdout)
            self.bar.update(1 if counts else 0)
            self._postfix()

    def note(self, line: str) -> None:
        with self._lock:
            self.bar.write(line, file=sys.stdout)

    def close(self) -> None:
        self.bar.close()

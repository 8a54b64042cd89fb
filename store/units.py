"""Byte counts and durations as people read them, one format for the terminal and the reports."""
from __future__ import annotations

import math


def format_bytes(n: float | None) -> str:
    """1536 -> "1.5 KiB", 3 * 2**30 -> "3.0 GiB": the largest binary unit the value reaches."""
    if n is None:
        return "-"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def format_duration(seconds: float | None) -> str:
    """90 -> "1.5 min", 5400 -> "1.5 h", 2.5 * 86400 -> "2.5 d": the largest unit the value
    reaches (s, min, h, d, y of 365 days); inf -> "inf"."""
    if seconds is None or math.isnan(seconds):
        return "-"
    if math.isinf(seconds):
        return "inf" if seconds > 0 else "-inf"
    for unit, size in (("y", 365 * 86400), ("d", 86400), ("h", 3600), ("min", 60)):
        if abs(seconds) >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.3g} s"

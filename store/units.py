"""Byte counts as people read them, one format for the terminal and the reports."""
from __future__ import annotations


def format_bytes(n: float | None) -> str:
    """1536 -> "1.5 KiB", 3 * 2**30 -> "3.0 GiB": the largest binary unit the value reaches."""
    if n is None:
        return "-"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"

"""Names that become folder names. A study name read from storage (or from a run folder's
study.json) may become one folder under runs/; it must never lead elsewhere. Search and
analysis both use this module; it imports nothing of paxsearch."""
from __future__ import annotations

import re


class UnsafeFolderName(ValueError):
    """A name that cannot be one folder name (absolute, `..`, a path separator, empty)."""


def folder_name(name: str) -> str:
    """`name` itself when it is safe as one folder name; UnsafeFolderName (one line) otherwise.
    Safe: not empty, not `.` or `..`, no `/`, `\\` or NUL, no control character."""
    text = str(name)
    if not text.strip():
        raise UnsafeFolderName("the study name is empty")
    if text in (".", "..") or re.search(r"[/\\\x00-\x1f\x7f]", text):
        raise UnsafeFolderName(f"the study name {text!r} is not a plain folder name (a path, `..` or a "
                               "control character)")
    return text


def sanitized_folder_name(name: str, default: str = "study") -> str:
    """`name` made into one plain folder name: anything but letters, digits, `_`, `-` and `.`
    becomes `_`; leading dots are dropped (no `..`, no hidden folder); `default` when nothing is left."""
    text = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(name)).lstrip(".")
    return text or default

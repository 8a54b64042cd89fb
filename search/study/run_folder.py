"""A folder paxsearch is about to write (a run folder, a SQLite file's folder): checked before
the first write, so a path that is a file, lies under a file, or sits on a read-only
filesystem is one line instead of a traceback from deep inside."""
from __future__ import annotations

import contextlib
import os

from ..errors import UserError


class FolderError(UserError, OSError):
    """A folder paxsearch must write cannot be written; the message names it and the fix."""


def check_writable(folder: str, what: str = "run folder", fix: str = "pass another --run-dir") -> None:
    """`folder` is a folder we may write, or can be created: its nearest existing ancestor is a
    folder we may write and enter. os.access asks the kernel, so a read-only filesystem is
    refused even for root (whom permission bits do not stop)."""
    path = os.path.abspath(folder)
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise FolderError(f"{what} {folder!r} is a file, not a folder; {fix}")
        _writable(path, folder, what, fix)
        return
    parent = os.path.dirname(path)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise FolderError(f"{what} {folder!r} lies under {parent!r}, which is a file; {fix}")
    _writable(parent, folder, what, fix)


def _writable(existing: str, folder: str, what: str, fix: str) -> None:
    if os.access(existing, os.W_OK | os.X_OK):
        return
    read_only = _read_only_filesystem(existing)
    why = "is on a read-only filesystem" if read_only else f"cannot be written ({existing!r}: permission denied)"
    raise FolderError(f"{what} {folder!r} {why}; {fix}")


def _read_only_filesystem(path: str) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def write_whole(path: str, text: str) -> None:
    """`text` into `path` through a temporary file beside it and a rename: a reader never sees
    half a file, and a full disk leaves no half-written one. An OSError names `path`."""
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise OSError(e.errno, e.strerror, e.filename if e.filename and e.filename != tmp else path) from None

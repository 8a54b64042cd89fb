"""Outputs written whole or not at all: into a temporary folder beside the target, then moved
into place. A failure midway leaves the target as it was (no half-written report), and
nothing outside the target folder is ever removed."""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def staged_into(out: str | os.PathLike) -> Iterator[Path]:
    """A temporary folder to write into; on success each of its entries replaces the entry of
    the same name in `out` (created when missing); other entries of `out` are kept. On failure
    the temporary folder is removed and `out` is untouched (a new `out` is not left behind)."""
    out = Path(out)
    fresh = not out.exists()
    if fresh:
        out.parent.mkdir(parents=True, exist_ok=True)
    elif not out.is_dir():
        raise NotADirectoryError(f"output folder {out} is a file; pass a folder")
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent if fresh else out))
    try:
        yield tmp
        if fresh:
            _make_ordinary(tmp)
            os.replace(tmp, out)
            return
        for entry in sorted(tmp.iterdir()):
            _replace(entry, out / entry.name, tmp)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _make_ordinary(folder: Path) -> None:
    """mkdtemp's folder is private (0700); a published folder gets the umask's permissions."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)


def _replace(new: Path, dest: Path, tmp: Path) -> None:
    """Move `new` onto `dest`; an old folder there is moved aside into tmp first (and removed
    with it), an old file or link is replaced (a link is never followed)."""
    if dest.is_dir() and not dest.is_symlink():
        os.replace(dest, tmp / f".old-{dest.name}")
    elif dest.is_symlink() or (new.is_dir() and dest.exists()):
        dest.unlink()
    os.replace(new, dest)

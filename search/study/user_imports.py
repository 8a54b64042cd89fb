"""A user's own modules (`--import MODULE`, STUDY `imports=[...]`): imported by the driver and
by every trial worker before a trial's config is built, so that what they register (a seqio
task named by `--set data.task=NAME`, say) exists in every process.

Only module names are stored (dotted identifiers, checked): a study holds data, never code;
each machine imports its own installed copy of the module, as it would with `python -c
"import MODULE"` in the folder the command runs in."""
from __future__ import annotations

import importlib
import re
import sys

from ..errors import UserError

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


class ImportFailed(UserError, ValueError):
    """A user module is not importable here; the message names it and the fix."""


def check_names(names) -> tuple[str, ...]:
    """The module names as a tuple, each a dotted identifier; ImportFailed (one line) otherwise."""
    if isinstance(names, str):
        names = (names,)
    out: list[str] = []
    for name in names or ():
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ImportFailed(f"import {name!r} is not a module name (dotted identifiers, e.g. mypkg.tasks)")
        if name not in out:
            out.append(name)
    return tuple(out)


def import_modules(names) -> None:
    """Import each module (in order); ImportFailed names the first that fails."""
    if "" not in sys.path:  # `python -m` puts the working folder first: so does a console script
        sys.path.insert(0, "")
    for name in check_names(names):
        try:
            importlib.import_module(name)
        except Exception as e:  # any failure of the user's module: one line naming it
            first = str(e).splitlines()[0] if str(e) else ""
            raise ImportFailed(f"cannot import module {name!r} (--import / STUDY imports): {type(e).__name__}: "
                               f"{first}; install it or run from the folder that holds it") from None

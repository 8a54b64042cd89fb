"""The `paxsearch` command: one subcommand per module, each with add_parser() and main(args)."""
from __future__ import annotations

import argparse
import errno
import importlib
import os
import signal
import sys

from ..errors import ShutDown, Terminated, UserError
from .envsetup import configure_logs

# subcommand name -> module of this package defining add_parser(sub) and main(args)
COMMANDS = {
    "train": "train",
    "report": "report",
    "best": "report",
    "run": "run",
    "worker": "worker",
    "resume": "resume",
    "ls": "ls",
    "export": "export",
}

VERBOSE_HELP = "show third-party log lines (TensorFlow, absl, Orbax, JAX); they are quiet by default"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="paxsearch", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in dict.fromkeys(COMMANDS.values()):  # a module may define several subcommands
        importlib.import_module(f"{__package__}.{module}").add_parser(sub)
    for command in sub.choices.values():  # `paxsearch train --verbose ...` too; SUPPRESS keeps the global one
        command.add_argument("--verbose", action="store_true", default=argparse.SUPPRESS, help=VERBOSE_HELP)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logs(args.verbose)
    from ...store.urls import StorageUrlError
    from ...trainer.errors import ConfigError, DataError, NonFiniteLoss  # imports nothing heavy

    previous = signal.signal(signal.SIGTERM, _terminate)
    # Ctrl-C stops every command, whatever this process inherited: Python installs its
    # KeyboardInterrupt handler only where SIGINT was not ignored at start, and a shell starts
    # background jobs (`cmd &` in a script, CI runners) with SIGINT ignored.
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return int(args.func(args) or 0)
    except (UserError, StorageUrlError, ConfigError, DataError) as e:
        print(f"paxsearch: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        line = filesystem_error(e)
        if line is None:
            raise
        print(f"paxsearch: error: {line}", file=sys.stderr)
        return 1
    except NonFiniteLoss as e:
        print(f"paxsearch: training diverged: {e}", file=sys.stderr)
        return 3
    except ShutDown as e:  # a driver's bounded stop, with what it queued again or left for `resume`
        print(f"paxsearch: {e.line}", file=sys.stderr)
        return e.status
    except Terminated:
        print("paxsearch: terminated (SIGTERM)", file=sys.stderr)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        print("paxsearch: interrupted", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)


# Filesystem errors a user's machine causes (disk full, quota, read-only, a path through a file,
# permissions): one line naming the path and the fix, exit status 1. Other OSErrors are bugs and
# keep their traceback.
_FIX = {errno.ENOSPC: "free some space or use a --run-dir on another disk",
        errno.EDQUOT: "free some space or use a --run-dir on another disk",
        errno.EFBIG: "the file is over this machine's file size limit (ulimit -f)",
        errno.EROFS: "use a --run-dir on a writable filesystem",
        errno.EACCES: "use a --run-dir you can write", errno.EPERM: "use a --run-dir you can write",
        errno.ENOTDIR: "a part of the path is a file; pass another path",
        errno.EEXIST: "a file is in the way; pass another path",
        errno.EISDIR: "a folder is where a file should be; pass another path",
        errno.ENAMETOOLONG: "use a shorter path"}


def filesystem_error(e: OSError) -> str | None:
    """The one line for a filesystem error the user can fix, or None for any other OSError."""
    fix = _FIX.get(e.errno)
    if fix is None:
        return None
    where = f": {e.filename}" if e.filename else ""
    return f"{e.strerror or os.strerror(e.errno)}{where}; {fix}"


def _terminate(signum, frame) -> None:
    raise Terminated()


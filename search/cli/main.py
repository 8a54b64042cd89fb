"""The `paxsearch` command: one subcommand per module, each with add_parser() and main(args)."""
from __future__ import annotations

import argparse
import importlib
import signal
import sys

from ..errors import Terminated, UserError

# subcommand name -> module of this package defining add_parser(sub) and main(args)
COMMANDS = {
    "train": "train",
    "report": "report",
    "best": "report",
    "run": "run",
    "worker": "worker",
    "resume": "resume",
    "ls": "ls",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="paxsearch", description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in dict.fromkeys(COMMANDS.values()):  # a module may define several subcommands
        importlib.import_module(f"{__package__}.{module}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from ...store.urls import StorageUrlError
    from ...trainer.errors import ConfigError, DataError, NonFiniteLoss  # imports nothing heavy

    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        return int(args.func(args) or 0)
    except (UserError, StorageUrlError, ConfigError, DataError) as e:
        print(f"paxsearch: error: {e}", file=sys.stderr)
        return 2
    except NonFiniteLoss as e:
        print(f"paxsearch: training diverged: {e}", file=sys.stderr)
        return 3
    except Terminated:
        print("paxsearch: terminated (SIGTERM); running trials were queued again", file=sys.stderr)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        print("paxsearch: interrupted", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


def _terminate(signum, frame) -> None:
    raise Terminated()


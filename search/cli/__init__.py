"""The `paxsearch` command (`python -m paxsearch.search.cli`): one module per subcommand, each
with add_parser(sub) and main(args); main.py dispatches and maps user errors to one line."""
from .main import build_parser, main

__all__ = ["build_parser", "main"]

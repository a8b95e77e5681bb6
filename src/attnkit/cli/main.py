"""``attnkit`` command line: thin subcommands over library functions.

Each subcommand is a module ``attnkit.cli.<name>`` with ``add_parser(subparsers)``; the parser sets
``run(args) -> int`` as a default.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys

COMMANDS = ["demo", "masks", "bench", "train", "generate", "doctor"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnkit", description="Self-attention that is right, fast and understandable.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        if importlib.util.find_spec(f"attnkit.cli.{name}") is not None:
            importlib.import_module(f"attnkit.cli.{name}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())

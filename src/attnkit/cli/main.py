"""``attnkit`` command line: thin subcommands over library functions."""

from __future__ import annotations

import argparse
import sys

from attnkit.cli import demo, masks


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnkit", description="Self-attention that is right, fast and understandable.")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in (demo, masks):
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())

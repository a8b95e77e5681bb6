"""``attnkit`` command line: thin subcommands over library functions.

Each subcommand is a module ``attnkit.cli.<name>`` with ``add_parser(subparsers)``; the parser sets
``run(args) -> int`` as a default. Commands are discovered: every module of this package that defines
``add_parser`` is one, so adding a command is adding a file.

A user error (a typed :class:`attnkit.errors.AttnkitError` for bad input or an unsupported environment)
prints its message alone (one line, no hint) and exits with status 2; ``--debug`` shows the traceback instead.
Arguments are checked before any work: every ``--seed`` is an int from 0 to 2**63 - 1 (:func:`flags.apply_rules`)
and every text argument valid UTF-8 (:func:`flags.check_strings`). A command-line
mistake argparse finds (an unknown flag, a missing argument) prints one line and ``see `attnkit CMD --help```,
not the whole usage block, and exits with status 2 too.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import shlex
import sys
from pathlib import Path

import attnkit.cli as _package
from attnkit.cli.flags import apply_rules, as_typed, check_strings
from attnkit.errors import AttnkitError
from attnkit.training.interrupt import TrainingInterrupted

_NOT_COMMANDS = {"main"}


class _Parser(argparse.ArgumentParser):
    """An argparse parser whose errors are one line and a pointer to ``--help`` (the usage block hid the line)."""

    def error(self, message: str):
        print(f"{self.prog}: error: {message}\nsee `{self.prog} --help` for the options", file=sys.stderr)
        raise SystemExit(2)


def command_modules() -> dict[str, object]:
    """``{command name: module}`` for every ``attnkit.cli`` module with ``add_parser`` (underscores -> dashes)."""
    found = {}
    for info in sorted(pkgutil.iter_modules(_package.__path__), key=lambda m: m.name):
        if info.name.startswith("_") or info.name in _NOT_COMMANDS:
            continue
        module = importlib.import_module(f"{_package.__name__}.{info.name}")
        if callable(getattr(module, "add_parser", None)):
            found[info.name.replace("_", "-")] = module
    return found


def build_parser() -> argparse.ArgumentParser:
    from attnkit import __version__

    parser = _Parser(prog="attnkit", description="Self-attention that is right, fast and understandable.")
    parser.add_argument("--version", action="version", version=f"attnkit {__version__}")
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for module in command_modules().values():
        module.add_parser(sub)
    parser.commands = sub.choices  # {name or alias: its parser}
    apply_rules(parser)  # the flags every command shares (--seed), checked the same way everywhere
    return parser


def resume_command(stopped: TrainingInterrupted) -> str:
    """The command that continues a stopped run: under torchrun, torchrun again with as many processes."""
    plain = f"train --resume {shlex.quote(str(stopped.run_dir))}"
    if stopped.world <= 1:
        return f"attnkit {plain}"
    local = int(os.environ.get("LOCAL_WORLD_SIZE", stopped.world))
    nodes = max(1, stopped.world // max(local, 1))
    launch = "--standalone " if nodes == 1 else f"--nnodes {nodes} (this job's rendezvous flags) "
    return f"torchrun {launch}--nproc-per-node {local} -m attnkit.cli.main {plain}"


def main(argv: list[str] | None = None) -> int:
    startup_s = process_age_s() if argv is None else 0.0  # a command's start-up (called with argv: none of it)
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv  # also honoured after the subcommand (attnkit train ... --debug)
    argv = [a for a in argv if a != "--debug"]
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # named by the command that was running: `attnkit train: error: unrecognized arguments: --nope`
        parser.commands[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    args.startup_s = startup_s  # train --minutes counts it
    try:
        check_strings(parser.commands[args.command], args)  # every text argument valid UTF-8, before any work
        return int(args.run(args) or 0)
    except TrainingInterrupted as exc:  # Ctrl-C / SIGTERM during training: the step is checkpointed
        if debug:
            raise
        print(f"attnkit {args.command}: {exc}", file=sys.stderr)
        print(f"resume with: {resume_command(exc)}", file=sys.stderr)
        return 128 + exc.signum
    except KeyboardInterrupt:  # Ctrl-C anywhere else: nothing half-written (writes are atomic), no traceback
        if debug:
            raise
        print(f"attnkit {args.command}: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:  # a write the library did not name (disk full, read-only): the path and the OS error
        from attnkit.runs.write import write_failed

        failed = write_failed(exc.filename, exc, atomic=False) if exc.filename is not None and not debug else None
        if failed is None:
            raise
        print(f"attnkit {args.command}: error: {failed}", file=sys.stderr)
        return 2
    except AttnkitError as exc:  # a user error: the typed message (it names the value and the fix) alone
        if debug:
            raise
        print(f"attnkit {args.command}: error: {as_typed(str(exc), args.command)}", file=sys.stderr)
        return 2


def process_age_s() -> float:
    """Seconds since this process started (Linux: /proc; 0 elsewhere): Python's and torch's start-up."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()  # fields 3.. of proc(5)
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"))  # field 22: starttime in ticks
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0


if __name__ == "__main__":
    sys.exit(main())

"""How the command line names what the library's messages call by their Python names.

The library's messages name a setting as its Python argument (``run_dir='runs/a'``, ``overwrite=True``,
``device='cpu'``); the command line shows the flag the user typed (``--run-dir 'runs/a'``, ``--overwrite``,
``--device cpu``). :func:`as_typed` makes that one translation, where :mod:`attnkit.cli.main` prints a typed error.
Only ``name=`` spellings are translated (a bare word such as ``out`` or ``data`` may be part of a path).
"""

from __future__ import annotations

import re
from pathlib import PurePath

#: Python argument -> the flag that sets it (where they differ only by ``--`` and dashes, the rule below)
FLAGS = {"doctor": "--no-doctor"}
#: the Python names the messages use that are command-line flags (``name=`` in a message becomes the flag)
NAMES = ("run_dir", "resume", "init_from", "overwrite", "out", "hf", "device", "data", "seq_len", "max_new_tokens",
         "max_tokens", "dense_max", "doctor", "overfit", "monitor", "grad_checkpointing", "quick", "keep", "ids",
         "threads", "space", "minutes", "trials", "trial_steps", "seeds", "workers", "storage", "study", "join",
         "grid", "preset", "heartbeat_s")
#: per command, Python names whose flag is another word (``convert_folder(path=...)`` is ``convert --hf``)
COMMANDS = {"convert": {"path": "--hf"}, "export": {"out": "--hf", "family": "--family", "run_path": "RUN"}}
#: flags whose value is a plain word, shown unquoted (``device='cpu'`` -> ``--device cpu``)
WORDS = {"device"}
#: switches: ``name=True`` is the flag alone (``doctor=False`` is ``--no-doctor``)
SWITCHES = {"overwrite": "True", "overfit": "True", "grad_checkpointing": "True", "quick": "True",
            "doctor": "False", "join": "True", "grid": "True"}

#: what follows a name in a message: its value (a switch, a quoted string or a number), or nothing
_VALUE = r"=(True|False|'[^']*'|\d+)?"


def flag(name: str, command: str | None = None) -> str:
    """The flag that sets the Python argument ``name`` (``run_dir`` -> ``--run-dir``) in ``command``."""
    return COMMANDS.get(command, {}).get(name) or FLAGS.get(name, "--" + name.replace("_", "-"))


def _one(match: re.Match, command: str | None) -> str:
    name, value = match.group(1), match.group(2)
    if name is None:  # a quoted value outside a name=: a path or a value the user typed
        return match.group(0)
    if name in SWITCHES and value in ("True", "False"):
        return flag(name, command)
    if value is None:
        return flag(name, command)
    if name in WORDS and value.startswith("'"):
        value = value[1:-1]
    return f"{flag(name, command)} {value}"


def as_typed(message: str, command: str | None = None) -> str:
    """``message`` with each ``name=value`` of a flag's Python name written as the flag ``command`` exposes."""
    names = (*NAMES, *COMMANDS.get(command, {}))
    pattern = r"(?<!\w)'[^']*'|(?<![\w.-])(" + "|".join(names) + r")" + _VALUE  # a quoted value: left as it is
    return re.sub(pattern, lambda match: _one(match, command), message)


#: the largest seed every command takes: a seed is one signed 64-bit int (torch, numpy and the run's config agree)
SEED_MAX = 2**63 - 1


def seed(text: str) -> int:
    """argparse ``type`` of every command's ``--seed``: an int from 0 to :data:`SEED_MAX` (2**63 - 1), refused at
    parse time, before anything is loaded (a larger one crashed deep in torch or numpy, after the model was built)."""
    import argparse

    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or not 0 <= value <= SEED_MAX:
        shown = text if len(text) <= 40 else f"{text[:20]}...({len(text)} characters)"
        raise argparse.ArgumentTypeError(f"must be an int from 0 to 2**63 - 1 ({SEED_MAX}), got {shown!r}; e.g. "
                                         "--seed 0")
    return value


def apply_rules(parser) -> None:
    """The rules every command's flags share, set in one place on ``parser`` and each of its sub-commands' parsers:
    a ``--seed`` is read by :func:`seed`. (A command added later gets them without remembering them.)"""
    import argparse

    for action in parser._actions:
        if action.dest == "seed" and action.option_strings:
            action.type = seed
        if isinstance(action, argparse._SubParsersAction):
            for sub in set(action.choices.values()):
                apply_rules(sub)


def check_strings(parser, args) -> None:
    """Refuse a string argument (a flag's value, a positional, a path) that is not valid UTF-8, naming the flag as
    typed: an undecodable byte on the command line arrives as a lone surrogate and crashed the command later
    (printing it, tokenizing it, writing it), after the model was loaded."""
    from attnkit._files import check_text

    names = {}  # dest -> how the user typed it (--text, TARGET)

    def collect(p) -> None:
        import argparse

        for action in p._actions:
            names.setdefault(action.dest, action.option_strings[0] if action.option_strings else action.dest.upper())
            if isinstance(action, argparse._SubParsersAction):
                for sub in set(action.choices.values()):
                    collect(sub)

    collect(parser)
    for dest, value in vars(args).items():
        for one in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(one, (str, PurePath)):
                check_text(names.get(dest, dest), str(one))

"""The search space of a sweep: the knobs, how a user writes them, and which combinations a model can be built from.

A space maps knob names to :class:`Choices` (a list of values) or a :class:`Range` (``low..high``). It is written
as command-line words (``heads=1,2,4,8 window=none,128 lr=5e-4..5e-3``), as a small TOML file (``heads = [1, 2]``,
``lr = "5e-4..5e-3"``), or as a dict in Python (lists for choices, ``"a..b"`` strings or :class:`Range` for
ranges). Knobs the space leaves out stay at the baseline's value: the search moves only what it names.

=========  ==========================  ==================================================================
knob       sets                        values
=========  ==========================  ==================================================================
heads      num_heads (H)               ints
kv_heads   num_kv_heads (Hkv)          ints dividing heads, or ``heads`` (= H: plain multi-head attention)
width      embed_dim (E)               ints; head dim = E / H
head_dim   head_dim (D)                ints; the model width follows: E = H * D (excludes ``width``)
layers     num_layers                  ints or a range
positions  positions                   rope, alibi, learned, sinusoidal, none
window     window                      ints (keys of a sliding window) or ``none`` (full causal attention)
dropout    dropout                     floats in [0, 1) or a range (attention weights and residual paths)
lr         lr (peak learning rate)     floats > 0 or a range (searched on a log scale)
warmup     warmup (steps)              ints >= 0 or a range
=========  ==========================  ==================================================================
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path

import tomllib
import torch

from attnkit.errors import AttnkitError, AttnkitValueError
from attnkit.models.builders import PRESETS, lm_config
from attnkit.models.config import POSITIONS
from attnkit.models.lm import TransformerLM


@dataclass(frozen=True)
class Knob:
    """One searchable setting: the field it sets (``model`` for LMConfig, ``train`` for TrainConfig), the kind of
    its values, whether a range may be searched, and the words it takes besides numbers (word -> value)."""

    name: str
    field: str
    where: str
    kind: type
    ranged: bool = False
    log: bool = False
    words: tuple[tuple[str, object], ...] = ()
    low: float = 1


KNOBS = {k.name: k for k in (
    Knob("heads", "num_heads", "model", int),
    Knob("kv_heads", "num_kv_heads", "model", int, words=(("heads", None),)),
    Knob("width", "embed_dim", "model", int),
    Knob("head_dim", "head_dim", "model", int),
    Knob("layers", "num_layers", "model", int, ranged=True),
    Knob("positions", "positions", "model", str, words=tuple((p, p) for p in POSITIONS)),
    Knob("window", "window", "model", int, words=(("none", None),)),
    Knob("dropout", "dropout", "model", float, ranged=True, low=0.0),
    Knob("lr", "lr", "train", float, ranged=True, log=True, low=0.0),
    Knob("warmup", "warmup", "train", int, ranged=True, low=0),
)}
#: knobs that decide whether a model can be built at all (checked together, every combination)
STRUCTURE = ("heads", "kv_heads", "width", "head_dim", "positions")


@dataclass(frozen=True)
class Choices:
    values: tuple

    def describe(self) -> str:
        return ",".join(str(v) for v in self.values)


@dataclass(frozen=True)
class Range:
    low: float
    high: float

    def describe(self) -> str:
        return f"{self.low:g}..{self.high:g}"


def _bad(entry: str, reason: str) -> AttnkitValueError:
    """A refused space, named as the user wrote it: ``space='heads=3': ...`` (the CLI shows ``--space 'heads=3'``)."""
    return AttnkitValueError(f"space='{entry}': {reason}")


def _value(knob: Knob, text) -> object:
    """One value of ``knob`` from a word or a number (a string from the command line or TOML, or a Python value)."""
    words = dict(knob.words)
    if isinstance(text, str) and text.strip().lower() in words:
        return text.strip().lower()  # kept as the word: what the study stores and the summary shows
    if knob.kind is str:
        raise _bad(f"{knob.name}={text}", f"{text!r} is not one of {', '.join(words)}.")
    try:
        value = knob.kind(text) if isinstance(text, str) else text
    except ValueError:
        value = None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (knob.kind is int and value != int(value)):
        hint = f" or {', '.join(words)}" if words else ""
        raise _bad(f"{knob.name}={text}", f"{text!r} is not {'an int' if knob.kind is int else 'a number'}{hint}.")
    value = knob.kind(value)
    low_ok = value > knob.low if knob.name == "lr" else value >= knob.low
    if not math.isfinite(value) or not low_ok or (knob.name == "dropout" and value >= 1):
        bound = {"lr": "> 0", "dropout": "in [0, 1)"}.get(knob.name, f">= {knob.low:g}")
        raise _bad(f"{knob.name}={text}", f"{knob.name} must be {bound}.")
    return value


def parse_entry(name: str, values) -> Choices | Range:
    """A knob's values from the command line (``"1,2,4"``, ``"1e-4..1e-2"``), TOML or Python (a list)."""
    knob = KNOBS.get(name.strip())
    if knob is None:
        raise _bad(f"{name}={values}", f"unknown knob {name.strip()!r}; the knobs are {', '.join(KNOBS)}.")
    if isinstance(values, Range) or (isinstance(values, str) and ".." in values):
        low, high = (values.low, values.high) if isinstance(values, Range) else values.split("..", 1)
        if not knob.ranged:
            raise _bad(f"{knob.name}={values}", f"{knob.name} takes a list of values, not a range; e.g. "
                       f"{knob.name}=1,2,4.")
        low, high = _value(knob, low), _value(knob, high)
        if not low < high:
            fix = f"e.g. {knob.name}={high}..{low}" if low > high else "give two different ends"
            raise _bad(f"{knob.name}={low}..{high}", f"an empty range (low must be below high); {fix}.")
        return Range(low, high)
    if isinstance(values, str):
        values = [v for v in values.split(",") if v.strip()]
    if not isinstance(values, (list, tuple)) or not values:
        raise _bad(f"{knob.name}=", f"{knob.name} has no values; give at least one, e.g. {knob.name}=" +
                   ",".join(str(v) for v in _example(knob)) + ".")
    parsed = tuple(dict.fromkeys(_value(knob, v) for v in values))  # in the order given, each once
    return Choices(parsed)


def _example(knob: Knob) -> tuple:
    return {"positions": ("rope", "alibi"), "window": ("none", 128), "kv_heads": ("heads", 1), "dropout": (0, 0.1),
            "lr": (1e-3, 3e-3), "warmup": (10, 50)}.get(knob.name, (1, 2, 4))


def parse_words(words: list[str]) -> dict:
    """A space from command-line words: ``knob=values`` entries and TOML files (``space.toml``), merged in order."""
    space: dict = {}
    for word in words:
        if "=" in word:
            name, values = word.split("=", 1)
            space[name.strip()] = parse_entry(name, values)
        elif word.lower().endswith(".toml"):
            space.update(read_toml(word))
        else:
            raise _bad(word, "expected knob=values (e.g. heads=1,2,4) or a .toml file.")
    return space


def read_toml(path: str | Path) -> dict:
    """A space from a TOML file of ``knob = [values]`` or ``knob = "low..high"`` lines."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise _bad(str(path), f"cannot read the file ({exc.strerror or exc}).") from None
    except tomllib.TOMLDecodeError as exc:
        raise _bad(str(path), f"not valid TOML ({exc}).") from None
    return {name: parse_entry(name, values) for name, values in data.items()}


def normalised(space: dict | None) -> dict | None:
    """A space given in Python (lists, ``"a..b"`` strings, Choices/Range) as Choices/Range per knob."""
    if space is None:
        return None
    if not isinstance(space, dict):
        raise AttnkitValueError(f"space= must be a dict of knob -> values, got {type(space).__name__}; e.g. "
                                "{'heads': [1, 2, 4, 8], 'window': ['none', 128]}.")
    return {name: v if isinstance(v, Choices) else parse_entry(name, v) for name, v in space.items()}


def default_space(preset: str) -> dict:
    """The space searched when the user gives none: the attention knobs around the preset's size (for ``tiny``: 1-8
    heads, MHA or MQA, half or full width, 2 or 4 layers, every position scheme, full or a quarter-length window,
    no dropout or 0.1, lr 1e-3..4e-3 on a log scale)."""
    p = PRESETS[preset]
    widths = sorted({p["embed_dim"] // 2, p["embed_dim"]})
    return normalised({"heads": [1, 2, 4, 8], "kv_heads": ["heads", 1], "width": widths,
                       "layers": sorted({max(1, p["num_layers"] // 2), p["num_layers"]}),
                       "positions": ["rope", "alibi", "learned", "sinusoidal"],
                       "window": ["none", p["max_seq_len"] // 4], "dropout": [0.0, 0.1], "lr": "1e-3..4e-3"})


def as_setting(name: str, value) -> object:
    """The config value of knob ``name``'s searched ``value`` (its words mapped: ``none`` -> None)."""
    return dict(KNOBS[name].words).get(value, value) if isinstance(value, str) else value


def model_overrides(values: dict) -> dict:
    """LMConfig overrides from knob values (``head_dim`` also sets the width to H * D)."""
    out = {KNOBS[n].field: as_setting(n, v) for n, v in values.items() if KNOBS[n].where == "model"}
    if out.get("head_dim") is not None:
        out["embed_dim"] = out["head_dim"] * out.get("num_heads", 1)
    return out


def train_overrides(values: dict) -> dict:
    return {KNOBS[n].field: as_setting(n, v) for n, v in values.items() if KNOBS[n].where == "train"}


def build_problem(preset: str, values: dict, seq_len: int | None = None) -> str | None:
    """Why a model with these knob values cannot be built (the model's own message), or None when it can.
    Built on the meta device: no memory, no weights."""
    overrides = model_overrides(values)
    positions = overrides.get("positions", PRESETS[preset].get("positions", "rope"))
    if positions == "learned" and seq_len is not None and seq_len > PRESETS[preset]["max_seq_len"]:
        return f"learned positions have {PRESETS[preset]['max_seq_len']} rows, shorter than seq_len {seq_len}"
    try:
        with torch.device("meta"):
            TransformerLM(lm_config(preset, **{**overrides, "num_layers": 1}))
    except AttnkitError as exc:
        return str(exc)
    return None


def param_count(preset: str, values: dict, seq_len: int | None = None, vocab_size: int = 257) -> int:
    """Parameters of the model these knob values build (as the trainer builds it: byte vocabulary, positions for
    the longer of ``seq_len`` and the preset's length), counted on the meta device."""
    max_len = max(seq_len or 0, PRESETS[preset]["max_seq_len"])
    with torch.device("meta"):
        model = TransformerLM(lm_config(preset, **{**model_overrides(values), "vocab_size": vocab_size,
                                                   "max_seq_len": max_len}))
    return model.num_parameters()


def check_buildable(space: dict, preset: str, fixed: dict, seq_len: int | None = None) -> None:
    """Refuse a space no model can be built from, and a value that no combination of the others can build: every
    combination of the structural knobs (:data:`STRUCTURE`, the others at ``fixed``) is built on the meta device."""
    if "width" in space and "head_dim" in space:
        raise _bad(_describe(space), "width and head_dim both given: head_dim sets the width (heads * head_dim); "
                   "search one of them.")
    names = [n for n in STRUCTURE if n in space or n in fixed]
    options = [space[n].values if n in space else (fixed[n],) for n in names]
    works: dict[tuple[str, object], bool] = {}
    problems = []
    for combo in itertools.product(*options):
        values = dict(zip(names, combo))
        problem = build_problem(preset, values, seq_len)
        for n, v in values.items():
            works[(n, v)] = works.get((n, v), False) or problem is None
        if problem is not None:
            problems.append((values, problem))
    if problems and len(problems) == math.prod(len(o) for o in options):
        values, problem = problems[0]
        raise _bad(_describe(space), f"no model of the {preset!r} preset can be built from this space (e.g. "
                   f"{_pairs(values)}: {problem}); change the values.")
    for (n, v), ok in works.items():
        if not ok and n in space:
            values, problem = next((c, p) for c, p in problems if c[n] == v)
            raise _bad(f"{n}={v}", f"no combination with the other knobs builds a model (e.g. {_pairs(values)}: "
                       f"{problem}); remove {v} from {n}.")


def _pairs(values: dict) -> str:
    return " ".join(f"{n}={v}" for n, v in values.items())


def _describe(space: dict) -> str:
    return " ".join(f"{n}={c.describe()}" for n, c in space.items())


def describe(space: dict) -> str:
    """The space as the command-line words that write it."""
    return _describe(space)


def show(value) -> str:
    """A knob value as a person reads it (floats to 3 significant digits)."""
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def knobs_text(values: dict, names) -> str:
    """``heads=2 lr=0.00123 ...`` for the knobs of ``values`` named in ``names``."""
    return " ".join(f"{k}={show(v)}" for k, v in values.items() if k in names)


def suggest(trial, space: dict) -> dict:
    """Knob values for an Optuna ``trial`` (categorical choices; float ranges on a log scale for ``lr``)."""
    values = {}
    for name, entry in space.items():
        knob = KNOBS[name]
        if isinstance(entry, Range):
            if knob.kind is int:
                values[name] = trial.suggest_int(name, int(entry.low), int(entry.high))
            else:
                values[name] = trial.suggest_float(name, entry.low, entry.high, log=knob.log)
        else:
            values[name] = trial.suggest_categorical(name, list(entry.values))
    return values


def to_json(space: dict) -> dict:
    """The space as JSON (what the study and sweep.json record): ``{knob: [values] or "low..high"}``."""
    return {n: list(e.values) if isinstance(e, Choices) else e.describe() for n, e in space.items()}

"""Benchmark suites (``attnkit bench <suite>``): side-by-side timings, medians, ratios, JSON results.

Suites are discovered, like commands, checks and labs: every module of this package that defines
``add_arguments(parser)`` and ``run(args) -> int`` is a suite named after the module (underscores become
dashes), with its ``SUMMARY`` (or the first line of its docstring) as its help. A suite whose results can be
redrawn without re-running defines ``replot(payload, results_path) -> list[Path]``: ``attnkit bench plots``
hands it every results file whose ``benchmark`` is the suite's name or starts with it and ``_``. Adding a suite
is adding a file; nothing lists them, and suites share only the helpers (``common``, ``plots.line_panels``):
no bench module imports one that imports it back (tests/bench checks the import graph).
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType


def suites() -> dict[str, ModuleType]:
    """``{suite name: module}`` for every module of this package with ``add_arguments`` and ``run``, by name."""
    found = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        if callable(getattr(module, "add_arguments", None)) and callable(getattr(module, "run", None)):
            found[info.name.replace("_", "-")] = module
    return found


def summary(module: ModuleType) -> str:
    """A suite's one-line help: its ``SUMMARY``, else the first line of its docstring."""
    text = getattr(module, "SUMMARY", None) or (module.__doc__ or "").strip().splitlines()[0:1]
    return text if isinstance(text, str) else (text[0] if text else "")


def replotter(benchmark: str):
    """The ``replot`` of the suite that wrote results named ``benchmark`` (``attention_window`` -> attention's),
    or None."""
    for name, module in suites().items():
        if (benchmark == name or benchmark.startswith(f"{name}_")) and callable(getattr(module, "replot", None)):
            return module.replot
    return None

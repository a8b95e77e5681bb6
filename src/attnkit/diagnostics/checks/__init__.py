"""The doctor's checks. Every module of this package is imported here, and each ``@check`` in it registers
itself in ``base.REGISTRY``: adding a check is adding a file (or one decorated function). The doctor runs
every registered check, ordered by its declared ``order`` (:func:`names`).
"""

import importlib
import pkgutil

from attnkit.diagnostics.checks.base import (
    FAIL,
    INFO,
    PASS,
    REGISTRY,
    SKIP,
    WARN,
    Check,
    Options,
    Outcome,
    Skip,
    check,
    names,
)

for _module in pkgutil.iter_modules(__path__):
    if _module.name != "base":
        importlib.import_module(f"{__name__}.{_module.name}")


__all__ = ["REGISTRY", "Check", "Options", "Outcome", "Skip", "PASS", "WARN", "FAIL", "SKIP", "INFO", "check",
           "names"]

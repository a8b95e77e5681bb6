"""Scalar argument checks shared by every module (L0: depends only on ``attnkit.errors``).

Each raises a typed error whose message names the argument, its value and, when given, the fix.
"""

from __future__ import annotations

import math

from attnkit.errors import AttnkitTypeError, AttnkitValueError, describe


def positive_int(value: object, name: str, hint: str = "") -> int:
    """``value`` if it is an int >= 1 (bools refused); else ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise AttnkitValueError(f"{name} must be a positive int, got {describe(value)}" + (f"; {hint}" if hint else "."))
    return value


def integer(value: object, name: str, *, low: int, fix: str) -> int:
    """``value`` if it is an int >= ``low``: ``TypeError`` for a non-int, ``ValueError`` below ``low``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise AttnkitTypeError(f"{name} must be an int, got {describe(value)}; {fix}")
    if value < low:
        raise AttnkitValueError(f"{name} must be >= {low}, got {value}; {fix}")
    return value


def number(value: object, name: str, *, low: float, high: float = math.inf, low_open: bool = False,
           fix: str) -> float:
    """``value`` as a float if it is a finite real in ``[low, high)`` (``(low, high)`` with ``low_open``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise AttnkitTypeError(f"{name} must be a finite number, got {describe(value)}; {fix}")
    if not ((low < value) if low_open else (low <= value)) or not value < high:
        bound = (f"in {'(' if low_open else '['}{low}, {high})" if math.isfinite(high)
                 else f"{'>' if low_open else '>='} {low}")
        raise AttnkitValueError(f"{name} must be {bound}, got {value}; {fix}")
    return float(value)

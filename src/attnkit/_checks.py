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
           high_closed: bool = False, allow_inf: bool = False, fix: str) -> float:
    """``value`` as a float if it is a finite real in ``[low, high)`` (``(low`` with ``low_open``, ``high]`` with
    ``high_closed``); ``allow_inf`` also takes ``inf`` when ``high`` is infinite (e.g. "no clipping")."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) or (allow_inf and value == math.inf)):
        kind = "a finite number or inf" if allow_inf else "a finite number"
        raise AttnkitTypeError(f"{name} must be {kind}, got {describe(value)}; {fix}")
    above = (low < value) if low_open else (low <= value)
    below = (value <= high) if high_closed or not math.isfinite(high) else (value < high)
    if not (above and below):
        bound = (f"in {'(' if low_open else '['}{low}, {high}{']' if high_closed else ')'}" if math.isfinite(high)
                 else f"{'>' if low_open else '>='} {low}")
        raise AttnkitValueError(f"{name} must be {bound}, got {value}; {fix}")
    return float(value)

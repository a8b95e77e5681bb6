"""Scalar and position-id argument checks shared by every module (L0: depends only on ``attnkit.errors``).

Each raises a typed error whose message names the argument, its value and, when given, the fix.
"""

from __future__ import annotations

import math

import torch

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


def position_ids(value: object, name: str = "positions", *, length: int | None = None, batch: int | None = None,
                 device: torch.device | None = None, owner: str = "q", two_dims: bool = False, note: str = ""):
    """``value`` if it is an integer tensor of token positions ``(L,)`` or ``(B, L)``: the one check of position
    ids (attention calls, modules, position schemes, masks, caches, context parallelism).

    ``length``: L must be it, and the batch dim 1 or ``batch``; ``two_dims``: only ``(1|B, L)`` (caches);
    ``device``: the positions must sit there, with ``owner`` (the tensor that decides it) named in the message;
    ``note``: what the shape must match, in words. Returns int64 ``(B|1, L)`` when ``length`` is given, else the
    tensor as given. ``TypeError`` for anything but an integer tensor, ``ValueError`` for a shape or device
    that does not fit.
    """
    if not isinstance(value, torch.Tensor) or value.dtype.is_floating_point or value.dtype.is_complex or \
            value.dtype == torch.bool:
        raise AttnkitTypeError(f"{name} must be an integer tensor of absolute positions, got {describe(value)}; pass "
                               "e.g. torch.arange(L) (int64).")
    dims = (2,) if two_dims else (1, 2)
    if value.dim() not in dims or (length is not None and (value.shape[-1] != length or (
            value.dim() == 2 and batch is not None and value.shape[0] not in (1, batch)))):
        shapes = (f"(1, {length}) or ({batch}, {length})" if two_dims else
                  "(L,) or (B, L)" if length is None else f"({length},) or ({batch if batch is not None else 'B'}, "
                  f"{length})")
        raise AttnkitValueError(f"{name} must have shape {shapes}{note}, got {describe(value)}; give one position "
                                "per token.")
    if device is not None and value.device != device:
        raise AttnkitValueError(f"{name} is on {value.device} but {owner} is on {device}; move it with "
                                f".to({owner}.device).")
    if length is None:
        return value
    return value.long().reshape(value.shape[0] if value.dim() == 2 else 1, length)  # (B|1, L)

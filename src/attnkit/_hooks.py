"""Observers and editors of attention calls (used by ``attnkit.diagnostics`` to capture weights from any
backend, and to ablate or patch heads).

``attnkit.attention`` passes each call's per-head output ``(B, H, Lq, Dv)`` (before any output projection)
through every registered editor, which may return a replacement of the same shape, and then notifies every
registered observer with the validated call and its result. With none registered the cost is one list
truthiness check per call for each.
"""

from __future__ import annotations

from collections.abc import Callable

# observer(call: AttentionCall, output) -> None
OBSERVERS: list[Callable] = []


# editor(call: AttentionCall, out (B, H, Lq, Dv)) -> out (B, H, Lq, Dv)
EDITORS: list[Callable] = []


def add_observer(fn: Callable) -> None:
    OBSERVERS.append(fn)


def remove_observer(fn: Callable) -> None:
    if fn in OBSERVERS:
        OBSERVERS.remove(fn)


def add_editor(fn: Callable) -> None:
    EDITORS.append(fn)


def remove_editor(fn: Callable) -> None:
    if fn in EDITORS:
        EDITORS.remove(fn)

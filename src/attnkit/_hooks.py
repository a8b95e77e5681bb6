"""Observers of attention calls (used by ``attnkit.diagnostics`` to capture weights from any backend).

``attnkit.attention`` notifies every registered observer with the validated call and its output. With no
observer registered the cost is one list truthiness check per call.
"""

from __future__ import annotations

from collections.abc import Callable

# observer(call: AttentionCall, output) -> None
OBSERVERS: list[Callable] = []


def add_observer(fn: Callable) -> None:
    OBSERVERS.append(fn)


def remove_observer(fn: Callable) -> None:
    if fn in OBSERVERS:
        OBSERVERS.remove(fn)

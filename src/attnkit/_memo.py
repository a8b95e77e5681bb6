"""The one bounded memo: every table attnkit keeps across calls is a :class:`Memo`.

A memo maps a key to what was derived from exactly that key (checks passed, a lane, auto's choice, a small
mask's dense form). It serves only what it provably equals: the key holds everything the value was derived
from. It is bounded: when full, storing one more entry clears it (entries are cheap to derive again, and a
cleared table can't serve anything stale). Reads are a plain ``dict`` lookup (``memo.get(key)``), so the hot
path pays nothing for the bound; writes go through ``memo[key] = value`` or :meth:`Memo.get_or_build`.

Every memo registers itself by name (:func:`memos`), so tests and ``clear_all`` (after a registry change, in a
benchmark between cells) reach all of them without a list kept by hand.

>>> m = Memo("example", max_entries=2)
>>> m.get_or_build("a", lambda: 1), m.get_or_build("a", lambda: 2)
(1, 1)
>>> m["b"] = 2; m["c"] = 3  # the third entry clears the table first
>>> sorted(m)
['c']
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable
from typing import Any

_ALL: weakref.WeakValueDictionary[str, Memo] = weakref.WeakValueDictionary()
_MISSING = object()


class Memo(dict):
    """A bounded ``{key: value}`` table kept across calls (see the module docstring).

    ``name`` says what it holds (unique for module-level tables; per-object memos, such as a prepared mask's
    lanes, pass ``register=False``); ``max_entries`` bounds it (storing into a full memo clears it first).
    """

    __slots__ = ("name", "max_entries", "__weakref__")

    def __init__(self, name: str, max_entries: int, *, register: bool = True):
        super().__init__()
        if not isinstance(max_entries, int) or max_entries < 1:
            raise ValueError(f"Memo {name!r}: max_entries must be a positive int, got {max_entries!r}.")
        self.name, self.max_entries = name, max_entries
        if register:
            _ALL[name] = self

    def __setitem__(self, key: Hashable, value: Any) -> None:
        if len(self) >= self.max_entries and key not in self:
            self.clear()
        super().__setitem__(key, value)

    def setdefault(self, key: Hashable, value: Any = None) -> Any:
        found = self.get(key, _MISSING)
        if found is _MISSING:
            self[key] = found = value
        return found

    def update(self, *args, **kwargs) -> None:  # (every write through the bound)
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def get_or_build(self, key: Hashable, build: Callable[[], Any]) -> Any:
        """The value kept for ``key``, or ``build()`` stored under it (a full memo is cleared first)."""
        found = self.get(key, _MISSING)
        if found is _MISSING:
            found = build()
            self[key] = found
        return found

    def __repr__(self) -> str:
        return f"Memo({self.name!r}, {len(self)}/{self.max_entries} entries)"

    def __reduce__(self):  # (a memo is never pickled with its entries: they are derived, not data)
        return (Memo, (self.name, self.max_entries), None)


def memos() -> dict[str, Memo]:
    """Every registered memo by name (module-level cross-call tables)."""
    return dict(_ALL)


def clear_all() -> None:
    """Empty every registered memo (values are derived: the next call derives them again)."""
    for memo in list(_ALL.values()):
        memo.clear()

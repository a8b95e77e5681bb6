"""Progress for anything that runs longer than a few seconds (labs, benchmarks): a tqdm bar on a terminal,
plain lines elsewhere (a log file, CI, a pipe), nothing for work that ends within ``delay`` seconds.

>>> for step in progress(range(400), desc="lab heads: training H=4", unit="step"):
...     train_one(step)
lab heads: training H=4: 120/400 steps (10 s)        # plain lines on a non-terminal, one per ``every`` seconds
lab heads: training H=4: 400/400 steps, done in 31 s

``ATTNKIT_PROGRESS=0`` turns both off; ``ATTNKIT_PROGRESS=plain`` forces plain lines on a terminal too.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator

#: seconds before anything is shown (shorter work stays silent), and between two plain lines
DELAY, EVERY = 3.0, 10.0


def _mode(stream) -> str:
    setting = os.environ.get("ATTNKIT_PROGRESS", "").strip().lower()
    if setting in ("0", "off", "false", "no"):
        return "off"
    if setting == "plain":
        return "plain"
    return "bar" if getattr(stream, "isatty", lambda: False)() else "plain"


class PlainLines:
    """The non-terminal form: ``desc: n/total unit (s)`` at most once per ``every`` seconds after ``delay``,
    and a closing ``done`` line when anything was printed."""

    def __init__(self, total: int | None, desc: str, unit: str, stream, *, delay: float = DELAY,
                 every: float = EVERY, clock: Callable[[], float] = time.monotonic, initial: int = 0):
        self.total, self.desc, self.unit, self.stream = total, desc, unit, stream
        self.delay, self.every, self.clock = delay, every, clock
        self.n, self.start, self.printed_at, self.postfix = initial, clock(), None, ""

    def _count(self) -> str:
        of = f"/{self.total}" if self.total is not None else ""
        postfix = f", {self.postfix}" if self.postfix else ""
        return f"{self.n}{of} {self.unit}{'s' if self.unit and (self.total or self.n) != 1 else ''}{postfix}"

    def set_postfix(self, **values) -> None:
        """What the next line says after the count (tqdm's call): ``loss=2.31, val=2.40``."""
        self.postfix = ", ".join(f"{k}={v}" for k, v in values.items())

    def refresh(self) -> None:
        """(tqdm's call after a change of ``total``: the next line shows it.)"""

    def update(self, n: int = 1) -> None:
        self.n += n
        now = self.clock()
        due = now - self.start >= self.delay if self.printed_at is None else now - self.printed_at >= self.every
        if due:
            print(f"{self.desc}: {self._count()} ({now - self.start:.0f} s)", file=self.stream, flush=True)
            self.printed_at = now

    def close(self) -> None:
        if self.printed_at is not None:
            print(f"{self.desc}: {self._count()}, done in {self.clock() - self.start:.0f} s", file=self.stream,
                  flush=True)


def bar(total: int | None, *, desc: str | None = None, unit: str = "step", initial: int = 0, stream=None):
    """A progress object for a loop that counts for itself (``update(n)``, ``set_postfix(...)``, ``total``,
    ``close()``): a tqdm bar on a terminal, :class:`PlainLines` elsewhere (from the first update: the caller
    chose to show progress), None when ``ATTNKIT_PROGRESS=0``."""
    stream = sys.stderr if stream is None else stream
    mode = _mode(stream)
    if mode == "off":
        return None
    if mode == "bar":
        from tqdm import tqdm  # not tqdm.auto: in a notebook without ipywidgets its import alone warns

        return tqdm(total=total, initial=initial, desc=desc, unit=unit, dynamic_ncols=True, smoothing=0.1,
                    file=stream)
    return PlainLines(total, desc or "progress", unit, stream, delay=0.0, every=EVERY, initial=initial)


def progress(iterable: Iterable, *, desc: str, unit: str = "step", total: int | None = None,
             stream=None) -> Iterator:
    """Yield from ``iterable`` while showing progress on ``stream`` (default stderr) in the mode above."""
    stream = sys.stderr if stream is None else stream
    total = total if total is not None else (len(iterable) if hasattr(iterable, "__len__") else None)
    mode = _mode(stream)
    if mode == "off":
        yield from iterable
        return
    if mode == "bar":
        from tqdm import tqdm  # not tqdm.auto: in a notebook without ipywidgets its import alone warns

        yield from tqdm(iterable, total=total, desc=desc, unit=unit, delay=DELAY, dynamic_ncols=True, leave=False,
                        file=stream)
        return
    lines = PlainLines(total, desc, unit, stream, delay=DELAY, every=EVERY)
    try:
        for item in iterable:
            yield item
            lines.update()
    finally:
        lines.close()


@contextlib.contextmanager
def clear_of(bar):
    """Print lines while ``bar`` (from :func:`bar`, or None) is shown: a tqdm bar is cleared first and drawn again
    after, so a line never lands in the middle of it; plain progress lines need nothing."""
    write_mode = getattr(type(bar), "external_write_mode", None)
    if write_mode is None:
        yield
        return
    with write_mode():
        yield

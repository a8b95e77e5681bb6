"""Stopping a run on request: SIGINT (Ctrl-C) or SIGTERM (a scheduler, ``kill``) ends the run after the current
step, with a checkpoint of that step, instead of losing everything since the last one.

:func:`stop_requests` installs the handlers for the duration of a run (main thread only: elsewhere signals cannot
be caught and nothing changes). The first signal only sets :attr:`StopRequest.signum`; the loop checks it after
each step (every rank agrees through one all-reduce, :func:`attnkit.training.dist.any_rank`), writes the
checkpoint and raises :class:`TrainingInterrupted`, which the CLI prints as one line with the resume command
(exit status 128 + the signal's number, no traceback). A second signal while the checkpoint is written stops at
once (``KeyboardInterrupt``); the checkpoint being written is atomic, so the previous one stays intact.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from pathlib import Path

from attnkit.errors import AttnkitError

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class TrainingInterrupted(AttnkitError, RuntimeError):
    """A run stopped by SIGINT/SIGTERM after a step, with that step checkpointed; ``run_dir``, ``step``,
    ``checkpoint`` and ``signum`` say where (``attnkit train --resume RUN_DIR`` continues it)."""

    def __init__(self, message: str, *, run_dir: Path, step: int, checkpoint: Path | None, signum: int,
                 world: int = 1):
        super().__init__(message)
        self.run_dir, self.step, self.checkpoint, self.signum = run_dir, step, checkpoint, signum
        self.world = world  # the processes of the run: a resume starts as many


class StopRequest:
    """Set by the signal handlers: ``signum`` of the first signal received, else None."""

    def __init__(self):
        self.signum: int | None = None

    def __call__(self, signum, frame) -> None:
        if self.signum is not None:  # asked twice: stop now
            raise KeyboardInterrupt
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else "nothing"


@contextlib.contextmanager
def stop_requests():
    """Catch SIGINT and SIGTERM into a :class:`StopRequest` while the block runs; the previous handlers after."""
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request  # signals are delivered to the main thread only: nothing to install
        return
    previous = {sig: signal.signal(sig, request) for sig in SIGNALS}
    try:
        yield request
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

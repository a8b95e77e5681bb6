"""A sweep's workers: the loop that claims and trains trials until the plan is full, and the process it runs in.

:func:`work` is the loop of one worker (the sweep's own process with ``workers=1``). With ``workers=N`` the sweep
starts N processes (``python -m attnkit.sweep SWEEP_DIR``) that each run it: on Linux they are killed when
the sweep that started them dies (``PR_SET_PDEATHSIG``), and elsewhere they stop at their next step when it is gone.
The storage URL reaches them through the environment (:data:`STORAGE_ENV`), never through a file: it may hold a
password.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
from pathlib import Path

import torch

from attnkit.sweep import storage as stores
from attnkit.sweep.study import Context, all_done, next_trial
from attnkit.sweep.trial import run_trial

STORAGE_ENV = "ATTNKIT_SWEEP_STORAGE"
PARENT_ENV = "ATTNKIT_SWEEP_PARENT"
THREADS_ENV = "ATTNKIT_SWEEP_THREADS"


def work(ctx: Context, after=None) -> int:
    """Claim and train trials until every place of the plan is taken and finished; ``after(summary)`` after each.
    Returns the number of trials this worker trained. Waits (polling) while other workers' trials run: one of them
    may be interrupted and come back to the queue."""
    ran = 0
    study_id = ctx.storage.get_study_id_from_name(ctx.study.study_name)
    poll = min(2.0, float(ctx.config.heartbeat_s))
    while True:
        trial = next_trial(ctx)
        if trial is None:
            if all_done(ctx):
                return ran
            time.sleep(poll)
            continue
        tid = ctx.storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)
        with stores.heartbeat(ctx.storage, tid, ctx.config.heartbeat_s):
            summary = run_trial(ctx, trial)
        ran += summary["state"] != "INFEASIBLE"
        if after is not None:
            after(summary)


def die_with_parent() -> None:
    """Linux: this process gets SIGKILL when its parent dies (a kill -9 of the sweep takes its workers with it)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1


def main(argv: list[str] | None = None) -> int:
    """``python -m attnkit.sweep SWEEP_DIR``: one worker of the sweep in SWEEP_DIR (started by the sweep)."""
    from attnkit.sweep.run import open_context
    from attnkit.training.interrupt import TrainingInterrupted

    die_with_parent()
    folder = Path((argv or sys.argv[1:])[0])
    parent = int(os.environ.get(PARENT_ENV, "0")) or None
    torch.set_num_threads(int(os.environ.get(THREADS_ENV, "1")))
    ctx = open_context(folder, os.environ.get(STORAGE_ENV), log=lambda *a: print(*a, file=sys.stderr, flush=True))
    ctx.parent = parent
    try:
        work(ctx)  # silent: the sweep that started it prints a line per trial
    except TrainingInterrupted as exc:
        return 128 + exc.signum
    except KeyboardInterrupt:
        return 130
    return 0


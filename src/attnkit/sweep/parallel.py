"""``workers=N`` on one machine: N worker processes on one study, supervised by the sweep's process.

Each worker claims trials from the study (:mod:`attnkit.sweep.storage`: never the same one twice), trains with
``cpus / N`` threads and writes its run folders into the sweep folder. The supervisor prints a progress line per
finished trial, re-plans a time budget, and when a worker dies (killed, crashed) enqueues its running trial again at
once (its heartbeat would have, a little later), so the other workers take it over: resumed from its checkpoint.
If every worker is gone before the plan is done, the supervisor finishes it itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from optuna.trial import TrialState

from attnkit.sweep import storage as stores
from attnkit.sweep.config import check_workers
from attnkit.sweep.study import Context, all_done, own_running, summary_of
from attnkit.sweep.worker import PARENT_ENV, STORAGE_ENV, THREADS_ENV, work

#: exit statuses of a worker stopped on request (Ctrl-C, SIGTERM): the sweep stops too
STOPPED = {130, 143, -2, -15}


def start_workers(ctx: Context, url: str) -> list[subprocess.Popen]:
    threads = check_workers(ctx.config.workers)
    env = {**os.environ, STORAGE_ENV: url, PARENT_ENV: str(os.getpid()), THREADS_ENV: str(threads),
           "OMP_NUM_THREADS": str(threads)}
    return [subprocess.Popen([sys.executable, "-m", "attnkit.sweep", str(ctx.folder)], env=env)
            for _ in range(ctx.config.workers)]


def requeue_worker(ctx: Context, pid: int, status: int) -> list[int]:
    """Enqueue again the running trials of the worker ``pid`` that ended with ``status``."""
    numbers = []
    for trial in own_running(ctx):
        if str(trial.user_attrs.get("owner", "")).endswith(f":{pid}") and stores.requeue(
                ctx.study, ctx.storage, trial.number, f"its worker (pid {pid}) ended with status {status}"):
            numbers.append(trial.number)
    return numbers


def supervise(ctx: Context, url: str, after) -> None:
    """Run the workers to the end of the plan; ``after(summary)`` for each trial that finishes."""
    from attnkit.sweep.run import SweepInterrupted

    procs = start_workers(ctx, url)
    told = {t.number for t in ctx.study.get_trials(deepcopy=False) if t.state.is_finished()}
    stopped = False
    try:
        while procs:
            for p in [p for p in procs if p.poll() is not None]:
                procs.remove(p)
                stopped |= p.returncode in STOPPED
                if p.returncode != 0 and not stopped:
                    again = requeue_worker(ctx, p.pid, p.returncode)
                    ctx.log(f"sweep: worker {p.pid} ended with status {p.returncode}; its trials {again} are enqueued "
                            "again for the other workers (resumed from their checkpoints)")
            told = _tell_finished(ctx, told, after)
            if procs:
                time.sleep(0.5)
        _tell_finished(ctx, told, after)
    except KeyboardInterrupt:
        _wait(procs)
        raise SweepInterrupted("stopped by Ctrl-C: the workers checkpointed their trials, which are enqueued again",
                               ctx.folder, 2) from None
    if stopped:
        raise SweepInterrupted("a worker was stopped by a signal: its trial is enqueued again", ctx.folder, 15)
    if not all_done(ctx):  # every worker is gone: finish the plan here
        work(ctx, after=after)


def _tell_finished(ctx: Context, told: set[int], after) -> set[int]:
    """``after`` for each trial finished since the last look (an interrupted one is said by the requeue)."""
    for trial in ctx.study.get_trials(deepcopy=False):
        if trial.number in told or not trial.state.is_finished():
            continue
        if trial.state == TrialState.FAIL and not str(trial.user_attrs.get("outcome", "")).startswith("diverged"):
            continue
        told.add(trial.number)
        after(summary_of(trial))
    return told


def _wait(procs: list[subprocess.Popen], timeout_s: float = 120.0) -> None:
    """Wait for workers that were asked to stop (they checkpoint their step first); kill those that hang."""
    end = time.monotonic() + timeout_s
    for p in procs:
        try:
            p.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()

"""Shared set-up of the sweep tests: a small corpus, a small sweep, the CLI in a subprocess, the study read back."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from attnkit.sweep import SweepConfig

CORPUS = str(Path(sysconfig.get_paths()["stdlib"]) / "json")  # 5 small files on every machine
#: a sweep of trials of milliseconds per step: nano model, rows of 32 tokens
SMALL = {"preset": "nano", "data": CORPUS, "seq_len": 32, "batch_size": 4, "eval_batches": 2, "precision": "fp32",
         "trial_steps": 10, "trials": 4, "seeds": 2, "space": {"heads": [1, 2, 4], "window": ["none", 8]},
         "heartbeat_s": 1}
#: the same sweep on the command line (trials long enough to stop one mid-trial: see PLAN in the tests)
CLI_SMALL = ["--preset", "nano", "--data", CORPUS, "--seq-len", "32", "--batch-size", "4", "--precision", "fp32",
             "--space", "heads=1,2,4", "window=none,8"]


def small(run_dir, **changes) -> SweepConfig:
    return SweepConfig(run_dir=str(run_dir), **{**SMALL, **changes})


def quiet(*args, **kwargs):
    """A ``log`` that prints nothing."""


def sweep_cli(*args, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ATTNKIT_PROGRESS": "0"}
    return subprocess.Popen([sys.executable, "-m", "attnkit.cli.main", "sweep", *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, **kwargs)


def summary_trials(folder) -> list[dict]:
    import json

    return json.loads((Path(folder) / "summary.json").read_text())["trials"]


@functools.cache
def _storage(url: str):
    import optuna

    return optuna.storages.RDBStorage(url)


def load(folder, storage: str | None = None):
    """The sweep's study as stored (each call reads the storage again)."""
    import optuna

    from attnkit.sweep.folder import read_manifest
    from attnkit.sweep.storage import default_url

    manifest = read_manifest(folder)
    return optuna.load_study(study_name=manifest["study"], storage=_storage(storage or default_url(Path(folder))))


def wait_for(condition, timeout_s: float = 120.0, proc: subprocess.Popen | None = None, what: str = "") -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if condition():
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the sweep ended (status {proc.returncode}) before {what}: {proc.stderr.read()}")
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def running_with_checkpoint(folder, storage: str | None = None):
    """The first running trial whose run folder has a checkpoint (it is mid-trial), or None."""
    from optuna.trial import TrialState

    from attnkit.runs import list_checkpoints

    try:
        trials = load(folder, storage).get_trials(states=(TrialState.RUNNING,))
    except Exception:  # the study is not created yet
        return None
    for t in trials:
        run_dir = t.user_attrs.get("run_dir")
        if run_dir and list_checkpoints(Path(folder) / run_dir) and t.user_attrs.get("role") != "baseline":
            return t
    return None


def kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


def counted_finished(trials) -> list:
    from attnkit.sweep.study import finished

    return [t for t in trials if finished(t)]


def advisory_waiters(url: str) -> int:
    """How many sessions of the PostgreSQL server at ``url`` wait for an advisory lock (the sweep's claim lock)."""
    import sqlalchemy

    with _storage(url).engine.connect() as conn:
        return conn.execute(sqlalchemy.text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
                            ).scalar_one()

"""Where a sweep's study lives, and how several workers share it without running a trial twice or losing one.

The study is Optuna's, in its relational storage (:class:`optuna.storages.RDBStorage`): a SQLite file in the sweep
folder by default, or a server named by a URL (``postgresql://user@host/db``) that workers on any number of
machines open (Optuna's documented way to distribute a study). Every worker of a study:

- claims its next trial inside :func:`study_lock` (a file lock beside a SQLite file, a PostgreSQL advisory lock on a
  server): a retry waiting in the queue first, else a new trial while the plan has room. Trials are only ever
  created or claimed under the lock, so two workers never take the same trial and never overshoot the plan;
- records a heartbeat while its trial runs (:func:`heartbeat`); a trial whose heartbeat goes stale (its worker was
  killed, its machine lost) is failed by the next worker that claims (Optuna's ``fail_stale_trials``) and enqueued
  again with the same parameters and reported values (Optuna's ``RetryHeartbeatStaleTrialCallback``); a worker that
  knows a trial's process is gone (:func:`requeue`) does the same at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import threading
import warnings
import zlib
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import optuna
from optuna.trial import TrialState

from attnkit.errors import AttnkitValueError, EnvironmentUnsupportedError

SQLITE_FILE = "study.db"
#: Python modules of the database drivers SQLAlchemy uses for each URL scheme, and how to install them
DRIVERS = {"postgresql": ("psycopg", "pip install 'attnkit[postgres]' (psycopg 3)"),
           "postgresql+psycopg": ("psycopg", "pip install 'attnkit[postgres]' (psycopg 3)"),
           "postgresql+psycopg2": ("psycopg2", "pip install psycopg2-binary"),
           "sqlite": ("sqlite3", "a Python built with sqlite3")}


def default_url(folder: Path) -> str:
    return f"sqlite:///{(Path(folder) / SQLITE_FILE).resolve()}"


def masked(url: str) -> str:
    """``url`` with its password replaced by ``***`` (what messages, sweep.json and the summary show)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def scheme(url: str) -> str:
    return url.split("://", 1)[0].lower() if "://" in url else ""


def check_url(url: str) -> None:
    """A storage URL attnkit can share between workers (SQLite or PostgreSQL) whose driver is installed."""
    if not isinstance(url, str) or scheme(url) not in DRIVERS:
        raise AttnkitValueError(f"storage={masked(str(url))!r} is not a database URL attnkit can share between "
                                "workers; use sqlite:///PATH.db or postgresql://USER@HOST/DB (omit storage= for the "
                                "sweep folder's own SQLite file).")
    module, install = DRIVERS[scheme(url)]
    try:
        __import__(module)
    except ImportError:
        raise EnvironmentUnsupportedError(f"storage={masked(url)!r} needs the database driver {module!r}, which is "
                                          f"not installed: {install}.") from None


def open_storage(url: str, heartbeat_s: int = 10, grace_s: int | None = None) -> optuna.storages.RDBStorage:
    """The study storage at ``url`` with heartbeats every ``heartbeat_s`` seconds (a trial is stale after
    ``grace_s``, default 3 heartbeats) and stale trials enqueued again; an unreachable database is one typed line."""
    check_url(url)
    if scheme(url) == "sqlite":
        Path(url.split(":///", 1)[1]).parent.mkdir(parents=True, exist_ok=True)
        engine = {"connect_args": {"timeout": 60}}  # wait for another worker's write instead of failing
    else:
        engine = {"connect_args": {"connect_timeout": 10}, "pool_pre_ping": True}
    try:
        with quiet_optuna():
            retry = optuna.storages.RetryHeartbeatStaleTrialCallback(inherit_intermediate_values=True)
            return optuna.storages.RDBStorage(url, engine_kwargs=engine, heartbeat_interval=heartbeat_s,
                                              grace_period=grace_s or 3 * heartbeat_s,
                                              heartbeat_stale_trial_callback=retry)
    except Exception as exc:  # sqlalchemy's OperationalError and friends: the database can't be opened
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        raise EnvironmentUnsupportedError(f"storage={masked(url)!r} cannot be reached ({type(exc).__name__}: "
                                          f"{reason}); check the host, port, database and user, or omit storage= for "
                                          "the sweep folder's own SQLite file.") from None


@contextlib.contextmanager
def quiet_optuna():
    """Optuna's experimental-feature warnings and its per-trial log lines off (the sweep prints its own)."""
    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.filterwarnings("ignore", message=".*[Hh]eartbeat.*")
        warnings.filterwarnings("ignore", message=".*already reported.*")
        warnings.filterwarnings("ignore", message=".*have less than 2 trials.*")  # PED-ANOVA on a few trials
        try:
            yield
        finally:
            optuna.logging.set_verbosity(level)


@contextlib.contextmanager
def study_lock(storage, study_name: str):
    """Exclusive access to ``study_name`` for claiming and creating trials, across processes and machines."""
    url = storage.url
    if scheme(url) == "sqlite":
        path = Path(url.split(":///", 1)[1] + ".lock")
        with open(path, "a+b") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)
        return
    import sqlalchemy

    key = zlib.crc32(f"attnkit-sweep:{study_name}".encode())
    with storage.engine.connect() as conn:  # a session lock, released with the connection if the process dies
        conn.execute(sqlalchemy.text("SELECT pg_advisory_lock(:k)"), {"k": key})
        try:
            yield
        finally:
            conn.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:k)"), {"k": key})
            conn.commit()


def claim_waiting(study, storage) -> optuna.trial.Trial | None:
    """Take the oldest trial waiting in the queue (a retry), or None: WAITING -> RUNNING is atomic in the storage.
    Call it under :func:`study_lock`."""
    study_id = storage.get_study_id_from_name(study.study_name)
    for frozen in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        tid = storage.get_trial_id_from_study_id_trial_number(study_id, frozen.number)
        if storage.set_trial_state_values(tid, state=TrialState.RUNNING):
            storage.record_heartbeat(tid)
            return optuna.trial.Trial(study, tid)
    return None


def requeue(study, storage, number: int, reason: str) -> bool:
    """Fail the RUNNING trial ``number`` (its process is gone, or stopped on request), marked with ``reason``, and
    enqueue it again with its parameters and reported values; False when it is no longer running."""
    study_id = storage.get_study_id_from_name(study.study_name)
    tid = storage.get_trial_id_from_study_id_trial_number(study_id, number)
    with study_lock(storage, study.study_name), quiet_optuna():
        if storage.get_trial(tid).state != TrialState.RUNNING:
            return False
        storage.set_trial_user_attr(tid, "outcome", f"interrupted: {reason}")
        if not storage.set_trial_state_values(tid, state=TrialState.FAIL):
            return False
        retry = optuna.storages.RetryHeartbeatStaleTrialCallback(inherit_intermediate_values=True)
        retry(study, storage.get_trial(tid))
    return True


def frozen(study, storage, number: int):
    """The stored record (a FrozenTrial: its system attributes too) of trial ``number``."""
    study_id = storage.get_study_id_from_name(study.study_name)
    return storage.get_trial(storage.get_trial_id_from_study_id_trial_number(study_id, number))


def fail_stale(study) -> None:
    """Optuna's ``fail_stale_trials`` (each stale trial failed and enqueued again once); call it under the lock."""
    with quiet_optuna():
        optuna.storages.fail_stale_trials(study)


@contextlib.contextmanager
def heartbeat(storage, tid: int, every_s: float):
    """Record ``tid``'s heartbeat every ``every_s`` seconds while the block runs (a thread)."""
    stop = threading.Event()

    def beat():
        while not stop.wait(every_s):
            with contextlib.suppress(Exception):  # a missed beat is harmless; a stale trial is retried, not lost
                storage.record_heartbeat(tid)

    thread = threading.Thread(target=beat, name=f"attnkit-sweep-heartbeat-{tid}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()

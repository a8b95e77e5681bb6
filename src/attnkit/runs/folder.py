"""Run folders: one run at a time, nothing of an old run lost before the new one has something to show.

- :class:`RunFolder` takes an exclusive ``fcntl`` lock on ``RUN/.attnkit.lock`` for the whole run: a second run
  or a ``--resume`` on a folder that is still training is refused with :class:`RunInUseError`.
- A folder that holds a run (checkpoints, or a run stopped before its first one: its ``config.json`` or
  ``metrics.jsonl``) is refused unless ``overwrite``; so is a folder of other files. A folder that is not a run but
  holds a name a run writes (a Hugging Face model folder's ``config.json``) is refused even with ``overwrite``:
  only a run's own files are ever moved.
- ``overwrite`` moves what the trainer would replace aside into ``RUN/.replaced/`` and deletes it only once
  the new run has written its first checkpoint (:meth:`RunFolder.committed`); a failure before that restores
  it, and so does the next start if the process was killed.
- Temporary folders of interrupted checkpoint writes are removed once the lock is held.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import stat
from pathlib import Path

from attnkit.errors import AttnkitValueError, EnvironmentUnsupportedError
from attnkit.runs import read as reader
from attnkit.runs import write as ckpt
from attnkit.runs.read import ASIDE, CHECKPOINTS, LOSS_PLOT, METRICS, RUN_CONFIG, is_run_folder, open_regular
from attnkit.runs.tokens import TOKENIZER_DIR
from attnkit.runs.write import replacing, writing

LOCK = ".attnkit.lock"
MOVING = ".moving.json"  # in ASIDE: the names set_aside moves, written before it moves any
# what a run writes into its folder (a converted run also carries its model's tokenizer: a new run replaces it too)
OUTPUTS = (CHECKPOINTS, RUN_CONFIG, METRICS, LOSS_PLOT, TOKENIZER_DIR)


class RunInUseError(EnvironmentUnsupportedError):
    """Another process is training in this run folder."""


class RunFolderError(AttnkitValueError):
    """The run folder holds something a new run would destroy."""


class RunFolder:
    """The lock and the replace-only-after-success bookkeeping of one run folder (rank 0 only)."""

    def __init__(self, path: str | Path, *, log=print, option: str = "run_dir"):
        self.path, self.log, self._fd, self._aside = Path(path), log, None, None
        self.option = option  # the argument that named the folder (run_dir, out), for the messages

    # ---------------------------------------------------------------------------------------------- lock
    def acquire(self) -> RunFolder:
        """Create the folder if needed and take the exclusive lock (non-blocking: refuse when taken)."""
        import fcntl

        if self.path.exists() and not self.path.is_dir():
            raise RunFolderError(f"run_dir {str(self.path)!r} is a file, not a folder; pick another run_dir=.")
        with writing(self.path / LOCK):  # a read-only folder: a typed error naming it
            self.path.mkdir(parents=True, exist_ok=True)
            fd = self._open_lock()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise RunInUseError(f"run folder {str(self.path)!r} is in use by {holder} (it is still training); wait "
                                    "for it to finish or stop it, or pick another run_dir=.") from exc
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()}\n".encode())
        self._fd = fd
        self._recover()
        removed = ckpt.clean_temporary(self.path)
        if removed:
            self.log(f"removed {len(removed)} unfinished checkpoint write(s) left by a killed run: "
                     + ", ".join(p.name for p in removed))
        return self

    def _open_lock(self) -> int:
        """The lock file's descriptor: a regular file of the folder itself, never through a symlink (writing the
        pid would truncate the link's target) nor a FIFO or device."""
        path = self.path / LOCK
        refuse = (f"{str(path)!r} is not a regular file ({{}}); attnkit will not write through it. It only holds the "
                  "pid of the run that trains there: remove it and run again.")
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EISDIR):
                raise RunFolderError(refuse.format("a symlink" if exc.errno == errno.ELOOP else "a folder")) from exc
            raise
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise RunFolderError(refuse.format("a FIFO or a device"))
        return fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    # ---------------------------------------------------------------------------------------------- replace
    def check_fresh(self, overwrite: bool) -> None:
        """Refuse to start a new run where it would destroy something, unless ``overwrite``."""
        if not self.path.is_dir():
            return  # nothing there yet (acquire refuses a file)
        if reader.list_checkpoints(self.path):
            if not overwrite:
                resume = f"continue it with resume={str(self.path)!r}, " if self.option == "run_dir" else ""
                raise RunFolderError(
                    f"{self.option}={str(self.path)!r} already holds checkpoints; {resume}pick another {self.option}=, "
                    "or pass overwrite=True to replace it (the old run is kept until the new one has written its first "
                    "checkpoint).")
            return
        others = sorted(p.name for p in self.path.iterdir() if p.name not in (LOCK, ASIDE))
        if not others:
            return
        if is_run_folder(self.path) or METRICS in others:  # a run stopped before its first checkpoint is a run
            if overwrite:
                return
            raise RunFolderError(
                f"{self.option}={str(self.path)!r} holds a run that has no checkpoint (its "
                f"{', '.join(n for n in OUTPUTS if n in others)}: it was stopped before its first checkpoint); pick "
                f"another {self.option}=, or pass overwrite=True to replace it.")
        foreign = [n for n in OUTPUTS if n in others]
        if foreign:  # a Hugging Face model folder (config.json, tokenizer/): never moved, even with --overwrite
            raise RunFolderError(
                f"{self.option}={str(self.path)!r} is not an attnkit run and holds {foreign} (it holds {others[:5]}: a "
                f"Hugging Face model folder, or another program's files) that a run would replace; overwrite=True replaces "
                f"only an attnkit run's files: pick an empty or new {self.option}=.")
        if not overwrite:
            raise RunFolderError(
                f"{self.option}={str(self.path)!r} is not empty and is not an attnkit run (it holds {others[:5]}); a "
                f"new run would mix its files in: pick an empty or new {self.option}=, or pass overwrite=True.")

    def set_aside(self) -> None:
        """Move the outputs an old run left into ``.replaced/`` (restored if the new run fails early)."""
        present = [n for n in OUTPUTS if (self.path / n).exists() or (self.path / n).is_symlink()]
        if not present:
            return
        aside = self.path / ASIDE
        aside.mkdir()
        with replacing(aside / MOVING) as f:  # before any move: a restore after a kill knows what was the old run's
            f.write(json.dumps(present).encode())
        for name in present:
            os.replace(self.path / name, aside / name)
        self._aside = aside
        self.log(f"replacing the previous run: its {', '.join(present)} moved to {aside} until the new run's first "
                 "checkpoint")

    def committed(self) -> None:
        """The new run has a checkpoint: the replaced run can go."""
        if self._aside is not None:
            shutil.rmtree(self._aside, ignore_errors=True)
            self._aside = None

    def abandon(self) -> None:
        """The new run failed before its first checkpoint: put the replaced run back."""
        if self._aside is None:
            return
        self._restore(self._aside)
        self._aside = None
        self.log(f"the previous run in {self.path} was restored (the new run failed before its first checkpoint)")

    def _restore(self, aside: Path) -> None:
        """Put the old run back from ``aside``. Only a name found there replaces what is in the folder: a kill in
        the middle of :meth:`set_aside` left the old run's other files in place. A name the old run did not have
        (not in the list set_aside wrote first) is the new run's and goes."""
        moved = {item.name for item in aside.iterdir() if not item.name.startswith((MOVING, f".{MOVING}.tmp-"))}
        try:
            with open_regular(aside / MOVING) as f:
                listed = set(json.loads(f.read(1 << 16)))
        except (OSError, ValueError, TypeError):
            listed = None  # a kill before the list was written, or an older attnkit: remove nothing more
        new_only = set() if listed is None else {n for n in OUTPUTS if n not in listed}
        for name in sorted(moved | new_only):
            target = self.path / name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            elif target.exists() or target.is_symlink():
                target.unlink()
        for name in sorted(moved):
            os.replace(aside / name, self.path / name)
        with contextlib.suppress(FileNotFoundError):
            (aside / MOVING).unlink()
        aside.rmdir()

    def _recover(self) -> None:
        """A killed ``--overwrite`` run left ``.replaced/``: keep the new run if it checkpointed, else restore."""
        aside = self.path / ASIDE
        if not aside.is_dir():
            return
        if reader.list_checkpoints(self.path):
            shutil.rmtree(aside, ignore_errors=True)
        else:
            self._restore(aside)
            self.log(f"restored the run that an interrupted replacement had set aside in {aside}")

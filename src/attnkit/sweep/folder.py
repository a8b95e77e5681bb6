"""The sweep folder: one sweep at a time (the run folder's lock), and the same refusals as ``attnkit train``.

A folder that holds a sweep is refused unless ``overwrite``; then the old sweep's files move into
``SWEEP/.replaced-sweep/`` and are deleted once the new sweep has a finished trial (a kill before that puts the old
sweep back at the next start, as a run's ``--overwrite`` does). Any other folder is judged by the run folder's own
rules (:meth:`attnkit.runs.folder.RunFolder.check_fresh`): a training run is refused unless ``overwrite`` (and then
set aside the same way), a Hugging Face model folder is refused even then, other files unless ``overwrite``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from attnkit.runs.folder import RunFolder, RunFolderError
from attnkit.runs.write import replacing

MANIFEST = "sweep.json"
FORMAT = "attnkit-sweep-1"
ASIDE = ".replaced-sweep"
#: what a sweep writes into its folder (a name starting with one of these is the sweep's)
OUTPUTS = (MANIFEST, "study.db", "trials", "logs", "verdict", "calibration", "summary.md", "summary.json",
           "sweep.png", "verdict.json")


def read_manifest(folder: Path) -> dict | None:
    """The sweep record of ``folder`` (None when it holds no sweep)."""
    try:
        record = json.loads((Path(folder) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("format") == FORMAT else None


def write_manifest(folder: Path, record: dict) -> None:
    with replacing(Path(folder) / MANIFEST) as f:
        f.write(json.dumps({"format": FORMAT, **record}, indent=1).encode())


def _ours(name: str) -> bool:
    return name.startswith(OUTPUTS)


class SweepFolder:
    """The lock of a sweep folder (held for the whole sweep) and its replace-only-after-a-finished-trial rule."""

    def __init__(self, path: str | Path, log=print):
        self.path, self.log = Path(path), log
        self.lock = RunFolder(self.path, log=log)
        self.run_aside = False

    def acquire(self) -> SweepFolder:
        self.lock.acquire()
        aside = self.path / ASIDE
        if aside.is_dir() and not self.has_finished_trial():
            self._restore(aside)
        elif aside.is_dir():
            shutil.rmtree(aside, ignore_errors=True)
        return self

    def release(self) -> None:
        self.lock.release()

    def has_finished_trial(self) -> bool:
        record = read_manifest(self.path)
        return bool(record and record.get("finished_trial"))

    def check_fresh(self, overwrite: bool) -> None:
        """Refuse to start a new sweep where it would destroy something (see the module docstring)."""
        if not self.path.is_dir():
            return
        record = read_manifest(self.path)
        if record is not None:
            if not overwrite:
                raise RunFolderError(
                    f"run_dir={str(self.path)!r} already holds a sweep (study {record.get('study')!r}); continue it "
                    f"with resume={str(self.path)!r}, pick another run_dir=, or pass overwrite=True to replace it (the "
                    "old sweep is kept until the new one has a finished trial).")
            return
        self.lock.check_fresh(overwrite)

    def set_aside(self) -> None:
        """``overwrite``: move an old sweep's files (or a training run's) aside until the new sweep's first trial."""
        present = [p.name for p in self.path.iterdir() if _ours(p.name)] if self.path.is_dir() else []
        if read_manifest(self.path) is None:
            self.lock.set_aside()  # a training run's outputs, by the run folder's own rule
            self.run_aside = True
            return
        aside = self.path / ASIDE
        aside.mkdir()
        for name in present:
            os.replace(self.path / name, aside / name)
        self.log(f"replacing the previous sweep: its {', '.join(sorted(present))} moved to {aside} until the new "
                 "sweep's first finished trial")

    def committed(self) -> None:
        """The new sweep has a finished trial: what it replaced can go."""
        shutil.rmtree(self.path / ASIDE, ignore_errors=True)
        if self.run_aside:
            self.lock.committed()
            self.run_aside = False

    def _restore(self, aside: Path) -> None:
        for entry in self.path.iterdir():
            if _ours(entry.name):
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
        for entry in aside.iterdir():
            os.replace(entry, self.path / entry.name)
        aside.rmdir()
        self.log(f"restored the sweep that an interrupted replacement had set aside in {aside}")

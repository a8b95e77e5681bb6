"""Checkpoints that lose nothing and trust nothing: safetensors + JSON, written atomically, verified on load.

A checkpoint is a folder ``RUN/checkpoints/step_00000100/``:

- ``model.safetensors``: the weights (tied weights stored once, restored tied);
- ``optim.safetensors``: every optimizer state tensor (``state.<param index>.<name>``) and the torch RNG
  states (``rng.torch``, ``rng.cuda.<i>``, per rank ``rng.torch.rank<r>`` under torch.distributed);
- ``state.json``: the manifest: step, the run's identity (``run_id``), data position, model and training
  config, optimizer param groups and non-tensor state, Python/NumPy RNG states, the SHA-256 of both tensor
  files and ``manifest_sha256``, the hash of the manifest itself. It is written last, in a canonical form
  (sorted keys, fixed indent), so any change to its bytes is detected.

Writing: everything goes to a temporary sibling folder, each file is fsync'ed, the folder is renamed to its
final name (atomic on POSIX) and the parent is fsync'ed; only then are checkpoints beyond ``keep`` removed, so a
crash at any moment leaves the previous checkpoint intact. Temporary folders a kill left behind are removed by
the next run that holds the run folder's lock (:func:`clean_temporary`).

Reading lives in :mod:`attnkit.runs.read` (the doctor, the report and ``generate`` read runs without the
trainer): only the checkpoint's own regular files under fixed names are opened, and the manifest and
both file hashes are verified before any tensor is read; pickles (``torch.load``) are never used. This module
writes with that module's format constants and :func:`~attnkit.runs.read.manifest_bytes`, and restores what only
training needs (optimizer state, RNG states: :func:`load_checkpoint`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load, save_file, save_model

from attnkit.errors import EnvironmentUnsupportedError
from attnkit.runs.read import (
    CHECKPOINTS,
    FILES,
    FORMAT,
    MANIFEST,
    list_checkpoints,
    load_verified_weights,
    manifest_bytes,
    read_verified,
    sha256_file,
)

# ------------------------------------------------------------------------------------------------ write


class WriteFailed(EnvironmentUnsupportedError):
    """A file could not be written (disk full, file too large, read-only folder): nothing half-written was left."""


#: what to do about an OS error that stops a write, by errno
WRITE_FIXES = {errno.ENOSPC: "free space on that disk or write somewhere else",
               errno.EDQUOT: "free space within your disk quota or write somewhere else",
               errno.EFBIG: "the file is larger than this system allows (ulimit -f, or the file system's limit): raise "
                            "the limit or write somewhere else",
               errno.EROFS: "that file system is read-only: write somewhere else",
               errno.EACCES: "you may not write there: fix the folder's permissions or write somewhere else",
               errno.EPERM: "you may not write there: fix the folder's permissions or write somewhere else"}


def write_failed(path: str | Path, exc: BaseException, *, atomic: bool = True) -> WriteFailed | None:
    """The :class:`WriteFailed` an OS error that stopped writing ``path`` means (None for another kind of error);
    ``atomic``: the writer removed what it had written (the message says so).
    safetensors reports the OS error inside its own exception (``... (os error 27)``): read from there too."""
    code = exc.errno if isinstance(exc, OSError) else None
    if code is None and type(exc).__name__ == "SafetensorError":
        found = re.search(r"(?:code: |os error )(\d+)", str(exc))
        code = int(found.group(1)) if found else None
    if code not in WRITE_FIXES:
        return None
    return WriteFailed(f"could not write {str(path)!r}: {os.strerror(code)} ({errno.errorcode[code]}); "
                       f"{WRITE_FIXES[code]}." + (" Nothing half-written was left behind." if atomic else ""))


@contextlib.contextmanager
def writing(path: str | Path):
    """Turn an OS error of the block that writes ``path`` into :class:`WriteFailed` (see :data:`WRITE_FIXES`)."""
    try:
        yield
    except Exception as exc:
        failed = write_failed(path, exc)
        if failed is None:
            raise
        raise failed from exc


@contextlib.contextmanager
def replacing(path: str | Path):
    """Write the file ``path`` through a temporary file in its folder, renamed over ``path`` once complete: a symlink
    (or hard link) at ``path`` is replaced, never written through, and a kill leaves the old file or the new one.

    >>> with replacing(run / "config.json") as f:  # doctest: +SKIP
    ...     f.write(b"{}")
    """
    path = Path(path)
    with writing(path):
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        with writing(path):
            os.fchmod(fd, mode(folder=False))
            with os.fdopen(fd, "wb") as f:
                yield f
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def save_checkpoint(run_dir: str | Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                    state: dict, *, keep: int = 2, extra_tensors: dict[str, torch.Tensor] | None = None) -> Path:
    """Write checkpoint ``step`` atomically under ``run_dir/checkpoints`` and keep the newest ``keep``."""
    root = Path(run_dir) / CHECKPOINTS
    final = checkpoint_dir(run_dir, step)
    with writing(final):
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-step_{step:08d}-", dir=root))
    try:
        with writing(final):
            _write_checkpoint(tmp, final, root, step, model, optimizer, state, extra_tensors)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in list_checkpoints(run_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def checkpoint_dir(run_dir: str | Path, step: int) -> Path:
    """Where :func:`save_checkpoint` writes the checkpoint of ``step``: ``RUN/checkpoints/step_NNNNNNNN``."""
    return Path(run_dir) / CHECKPOINTS / f"step_{step:08d}"


def mode(*, folder: bool) -> int:
    """The permission bits of everything a run writes: what a plain ``mkdir`` / ``open`` gives under this process's
    umask (0755 / 0644 under the usual 022), so a checkpoint is as readable as the run folder it sits in."""
    mask = os.umask(0)  # read it back: os.umask can only be read by setting it
    os.umask(mask)
    return (0o777 if folder else 0o666) & ~mask


def _write_checkpoint(tmp: Path, final: Path, root: Path, step: int, model, optimizer, state: dict,
                      extra_tensors) -> None:
    """Every file of checkpoint ``step`` into the folder ``tmp``, fsync'ed, then renamed to ``final``."""
    save_model(model, str(tmp / "model.safetensors"))
    tensors, opt_json = _optimizer_to_flat(optimizer)
    tensors.update(_rng_tensors())
    tensors.update(extra_tensors or {})
    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(tmp / "optim.safetensors"))
    record = {**state, "format": FORMAT, "step": step, "optimizer": opt_json, "rng": _rng_json(),
              "sha256": {name: sha256_file(tmp / name) for name in FILES}}
    (tmp / MANIFEST).write_bytes(manifest_bytes(record))
    for name in (*FILES, MANIFEST):
        os.chmod(tmp / name, mode(folder=False))  # as the run folder's other files (mkstemp's would be 0600)
        _fsync(tmp / name)
    os.chmod(tmp, mode(folder=True))  # as the run folder itself (mkdtemp's would be 0700)
    _fsync(tmp)
    if final.exists():  # re-saving the same step (e.g. after a resume): replace it atomically
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync(root)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _optimizer_to_flat(optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    if optimizer is None:
        return {}, {}
    sd = optimizer.state_dict()
    tensors, scalars = {}, {}
    for index, entries in sd["state"].items():
        for name, value in entries.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state.{index}.{name}"] = value
            else:
                scalars[f"{index}.{name}"] = value
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def _rng_tensors() -> dict[str, torch.Tensor]:
    out = {"rng.torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            out[f"rng.cuda.{i}"] = s
    return out


def _rng_json() -> dict:
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {"python": [version, list(internal), gauss],
            "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)]}


# ------------------------------------------------------------------------------------------------ resume


def clean_temporary(run_dir: str | Path) -> list[Path]:
    """Remove the ``.tmp-step_*`` folders of interrupted checkpoint writes; return what was removed.
    Call it only while holding the run folder's lock (a live writer's folder would go too)."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    removed = [p for p in root.iterdir() if p.name.startswith(".tmp-step_") and p.is_dir() and not p.is_symlink()]
    for p in removed:
        shutil.rmtree(p, ignore_errors=True)
    return removed


def load_checkpoint(ckpt: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, *,
                    restore_rng: bool = True, rank: int = 0) -> tuple[dict, dict[str, torch.Tensor]]:
    """Verify and load weights, optimizer state and RNG states; return (state record, all optim-file tensors)."""
    state, data = read_verified(ckpt, keep=FILES)  # each file read once: what is loaded is what was hashed
    load_verified_weights(ckpt, model, data[FILES[0]])
    tensors = load(data[FILES[1]])
    if optimizer is not None:
        opt = state["optimizer"]
        per_param: dict[int, dict] = {}
        for key, value in tensors.items():
            if key.startswith("state."):
                _, index, name = key.split(".", 2)
                per_param.setdefault(int(index), {})[name] = value
        for key, value in opt["scalars"].items():
            index, name = key.split(".", 1)
            per_param.setdefault(int(index), {})[name] = value
        optimizer.load_state_dict({"state": per_param, "param_groups": opt["param_groups"]})
    if restore_rng:
        torch.set_rng_state(tensors.get(f"rng.torch.rank{rank}", tensors["rng.torch"]))
        cuda = [tensors[k] for k in sorted(k for k in tensors if k.startswith("rng.cuda."))]
        if cuda and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(cuda)
        version, internal, gauss = state["rng"]["python"]
        random.setstate((version, tuple(internal), gauss))
        kind, keys, pos, has_gauss, cached = state["rng"]["numpy"]
        np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    return state, tensors

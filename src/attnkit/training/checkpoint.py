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

Loading trusts nothing: only the checkpoint's own regular files under the fixed names ``state.json``,
``model.safetensors`` and ``optim.safetensors`` are opened (no symlinks, no devices, no names taken from the
manifest); the manifest's own hash, its canonical bytes, the fixed file set, the step against the folder name,
and the run identity against the run folder's ``config.json`` are verified, then both file hashes, before any
tensor is read. Pickles (``torch.load``) are never used.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import stat
import tempfile
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, load_model, save_file, save_model

from attnkit.errors import AttnkitValueError

FORMAT = "attnkit-checkpoint-2"
FILES = ("model.safetensors", "optim.safetensors")  # the hashed tensor files, by fixed name
MANIFEST = "state.json"
_MAX_MANIFEST_BYTES = 64 << 20
_STEP_DIR = re.compile(r"^step_(\d{8})$")


class CheckpointError(AttnkitValueError):
    """A checkpoint is missing, truncated or corrupt (the message names the file and what to do)."""


# ------------------------------------------------------------------------------------------------ write


def save_checkpoint(run_dir: str | Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                    state: dict, *, keep: int = 2, extra_tensors: dict[str, torch.Tensor] | None = None) -> Path:
    """Write checkpoint ``step`` atomically under ``run_dir/checkpoints`` and keep the newest ``keep``."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:08d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-step_{step:08d}-", dir=root))
    try:
        save_model(model, str(tmp / "model.safetensors"))
        tensors, opt_json = _optimizer_to_flat(optimizer)
        tensors.update(_rng_tensors())
        tensors.update(extra_tensors or {})
        save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(tmp / "optim.safetensors"))
        record = {**state, "format": FORMAT, "step": step, "optimizer": opt_json, "rng": _rng_json(),
                  "sha256": {name: _sha256(tmp / name) for name in FILES}}
        (tmp / MANIFEST).write_bytes(manifest_bytes(record))
        for name in (*FILES, MANIFEST):
            _fsync(tmp / name)
        _fsync(tmp)
        if final.exists():  # re-saving the same step (e.g. after a resume): replace it atomically
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in list_checkpoints(run_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _canonical(record: dict) -> bytes:
    return json.dumps(record, indent=1, sort_keys=True, allow_nan=True).encode() + b"\n"


def manifest_bytes(record: dict) -> bytes:
    """The canonical bytes of a manifest, with ``manifest_sha256`` = SHA-256 of the canonical record without it."""
    body = {k: v for k, v in record.items() if k != "manifest_sha256"}
    body = json.loads(_canonical(body))  # tuples -> lists, so what is hashed is what a reader parses
    return _canonical({**body, "manifest_sha256": hashlib.sha256(_canonical(body)).hexdigest()})


def _open_regular(path: Path):
    """Open ``path`` for reading only if it is a regular file (no symlink, device, FIFO or folder)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise IsADirectoryError(f"{path} is not a regular file")
    return os.fdopen(fd, "rb")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with _open_regular(path) as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


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


# ------------------------------------------------------------------------------------------------ read


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Finished checkpoint folders of a run, oldest first (temporary folders of interrupted writes ignored)."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if _STEP_DIR.match(p.name) and p.is_dir() and not p.is_symlink()),
                  key=lambda p: p.name)


def resolve(path: str | Path) -> Path:
    """A checkpoint folder from a checkpoint folder or a run folder (its newest checkpoint)."""
    path = Path(path)
    if (path / "state.json").exists() or _STEP_DIR.match(path.name):
        return path
    found = list_checkpoints(path)
    if not found:
        raise CheckpointError(f"no checkpoint found in {str(path)!r}: expected a run folder with checkpoints/step_* "
                              "or a checkpoint folder; train with `attnkit train --run-dir DIR` first.")
    return found[-1]


def read_state(ckpt: str | Path) -> dict:
    """Verify checkpoint ``ckpt`` and return its manifest (see the module docstring for what is checked)."""
    ckpt = Path(ckpt)
    previous = [p for p in list_checkpoints(ckpt.parent.parent) if p.name < ckpt.name]
    hint = (f"the previous checkpoint {previous[-1]} is intact: resume from it with --resume {previous[-1]}, or "
            "delete the damaged folder." if previous else "no earlier checkpoint exists; restart the run.")

    def fail(problem: str, exc: Exception | None = None):
        raise CheckpointError(f"checkpoint {str(ckpt)!r}: {problem}; {hint}") from exc

    folder = _STEP_DIR.match(ckpt.name)
    if folder is None:
        raise CheckpointError(f"{str(ckpt)!r} is not a checkpoint folder: checkpoint folders are named step_NNNNNNNN "
                              "(8 digits, the step); pass a run folder or one of its checkpoints/step_* folders.")
    try:
        with _open_regular(ckpt / MANIFEST) as f:
            raw = f.read(_MAX_MANIFEST_BYTES + 1)
    except FileNotFoundError as exc:
        fail(f"has no {MANIFEST} (incomplete or not a checkpoint)", exc)
    except OSError as exc:
        fail(f"{MANIFEST} is not a regular file ({exc})", exc)
    if len(raw) > _MAX_MANIFEST_BYTES:
        fail(f"{MANIFEST} is larger than {_MAX_MANIFEST_BYTES} bytes (not a manifest attnkit wrote)")
    try:
        state = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        fail(f"{MANIFEST} is truncated or corrupt ({exc})", exc)
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        found = state.get("format") if isinstance(state, dict) else type(state).__name__
        fail(f"{MANIFEST} is not an {FORMAT} record (format {found!r})")
    if not isinstance(state.get("manifest_sha256"), str) or manifest_bytes(state) != raw:
        fail(f"{MANIFEST} is corrupt: its contents do not match its own manifest_sha256")
    if not isinstance(state.get("sha256"), dict) or sorted(state["sha256"]) != sorted(FILES):
        fail(f"{MANIFEST} must record the SHA-256 of exactly {list(FILES)}, it records {sorted(state.get('sha256') or [])}")
    if state.get("step") != int(folder.group(1)) or isinstance(state.get("step"), bool):
        fail(f"{MANIFEST} records step {state.get('step')!r} but the folder is {ckpt.name} (step {int(folder.group(1))})")
    _check_run_identity(ckpt, state, fail)
    for name in FILES:
        try:
            got = _sha256(ckpt / name)
        except FileNotFoundError as exc:
            fail(f"is missing {name}", exc)
        except OSError as exc:
            fail(f"{name} is not a regular file ({exc})", exc)
        if got != state["sha256"][name]:
            fail(f"{name} is corrupt or truncated (sha256 {got[:12]}... != recorded {str(state['sha256'][name])[:12]}...)")
    return state


def run_identity(run_dir: str | Path) -> str | None:
    """The ``run_id`` the trainer wrote into ``run_dir/config.json`` (None when there is none)."""
    path = Path(run_dir) / "config.json"
    try:
        with _open_regular(path) as f:
            config = json.loads(f.read(_MAX_MANIFEST_BYTES))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return config.get("run_id") if isinstance(config, dict) else None


def _check_run_identity(ckpt: Path, state: dict, fail) -> None:
    """A checkpoint inside ``RUN/checkpoints/`` must belong to RUN (the run_id in RUN/config.json)."""
    if ckpt.parent.name != "checkpoints":
        return
    expected = run_identity(ckpt.parent.parent)
    if expected is not None and state.get("run_id") != expected:
        fail(f"belongs to another run (run_id {state.get('run_id')!r}, this run folder is {expected!r}); a "
             "checkpoint copied in from elsewhere is never adopted - start a new run from it with --init-from")


def clean_temporary(run_dir: str | Path) -> list[Path]:
    """Remove the ``.tmp-step_*`` folders of interrupted checkpoint writes; return what was removed.
    Call it only while holding the run folder's lock (a live writer's folder would go too)."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    removed = [p for p in root.iterdir() if p.name.startswith(".tmp-step_") and p.is_dir() and not p.is_symlink()]
    for p in removed:
        shutil.rmtree(p, ignore_errors=True)
    return removed


def load_weights(ckpt: str | Path, model: torch.nn.Module) -> dict:
    """Verify ``ckpt`` and load its weights into ``model`` (strict); return the state record."""
    state = read_state(ckpt)
    _check_shapes(Path(ckpt) / "model.safetensors", model, ckpt)
    missing, unexpected = load_model(model, str(Path(ckpt) / "model.safetensors"), strict=False)
    if missing or unexpected:
        raise CheckpointError(f"checkpoint {str(ckpt)!r} does not match the model: missing {sorted(missing)[:5]}, "
                              f"unexpected {sorted(unexpected)[:5]}; build the model from the checkpoint's config.")
    return state


def _check_shapes(path: Path, model: torch.nn.Module, ckpt) -> None:
    """Every stored tensor has the shape of the model's parameter of that name (else a typed error naming both)."""
    from safetensors import safe_open

    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    with safe_open(str(path), framework="pt") as f:
        for name in sorted(f.keys()):
            stored = tuple(f.get_slice(name).get_shape())
            if name in expected and expected[name] != stored:
                raise CheckpointError(
                    f"checkpoint {str(ckpt)!r} does not fit the model: {name} is {stored} in the checkpoint but "
                    f"{expected[name]} in the model built from the config; build the model from the checkpoint's own "
                    "model_config (attnkit.training.load_model does).")


def load_checkpoint(ckpt: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, *,
                    restore_rng: bool = True, rank: int = 0) -> tuple[dict, dict[str, torch.Tensor]]:
    """Verify and load weights, optimizer state and RNG states; return (state record, all optim-file tensors)."""
    state = load_weights(ckpt, model)
    tensors = load_file(str(Path(ckpt) / "optim.safetensors"))
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

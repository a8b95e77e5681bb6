"""Checkpoints that lose nothing and trust nothing: safetensors + JSON, written atomically, verified on load.

A checkpoint is a folder ``RUN/checkpoints/step_00000100/``:

- ``model.safetensors``: the weights (tied weights stored once, restored tied);
- ``optim.safetensors``: every optimizer state tensor (``state.<param index>.<name>``) and the torch RNG
  states (``rng.torch``, ``rng.cuda.<i>``, per rank ``rng.torch.rank<r>`` under torch.distributed);
- ``state.json``: step, data position, model and training config, optimizer param groups and non-tensor state,
  Python/NumPy RNG states, and the SHA-256 of both tensor files. It is written last.

Writing: everything goes to a temporary sibling folder, each file is fsync'ed, the folder is renamed to its
final name (atomic on POSIX) and the parent is fsync'ed; only then are checkpoints beyond ``keep`` removed, so a
crash at any moment leaves the previous checkpoint intact. Loading checks ``state.json`` parses and both hashes
match before any tensor is read; pickles (``torch.load``) are never used.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, load_model, save_file, save_model

from attnkit.errors import AttnkitValueError

FORMAT = "attnkit-checkpoint-1"
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
        record = {"format": FORMAT, "step": step, **state, "optimizer": opt_json, "rng": _rng_json(),
                  "sha256": {name: _sha256(tmp / name) for name in ("model.safetensors", "optim.safetensors")}}
        (tmp / "state.json").write_text(json.dumps(record, indent=1))
        for name in ("model.safetensors", "optim.safetensors", "state.json"):
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


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
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
    return sorted((p for p in root.iterdir() if p.is_dir() and _STEP_DIR.match(p.name)), key=lambda p: p.name)


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
    """Verify checkpoint ``ckpt`` (state.json parses, both SHA-256 match) and return its state."""
    ckpt = Path(ckpt)
    previous = [p for p in list_checkpoints(ckpt.parent.parent) if p.name < ckpt.name]
    hint = (f"the previous checkpoint {previous[-1]} is intact: resume from it with --resume {previous[-1]}, or "
            "delete the damaged folder." if previous else "no earlier checkpoint exists; restart the run.")
    try:
        state = json.loads((ckpt / "state.json").read_text())
    except FileNotFoundError as exc:
        raise CheckpointError(f"checkpoint {str(ckpt)!r} has no state.json (incomplete or not a checkpoint); {hint}") \
            from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"checkpoint {str(ckpt)!r}: state.json is truncated or corrupt ({exc}); {hint}") from exc
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {str(ckpt)!r}: state.json is not an {FORMAT} record; {hint}")
    for name, expected in state["sha256"].items():
        if not (ckpt / name).exists():
            raise CheckpointError(f"checkpoint {str(ckpt)!r} is missing {name}; {hint}")
        got = _sha256(ckpt / name)
        if got != expected:
            raise CheckpointError(f"checkpoint {str(ckpt)!r}: {name} is corrupt or truncated (sha256 {got[:12]}... "
                                  f"!= recorded {expected[:12]}...); {hint}")
    return state


def load_weights(ckpt: str | Path, model: torch.nn.Module) -> dict:
    """Verify ``ckpt`` and load its weights into ``model`` (strict); return the state record."""
    state = read_state(ckpt)
    missing, unexpected = load_model(model, str(Path(ckpt) / "model.safetensors"), strict=False)
    if missing or unexpected:
        raise CheckpointError(f"checkpoint {str(ckpt)!r} does not match the model: missing {sorted(missing)[:5]}, "
                              f"unexpected {sorted(unexpected)[:5]}; build the model from the checkpoint's config.")
    return state


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

"""A run folder read back, trusting nothing: the verified checkpoint, the model it holds, its tokens, its metrics.

The trainer (``attnkit.training``) and ``attnkit convert`` write run folders (:mod:`attnkit.runs.write`,
:mod:`attnkit.runs.convert`); everything that only reads one (``attnkit doctor``, ``report``, ``generate``, a resume)
reads it through this module, so the doctor and the report need nothing of the training code. A run folder::

    RUN/config.json                      the trainer's settings and the run's identity (``run_id``)
    RUN/metrics.jsonl                    one JSON record per step (:func:`read_metrics`)
    RUN/checkpoints/step_NNNNNNNN/       state.json (the manifest), model.safetensors, optim.safetensors
    RUN/loss.png, RUN/tokenizer/         the loss plot; a converted run's tokenizer (:mod:`attnkit.runs.tokens`)

Reading a checkpoint (:func:`read_state`): only the checkpoint's own regular files under the fixed names
``state.json``, ``model.safetensors`` and ``optim.safetensors`` are opened (``O_NOFOLLOW``: no symlinks, no
devices, no FIFOs, no names taken from the manifest); the manifest's own hash, its canonical bytes, the fixed
file set, the step against the folder name and the run identity (against the run folder's ``config.json``, or
without one, against the folder's other checkpoints) are verified, then both file hashes, before any tensor is read;
each tensor file is read once, so the bytes loaded are the bytes hashed. Pickles (``torch.load``) are never used. The
writer (:func:`attnkit.runs.write.save_checkpoint`) uses this module's format constants and
:func:`manifest_bytes`, so what is written is what is verified.

>>> from attnkit.runs import load_model
>>> model = load_model("runs/demo")          # its newest checkpoint, verified, in eval mode  # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from attnkit.errors import AttnkitValueError
from attnkit.models.config import LMConfig
from attnkit.models.lm import TransformerLM

FORMAT = "attnkit-checkpoint-2"
FILES = ("model.safetensors", "optim.safetensors")  # the hashed tensor files, by fixed name
MANIFEST = "state.json"
RUN_CONFIG = "config.json"
METRICS = "metrics.jsonl"
LOSS_PLOT = "loss.png"
CHECKPOINTS = "checkpoints"
ASIDE = ".replaced"  # where ``--overwrite`` keeps the run it replaces until the new run's first checkpoint
MAX_MANIFEST_BYTES = 64 << 20
READ_RETRIES = 3  # a run folder read while it trains: its newest checkpoint again, when the one read was pruned
STEP_DIR = re.compile(r"^step_(\d{8})$")


class CheckpointError(AttnkitValueError):
    """A checkpoint is missing, truncated or corrupt (the message names the file and what to do)."""


class CheckpointGone(CheckpointError):
    """A healthy checkpoint was removed while it was read (the run that trains there pruned it)."""


# ------------------------------------------------------------------------------------------------ files


def open_regular(path: Path):
    """Open ``path`` for reading only if it is a regular file (no symlink, device, FIFO or folder)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise IsADirectoryError(f"{path} is not a regular file")
    return os.fdopen(fd, "rb")


def sha256_file(path: Path) -> str:
    """SHA-256 of a regular file (see :func:`open_regular`)."""
    h = hashlib.sha256()
    with open_regular(path) as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _canonical(record: dict) -> bytes:
    return json.dumps(record, indent=1, sort_keys=True, allow_nan=True).encode() + b"\n"


def manifest_bytes(record: dict) -> bytes:
    """The canonical bytes of a manifest, with ``manifest_sha256`` = SHA-256 of the canonical record without it."""
    body = {k: v for k, v in record.items() if k != "manifest_sha256"}
    body = json.loads(_canonical(body))  # tuples -> lists, so what is hashed is what a reader parses
    return _canonical({**body, "manifest_sha256": hashlib.sha256(_canonical(body)).hexdigest()})


# ------------------------------------------------------------------------------------------------ finding


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Finished checkpoint folders of a run, oldest first (temporary folders of interrupted writes ignored)."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if STEP_DIR.match(p.name) and p.is_dir() and not p.is_symlink()),
                  key=lambda p: p.name)


def run_identity(run_dir: str | Path) -> str | None:
    """The ``run_id`` the trainer wrote into ``run_dir/config.json`` (None when there is none)."""
    try:
        with open_regular(Path(run_dir) / RUN_CONFIG) as f:
            config = json.loads(f.read(MAX_MANIFEST_BYTES))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return config.get("run_id") if isinstance(config, dict) else None


def is_run_folder(path: str | Path) -> bool:
    """The folder holds an attnkit run: checkpoints, or the ``config.json`` the trainer writes (with a run_id).
    A Hugging Face folder's ``config.json`` has no ``run_id``."""
    return bool(list_checkpoints(path)) or run_identity(path) is not None


def is_checkpoint_or_run(path: str | Path) -> bool:
    """A run folder (:func:`is_run_folder`) or one of its checkpoint folders (it has a ``state.json``)."""
    path = Path(path)
    return (path / MANIFEST).is_file() or is_run_folder(path)


def resolve(path: str | Path) -> Path:
    """A checkpoint folder from a checkpoint folder or a run folder (its newest checkpoint)."""
    path = Path(path)
    if (path / MANIFEST).exists() or STEP_DIR.match(path.name):
        return path
    found = list_checkpoints(path)
    if not found:
        raise CheckpointError(f"no checkpoint found in {str(path)!r}: " + (set_aside_note(path) or (
            "expected a run folder with checkpoints/step_* or a checkpoint folder; train one there first (run_dir=).")))
    return found[-1]


def is_converted(path: str | Path) -> bool:
    """The checkpoint of ``path`` (a run or checkpoint folder) was written by ``attnkit convert`` (its tokens are
    the source model's, never bytes). Call it after the checkpoint was verified (:func:`load_model`)."""
    try:
        with open_regular(resolve(path) / MANIFEST) as f:
            state = json.loads(f.read(MAX_MANIFEST_BYTES))
    except (OSError, ValueError):
        return False
    return isinstance(state, dict) and "converted_from" in state


def set_aside_note(path: str | Path) -> str | None:
    """Where the run that an interrupted ``--overwrite`` set aside in ``path/.replaced`` is, and how to get it back
    (None when there is none)."""
    aside = Path(path) / ASIDE
    kept = list_checkpoints(aside)
    if not kept:
        return None
    return (f"the run that was here is intact in {str(aside)!r} (newest checkpoint {kept[-1].name}), set aside by a "
            f"training run with overwrite=True that was stopped before its first checkpoint; training again with "
            f"resume={str(path)!r} puts it back and continues it (so does any new training run in this folder), or "
            f"read it where it is ({aside}).")


def run_folder_of(ckpt: Path, named: str | Path | None = None, *, fix: str = "resume the run folder it belongs "
                  "to, or start a new run (in a new folder) from its weights.") -> Path:
    """The run folder of the checkpoint ``ckpt`` (named ``named`` by the user): it must be one of
    ``RUN/checkpoints/step_*`` (a real folder, not a link), else a resume would take an unrelated grandparent
    folder as the run and write into it. ``fix``: what the refusal tells the user to do instead."""
    run_dir = ckpt.parent.parent
    if ckpt.parent.name != CHECKPOINTS or ckpt not in list_checkpoints(run_dir):
        raise CheckpointError(
            f"{str(named or ckpt)!r}: {str(ckpt)!r} is not a checkpoint inside a run folder (RUN/checkpoints/"
            f"step_NNNNNNNN, a folder, not a link), so there is no run to continue; {fix}")
    return run_dir


# ------------------------------------------------------------------------------------------------ verifying


def read_state(ckpt: str | Path) -> dict:
    """Verify checkpoint ``ckpt`` and return its manifest (see the module docstring for what is checked)."""
    return read_verified(ckpt)[0]


def read_verified(ckpt: str | Path, keep: tuple[str, ...] = ()) -> tuple[dict, dict[str, bytes]]:
    """:func:`read_state`, and the bytes of the files named in ``keep`` (of :data:`FILES`) exactly as they were
    hashed: each file is read once, through one descriptor, so what is loaded is what was verified (a file swapped
    in after the check is never read)."""
    ckpt = Path(ckpt)
    previous = [p for p in list_checkpoints(ckpt.parent.parent) if p.name < ckpt.name]
    hint = (f"the previous checkpoint {previous[-1]} is intact: pass it instead of the damaged one (a run folder "
            "reads its newest checkpoint), or delete the damaged folder." if previous else
            "no earlier checkpoint exists: train the run again (the damaged folder is kept for inspection).")

    def fail(problem: str, exc: Exception | None = None):
        newest = list_checkpoints(ckpt.parent.parent) if ckpt.parent.name == CHECKPOINTS else []
        pruned = isinstance(exc, FileNotFoundError) and newest and newest[-1].name > ckpt.name
        if not ckpt.is_dir() or pruned:  # it was there when named: the run training there pruned it meanwhile
            raise CheckpointGone(f"checkpoint {str(ckpt)!r} was removed while it was read: the run is still training "
                                 "and keeps only its newest checkpoints (keep=); "
                                 + (f"read the newest, {newest[-1]}, or the run folder {str(ckpt.parent.parent)!r}."
                                    if newest else "read the run folder once it has written its next one.")) from exc
        raise CheckpointError(f"checkpoint {str(ckpt)!r}: {problem}; {hint}") from exc

    folder = STEP_DIR.match(ckpt.name)
    if folder is None:
        raise CheckpointError(f"{str(ckpt)!r} is not a checkpoint folder: checkpoint folders are named step_NNNNNNNN "
                              "(8 digits, the step); pass a run folder or one of its checkpoints/step_* folders.")
    try:
        with open_regular(ckpt / MANIFEST) as f:
            raw = f.read(MAX_MANIFEST_BYTES + 1)
    except FileNotFoundError as exc:
        fail(f"has no {MANIFEST} (incomplete or not a checkpoint)", exc)
    except OSError as exc:
        fail(f"{MANIFEST} is not a regular file ({exc})", exc)
    if len(raw) > MAX_MANIFEST_BYTES:
        fail(f"{MANIFEST} is larger than {MAX_MANIFEST_BYTES} bytes (not a manifest attnkit wrote)")
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
    return state, _read_hashed(ckpt, state, keep, fail)


def _read_hashed(ckpt: Path, state: dict, keep: tuple[str, ...], fail) -> dict[str, bytes]:
    """Check every file of :data:`FILES` against the SHA-256 ``state`` records (``fail(problem, exc)`` raises);
    returns the bytes of those named in ``keep``, read once through the descriptor they were hashed from."""
    kept = {}
    for name in FILES:
        try:
            if name in keep:
                with open_regular(ckpt / name) as f:
                    kept[name] = f.read()
                got = hashlib.sha256(kept[name]).hexdigest()
            else:
                got = sha256_file(ckpt / name)
        except FileNotFoundError as exc:
            fail(f"is missing {name}", exc)
        except OSError as exc:
            fail(f"{name} is not a regular file ({exc})", exc)
        if got != state["sha256"][name]:
            fail(f"{name} is corrupt or truncated (sha256 {got[:12]}... != recorded {str(state['sha256'][name])[:12]}...)")
    return kept


def _check_run_identity(ckpt: Path, state: dict, fail) -> None:
    """A checkpoint inside ``RUN/checkpoints/`` must belong to RUN: the run_id in RUN/config.json. Without a readable
    config.json (a converted run writes none; a kill or a user may have removed it) every checkpoint of the folder
    must carry this checkpoint's run_id; a config.json that is a symlink is refused (it could name any run)."""
    if ckpt.parent.name != CHECKPOINTS:
        return
    run = ckpt.parent.parent
    if (run / RUN_CONFIG).is_symlink():
        fail(f"the run folder's {RUN_CONFIG} is a symlink, so the run's identity cannot be trusted; replace it with "
             "the run's own file (or remove it: the checkpoints then have to agree on their run_id)")
    expected = run_identity(run)
    if expected is not None:
        if state.get("run_id") != expected:
            fail(f"belongs to another run (run_id {state.get('run_id')!r}, this run folder is {expected!r}); a "
                 "checkpoint copied in from elsewhere is never adopted - start a new run from it with init_from=")
        return
    others = {}
    for sibling in list_checkpoints(run):
        try:
            with open_regular(sibling / MANIFEST) as f:
                record = json.loads(f.read(MAX_MANIFEST_BYTES))
        except (OSError, ValueError):
            continue  # unreadable: it proves nothing either way (and is refused when it is loaded itself)
        if isinstance(record, dict) and record.get("run_id") != state.get("run_id"):
            others[sibling.name] = record.get("run_id")
    if others:
        fail(f"the run folder has no readable {RUN_CONFIG} and its checkpoints belong to different runs (this one "
             f"{state.get('run_id')!r}, {', '.join(f'{n} {i!r}' for n, i in sorted(others.items()))}); a checkpoint "
             "copied in from elsewhere is never adopted - start a new run from it with init_from=")


def load_weights(ckpt: str | Path, model: torch.nn.Module) -> dict:
    """Verify ``ckpt`` and load its weights into ``model`` (strict); return the state record."""
    state, data = read_verified(ckpt, keep=(FILES[0],))
    load_verified_weights(ckpt, model, data[FILES[0]])
    return state


def load_verified_weights(ckpt: str | Path, model: torch.nn.Module, data: bytes) -> None:
    """Load the verified bytes of ``ckpt``'s model.safetensors into ``model`` (strict; tied weights stored once)."""
    from safetensors.torch import _remove_duplicate_names, load

    tensors = load(data)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    for name in sorted(tensors):
        if name in expected and expected[name] != tuple(tensors[name].shape):
            raise CheckpointError(
                f"checkpoint {str(ckpt)!r} does not fit the model: {name} is {tuple(tensors[name].shape)} in the "
                f"checkpoint but {expected[name]} in the model built from the config; build the model from the "
                "checkpoint's own model_config (attnkit.runs.load_model does).")
    aliases = _remove_duplicate_names(model.state_dict(), preferred_names=tensors.keys())  # tied: stored once
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    missing = set(missing) - {name for group in aliases.values() for name in group}
    if missing or unexpected:
        raise CheckpointError(f"checkpoint {str(ckpt)!r} does not match the model: missing {sorted(missing)[:5]}, "
                              f"unexpected {sorted(unexpected)[:5]}; build the model from the checkpoint's config.")


def load_model(path: str | Path, device: str | torch.device = "cpu") -> TransformerLM:
    """The ``TransformerLM`` of a checkpoint (a checkpoint folder or a run folder: its newest), verified, built from
    the checkpoint's own ``model_config``, in eval mode."""
    for attempt in range(READ_RETRIES):
        where = resolve(path)
        try:
            state, data = read_verified(where, keep=(FILES[0],))  # verified once; these bytes are what is loaded
            break
        except CheckpointGone:  # a run folder named: its newest checkpoint was pruned by the trainer meanwhile
            if where == Path(path) or attempt == READ_RETRIES - 1:
                raise
    model = TransformerLM(LMConfig.from_dict(state["model_config"]))
    load_verified_weights(where, model, data[FILES[0]])
    return model.to(device).eval()


# ------------------------------------------------------------------------------------------------ the rest of a run


#: the fields of a metrics record that are numbers when present (``step`` is an int >= 0 in every record)
METRIC_NUMBERS = ("loss", "val_loss", "val_ppl", "lr", "grad_norm", "tokens", "tok_per_s", "cp_bytes_sent")


def read_metrics(path: str | Path, on_skip: Callable[[str], None] | None = None) -> list[dict]:
    """The records of a ``metrics.jsonl`` (none when it does not exist). A line that is not a record of a step (cut
    by a kill, edited: not JSON, no int ``step``, a non-number in a number field, an ``attention`` entry of another
    shape) is skipped and every other record kept; ``on_skip(message)`` hears what was skipped (default: a warning)."""
    path = Path(path)
    if not path.exists():
        return []
    records, skipped = [], []
    try:
        with open_regular(path) as f:
            lines = f.read().decode("utf-8", errors="replace").splitlines()
    except OSError as exc:  # a symlink, a FIFO, a folder: nothing of it is read
        lines, skipped = [], [f"not a regular file, not read ({exc})"]
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            skipped.append(f"line {number}: not JSON (a line cut by a kill, or edited)")
            continue
        problem = _record_problem(record)
        if problem:
            skipped.append(f"line {number}: {problem}")
        else:
            records.append(record)
    if skipped:
        message = (f"{path}: skipped {len(skipped)} line(s) that are not records of a step ({'; '.join(skipped[:3])}"
                   f"{'; ...' if len(skipped) > 3 else ''}); the other {len(records)} records are kept")
        (on_skip or (lambda m: warnings.warn(m, stacklevel=3)))(message)
    return records


def _short(value) -> str:
    """``repr(value)``, cut to 40 characters (a 400-digit number in a message would be a paragraph)."""
    return repr(value) if len(repr(value)) <= 40 else f"{repr(value)[:20]}...({len(repr(value))} characters)"


def _record_problem(record) -> str | None:
    """What makes ``record`` not a metrics record (None when it is one)."""
    if not isinstance(record, dict):
        return f"a JSON {type(record).__name__}, not a record"
    step = record.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < 2**63:
        return f"step is {_short(step)}, not an int from 0 to 2**63 - 1"  # a 400-digit step overflowed the plots
    for name in METRIC_NUMBERS:
        value = record.get(name, 0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (isinstance(value, int) and
                                                                              abs(value) >= 2**63):
            return f"{name} is {_short(value)}, not a number (an int beyond 64 bits does not fit a float)"
    attention = record.get("attention", {})
    if not isinstance(attention, dict) or not all(
            isinstance(info, dict) and isinstance(info.get("verdicts", []), list)
            and all(isinstance(v, str) for v in info.get("verdicts", [])) for info in attention.values()):
        return "attention is not {layer: {verdicts: [...]}}"
    return None


def metrics_file(path: str | Path) -> Path | None:
    """The ``metrics.jsonl`` of a run folder, or of the run a checkpoint folder belongs to (None when none)."""
    path = Path(path)
    for folder in (path, *path.parents[:2]):
        if (folder / METRICS).is_file():
            return folder / METRICS
    return None

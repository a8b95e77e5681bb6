"""Write one output file safely: the rules every command that writes a named file follows, in one place.

:func:`check_out` refuses an ``out`` that would destroy something or never finish: a folder, a name without the
expected suffix, a symbolic link (a file is never written *through* a link: ``RUN/report.html -> ~/.bashrc``),
anything that is not a regular file (a FIFO would block the writer forever, a device would be written to), and an
existing file that attnkit did not write (recognised positively by a ``marker`` in its first bytes: a model's
weights, a config, someone's photo) unless ``overwrite``. With ``overwrite`` a link is replaced, its target
untouched. :func:`write_atomic` writes a temporary file beside ``out`` and renames it over ``out`` (atomic on
POSIX): a write that fails half-way (disk full) leaves the earlier file as it was.

Users: the HTML report (``diagnostics/report/out.py``), the head-importance figure (``attnkit heads --out``,
``head_importance(...).figure(path)``) and the per-layer heatmaps (``save_heatmaps``).
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from attnkit.errors import AttnkitTypeError, AttnkitValueError, EnvironmentUnsupportedError, describe

#: bytes read from an existing file to find its marker
HEAD_BYTES = 4096


@dataclass(frozen=True)
class OutputKind:
    """What a kind of output file is: its ``name`` in messages ("report"), the ``suffixes`` it may have (first: the
    one suggested), what the format is (``format``: "an HTML page"), and the ``marker`` bytes that every file of
    this kind attnkit writes holds in its first :data:`HEAD_BYTES` (how an earlier one is recognised)."""

    name: str
    suffixes: tuple[str, ...]
    format: str
    marker: bytes


def check_text(name: str, value: str) -> str:
    """Refuse a string that is not valid UTF-8 (a command-line argument with undecodable bytes arrives as lone
    surrogates): printing or writing it would crash later."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raw = exc.object[exc.start:exc.end].encode("utf-8", "surrogateescape")  # the bytes as they came: b'\xff'
        raise AttnkitValueError(f"{name} {value!r} is not valid UTF-8 (byte {raw!r} at {exc.start}: an undecodable "
                                "byte); pass it as UTF-8 text.") from None
    return value


def is_ours(path: Path, kind: OutputKind) -> bool:
    """Whether the regular file at ``path`` holds ``kind``'s marker in its first bytes (read without following a
    link, without blocking on a FIFO)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f:
        return kind.marker in f.read(HEAD_BYTES)


def foreign_entries(folder: Path, ours: Callable[[str], bool]) -> list[str]:
    """The names in ``folder`` that are not regular files attnkit would write there (``ours(name)``): links,
    sub-folders and every other name. An output folder is recognised positively: empty list = only ours."""
    return [p.name for p in sorted(folder.iterdir()) if p.is_symlink() or not p.is_file() or not ours(p.name)]


def not_ours(folder: Path, ours: Callable[[str], bool], writer: str, manifest: str) -> tuple[str | None, object]:
    """``(why folder is not an output of ``writer``, the JSON of its ``manifest`` file)``: the reason is None when
    every entry is ``ours`` and the manifest reads as JSON; the caller then checks what the manifest says."""
    unknown = foreign_entries(folder, ours)
    if unknown:
        return f"it holds {unknown[:5]}, which {writer} does not write", None
    try:
        return None, json.loads((folder / manifest).read_text())
    except (OSError, ValueError) as exc:
        return f"its {manifest} can't be read as JSON ({type(exc).__name__}: {exc})", None


def _file_type(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file"


def check_out(out: str | Path, kind: OutputKind, overwrite: bool = False, *, option: str = "out") -> Path:
    """``out`` as a Path, or a typed error saying why a ``kind`` file may not be written there and what to do.
    ``option`` is how the caller names the argument (``out``, ``--out``) in the messages."""
    if not isinstance(out, (str, Path)):
        raise AttnkitTypeError(f"{option} must be a path to a {kind.suffixes[0]} file, got {describe(out)}.")
    out = Path(out)
    check_text(option, str(out))
    try:
        st = os.lstat(out)
    except FileNotFoundError:
        st = None
    except OSError as exc:  # e.g. a parent that is a file, a name too long
        raise AttnkitValueError(f"{option} {str(out)!r} cannot be used: {exc.strerror or exc}; pick another "
                                f"{option}.") from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise AttnkitValueError(f"{option} {str(out)!r} is a folder; give a file name such as "
                                f"{str(out / (kind.name + kind.suffixes[0]))!r}.")
    if out.suffix.lower() not in kind.suffixes:
        raise AttnkitValueError(f"{option} {str(out)!r} does not end in {kind.suffixes[0]}; the {kind.name} is "
                                f"{kind.format}: use e.g. {str(out.with_suffix(kind.suffixes[0]))!r}.")
    if st is None:
        return out
    if stat.S_ISLNK(st.st_mode):
        if overwrite:
            return out  # write_atomic renames the file over the link itself; its target is never opened
        raise AttnkitValueError(f"{option} {str(out)!r} is a symbolic link (to {os.readlink(out)!r}); the {kind.name} "
                                "is never written through a link: remove it, pick another out, or pass overwrite=True "
                                "to replace the link itself (its target is left untouched).")
    if not stat.S_ISREG(st.st_mode):
        raise AttnkitValueError(f"{option} {str(out)!r} is {_file_type(st.st_mode)}, not a regular file; the "
                                f"{kind.name} is written only to a regular file: pick another {option}.")
    if not overwrite and not is_ours(out, kind):
        raise AttnkitValueError(f"{option} {str(out)!r} exists and is not an attnkit {kind.name}; pick another "
                                f"{option}, or pass overwrite=True to replace it.")
    return out


def write_atomic(out: Path, write: Callable[[object], None] | bytes, kind: OutputKind) -> Path:
    """Write ``out`` atomically: ``write(f)`` (or the bytes) into a temporary file in the same folder, flushed, given
    the usual permissions, then renamed over ``out`` (a link at ``out`` is replaced, never followed). On failure the
    temporary file is removed, ``out`` is as it was, and the OS error reaches the caller as a typed error."""
    tmp = None
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
        with os.fdopen(fd, "wb") as f:
            f.write(write) if isinstance(write, bytes) else write(f)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it 0600
        os.replace(tmp, out)
    except OSError as exc:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise EnvironmentUnsupportedError(f"could not write the {kind.name} to {str(out)!r}: {exc.strerror or exc}; "
                                          "nothing was changed there (free space, or pick another out).") from exc
    return out

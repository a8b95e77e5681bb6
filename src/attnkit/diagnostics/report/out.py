"""Where a report may be written, and writing it so that nothing is lost.

:func:`check_out` refuses an ``out`` that would destroy something or never finish: a folder, a name without
``.html``, a symbolic link (the page is never written *through* a link: ``RUN/report.html -> ~/.bashrc``), anything
that is not a regular file (a FIFO would block the reader forever, a device would be written to), and an existing
file that is not an attnkit report (a model's weights, a config) unless ``overwrite``. With ``overwrite`` a link is
replaced by the page, its target untouched. :func:`write_page` writes a temporary file beside ``out`` and renames
it over ``out`` (atomic on POSIX): a write that fails half-way (disk full) leaves the earlier report as it was.

The CLI's ``attnkit report --out`` calls the same functions: the rules live here, it only translates the errors.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

from attnkit.errors import AttnkitTypeError, AttnkitValueError, EnvironmentUnsupportedError, describe

#: bytes read from an existing file to recognise an earlier report (its Content-Security-Policy meta tag)
HEAD_BYTES = 4096


def check_text(name: str, value: str) -> str:
    """Refuse a string that is not valid UTF-8 (a command-line argument with undecodable bytes arrives as lone
    surrogates): the page is UTF-8, and printing it would crash later."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise AttnkitValueError(f"{name} {value!r} is not valid UTF-8 (byte {exc.object[exc.start:exc.end]!r} at "
                                f"{exc.start}: an undecodable byte); pass it as UTF-8 text.") from None
    return value


def _is_report(path: Path) -> bool:
    """Whether the regular file at ``path`` starts like an attnkit report (read without following a link)."""
    from attnkit.diagnostics.report.page import CSP

    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f:
        return f'content="{CSP}"'.encode() in f.read(HEAD_BYTES)


def check_out(out: str | Path, overwrite: bool = False) -> Path:
    """``out`` as a Path, or a typed error saying why the report may not be written there and what to do."""
    if not isinstance(out, (str, Path)):
        raise AttnkitTypeError(f"out must be a path to an .html file or None, got {describe(out)}.")
    out = Path(out)
    check_text("out", str(out))
    try:
        st = os.lstat(out)
    except FileNotFoundError:
        st = None
    except OSError as exc:  # e.g. a parent that is a file, a name too long
        raise AttnkitValueError(f"out {str(out)!r} cannot be used: {exc.strerror or exc}; pick another out.") from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise AttnkitValueError(f"out {str(out)!r} is a folder; give a file name such as {str(out / 'report.html')!r}.")
    if out.suffix.lower() not in (".html", ".htm"):
        raise AttnkitValueError(f"out {str(out)!r} does not end in .html; the report is an HTML page: use e.g. "
                                f"{str(out.with_suffix('.html'))!r}.")
    if st is None:
        return out
    if stat.S_ISLNK(st.st_mode):
        if overwrite:
            return out  # write_page renames the page over the link itself; its target is never opened
        raise AttnkitValueError(f"out {str(out)!r} is a symbolic link (to {os.readlink(out)!r}); the report is never "
                                "written through a link: remove it, pick another out, or pass overwrite=True "
                                "to replace the link itself (its target is left untouched).")
    if not stat.S_ISREG(st.st_mode):
        kind = "a FIFO (named pipe)" if stat.S_ISFIFO(st.st_mode) else \
            "a socket" if stat.S_ISSOCK(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) \
            else "not a regular file"
        raise AttnkitValueError(f"out {str(out)!r} is {kind}, not a regular file; the report is written only to a "
                                "regular file: pick another out.")
    if not overwrite and not _is_report(out):
        raise AttnkitValueError(f"out {str(out)!r} exists and is not an attnkit report; pick another out, or pass "
                                "overwrite=True to replace it.")
    return out


def write_page(out: Path, page: str) -> Path:
    """Write ``page`` to ``out`` atomically: a temporary file in the same folder, flushed, then renamed over ``out``
    (a link at ``out`` is replaced, never followed). On failure the temporary file is removed, ``out`` is as it
    was, and the OS error reaches the caller as a typed error naming the path."""
    data = page.encode("utf-8")
    tmp = None
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    except OSError as exc:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise EnvironmentUnsupportedError(f"could not write the report to {str(out)!r}: {exc.strerror or exc}; "
                                          "nothing was changed there (free space, or pick another out).") from exc
    return out

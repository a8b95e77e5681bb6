"""Where a report may be written, and writing it so that nothing is lost: the rules of :mod:`attnkit._files`
(one place for every output file) applied to the HTML report.

:func:`check_out` refuses an ``out`` that would destroy something or never finish: a folder, a name without
``.html``, a symbolic link (the page is never written *through* a link: ``RUN/report.html -> ~/.bashrc``), anything
that is not a regular file (a FIFO would block the reader forever, a device would be written to), and an existing
file that is not an attnkit report (recognised by its Content-Security-Policy meta tag) unless ``overwrite``. With
``overwrite`` a link is replaced by the page, its target untouched. :func:`write_page` writes a temporary file
beside ``out`` and renames it over ``out`` (atomic on POSIX): a write that fails half-way (disk full) leaves the
earlier report as it was.

The CLI's ``attnkit report --out`` calls the same functions: the rules live here, it only translates the errors.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from attnkit import _files


@cache
def report_kind() -> _files.OutputKind:
    """The report as an output kind: an earlier one holds the page's Content-Security-Policy meta tag."""
    from attnkit.diagnostics.report.page import CSP

    return _files.OutputKind("report", (".html", ".htm"), "an HTML page", f'content="{CSP}"'.encode())


def check_out(out: str | Path, overwrite: bool = False) -> Path:
    """``out`` as a Path, or a typed error saying why the report may not be written there and what to do."""
    return _files.check_out(out, report_kind(), overwrite)


def write_page(out: Path, page: str) -> Path:
    """Write ``page`` to ``out`` atomically (:func:`attnkit._files.write_atomic`)."""
    return _files.write_atomic(out, page.encode("utf-8"), report_kind())

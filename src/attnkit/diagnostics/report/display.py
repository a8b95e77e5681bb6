"""What ``ak.diagnostics.report`` returns: the written path (or the page) that also displays inline in Jupyter.

``ReportFile`` is a :class:`pathlib.Path` (every existing use of the returned path keeps working) and
``ReportPage`` a ``str`` (the HTML, when ``out=None``); both have ``_repr_html_``, which Jupyter calls to show the
object as the last expression of a cell. The page is embedded in an ``<iframe srcdoc=...>`` with
``sandbox="allow-scripts"``: the same self-contained page, no network (its own Content-Security-Policy still
applies), its script and style in their own document, so neither touches the notebook's (an opaque origin: the page
cannot read the notebook, and the notebook's CSS cannot restyle the page).
"""

from __future__ import annotations

import html
from pathlib import Path

#: the iframe's height in CSS pixels (the page scrolls inside it)
FRAME_HEIGHT = 900


def iframe(page: str, height: int = FRAME_HEIGHT) -> str:
    """``page`` (a complete HTML document) as one sandboxed iframe element, for a notebook's output."""
    return (f'<iframe class="attnkit-report" sandbox="allow-scripts" title="attnkit attention report" '
            f'style="width: 100%; height: {int(height)}px; border: 1px solid #d9dde5;" '
            f'srcdoc="{html.escape(page, quote=True)}"></iframe>')


class ReportFile(type(Path())):
    """The path of a written report (a ``Path``); displays the page inline in Jupyter (read from the file)."""

    def _repr_html_(self) -> str:
        return iframe(self.read_text(encoding="utf-8"))


class ReportPage(str):
    """The report's HTML (a ``str``, from ``out=None``); displays the page inline in Jupyter."""

    def _repr_html_(self) -> str:
        return iframe(str(self))

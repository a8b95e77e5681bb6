"""Progress for long work (issue 23, item 2): plain lines on a non-terminal after a delay, a tqdm bar on a
terminal, silence for short work and with ATTNKIT_PROGRESS=0; labs name themselves in the lines."""

from __future__ import annotations

import io
import sys

import pytest

from attnkit import _progress
from attnkit._progress import PlainLines, progress


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_plain_lines_after_the_delay_then_every_few_seconds():
    clock, out = Clock(), io.StringIO()
    lines = PlainLines(10, "lab x: training", "step", out, delay=3, every=10, clock=clock)
    for t in (1, 2, 4, 8, 13, 15, 25):  # one update at each of these times
        clock.now = t
        lines.update()
    lines.close()
    assert out.getvalue().splitlines() == ["lab x: training: 3/10 steps (4 s)", "lab x: training: 6/10 steps (15 s)",
                                           "lab x: training: 7/10 steps (25 s)",
                                           "lab x: training: 7/10 steps, done in 25 s"]


def test_short_work_prints_nothing():
    clock, out = Clock(), io.StringIO()
    lines = PlainLines(None, "bench", "case", out, delay=3, every=10, clock=clock)
    clock.now = 2.9
    lines.update()
    lines.close()
    assert out.getvalue() == ""


class Tty(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize(("setting", "stream", "mode"), [("", io.StringIO(), "plain"), ("", Tty(), "bar"),
                                                          ("plain", Tty(), "plain"), ("0", Tty(), "off"),
                                                          ("off", io.StringIO(), "off")])
def test_mode(monkeypatch, setting, stream, mode):
    monkeypatch.setenv("ATTNKIT_PROGRESS", setting)
    assert _progress._mode(stream) == mode


def test_progress_yields_everything_in_every_mode(monkeypatch):
    for setting, stream in (("", io.StringIO()), ("", Tty()), ("0", io.StringIO())):
        monkeypatch.setenv("ATTNKIT_PROGRESS", setting)
        assert list(progress(range(5), desc="x", stream=stream)) == [0, 1, 2, 3, 4]


def test_a_lab_shows_plain_progress_lines_on_a_non_terminal(monkeypatch, tmp_path, capsys):
    """A lab (here heads, quick) names itself in the lines; the delay is 0 so that its seconds of work show."""
    from attnkit.cli.main import main

    monkeypatch.setattr(_progress, "DELAY", 0.0)
    monkeypatch.delenv("ATTNKIT_PROGRESS", raising=False)
    assert main(["lab", "heads", "--quick", "--out", str(tmp_path)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert any(line.startswith("lab heads: training TransformerLM: 1/4 steps (") for line in err), err
    assert any(line.startswith("lab heads: training TransformerLM: 1/4 steps, done in") or
               line.startswith("lab heads: training TransformerLM: 4/4 steps, done in") for line in err), err


def test_no_module_imports_tqdm_auto():
    """Issue 31 item 5: in a Jupyter kernel without ipywidgets, importing ``tqdm.auto`` alone prints a red
    TqdmWarning under the cell; attnkit's bars are terminal bars (a kernel's stderr is not a terminal)."""
    import re
    from pathlib import Path

    import attnkit

    root = Path(attnkit.__file__).parent
    found = [str(p.relative_to(root)) for p in root.rglob("*.py")
             if re.search(r"^\s*(from\s+tqdm\.(auto|autonotebook|notebook)\s+import|import\s+tqdm\.(auto|autonotebook|"
                          r"notebook))", p.read_text(), re.M)]
    assert found == []


def test_lines_printed_while_a_tqdm_bar_is_shown_clear_it_first(monkeypatch):
    """A line of the trainer (a checkpoint written) while the tqdm bar is drawn: the bar is cleared, the line
    printed, the bar drawn again (issue 31.5: they collided)."""
    from tqdm.auto import tqdm

    from attnkit import _progress

    events = []
    bar = tqdm(total=3, file=sys.stderr, disable=False)
    monkeypatch.setattr(bar, "clear", lambda *a, **k: events.append("clear"))
    monkeypatch.setattr(bar, "refresh", lambda *a, **k: events.append("draw"))
    with _progress.clear_of(bar):
        events.append("line")
    bar.close()
    assert events[:3] == ["clear", "line", "draw"]
    with _progress.clear_of(None):  # no bar, or plain lines: nothing to clear
        pass

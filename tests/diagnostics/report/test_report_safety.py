"""Issue 21 (items 2, 3, 4, 15, 18) and issue 20 (item 3): where ``report`` may write, and what a page may contain.

The ``out`` rules live in the library (``ak.diagnostics.report(..., out=, overwrite=)``); ``attnkit report --out``
only translates them. A symbolic link is never written through; a FIFO is refused, not opened; a write that fails
half-way keeps the earlier report; strings that are not valid UTF-8 give a typed error; every string a model or a
user controls stays text in the page (the browser half of that is in test_report_views.py)."""

import json
import os
import re
import resource
import signal

import pytest

import attnkit as ak
from attnkit.cli.main import main
from attnkit.errors import EnvironmentUnsupportedError
from attnkit.models.builders import build_lm
from conftest import read_page

ARGS = ["report", "nano", "--text", "hi", "--no-doctor"]
HOSTILE = ["<!--", "<script>", "</script>", "<img src=x onerror=\"window.__pwned=1\">", "&amp;", "]]>", "\u2028", "ok"]


@pytest.fixture(scope="module")
def nano():
    return build_lm("nano").eval()


def _report(model, out, **kw):
    return ak.diagnostics.report(model, "hi there", out=out, doctor=False, **kw)


@pytest.mark.parametrize("name,message", [
    ("model.safetensors", "does not end in .html; the report is an HTML page: use e.g."),
    ("config.json", "does not end in .html"),
])
def test_the_library_refuses_what_the_cli_refuses(nano, tmp_path, name, message):
    """Issue 20 item 3: report(out="model.safetensors") overwrote the weights; only the CLI checked --out."""
    target = tmp_path / name
    target.write_bytes(b"\x00weights")
    with pytest.raises(ValueError, match=re.escape(message)):
        _report(nano, target)
    assert target.read_bytes() == b"\x00weights"


def test_the_library_keeps_a_file_that_is_not_a_report_unless_overwrite(nano, tmp_path):
    target = tmp_path / "notes.html"
    target.write_text("<p>my notes</p>")
    with pytest.raises(ValueError, match=re.escape("exists and is not an attnkit report; pick another out, or pass "
                                                   "overwrite=True to replace it.")):
        _report(nano, target)
    assert target.read_text() == "<p>my notes</p>"
    assert _report(nano, target, overwrite=True).read_text().startswith("<!DOCTYPE html>")
    with pytest.raises(ValueError, match=re.escape("is a folder; give a file name such as")):
        _report(nano, tmp_path)
    with pytest.raises(TypeError, match="out must be a path to a .html file, got"):
        _report(nano, 3)


def test_a_symlink_is_refused_and_its_target_untouched(nano, tmp_path, capsys):
    """Issue 21 item 3: RUN/report.html -> ~/.bashrc was written through."""
    secret = tmp_path / "bashrc"
    secret.write_text("export PATH=/usr/bin\n")
    link = tmp_path / "report.html"
    link.symlink_to(secret)
    with pytest.raises(ValueError, match=re.escape("is a symbolic link (to ") + ".*never written through a link"):
        _report(nano, link)
    assert main([*ARGS, "--out", str(link)]) == 2
    assert "is a symbolic link" in capsys.readouterr().err
    assert link.is_symlink() and secret.read_text() == "export PATH=/usr/bin\n"
    # overwrite replaces the link itself, never its target
    path = _report(nano, link, overwrite=True)
    assert not path.is_symlink() and path.read_text().startswith("<!DOCTYPE html>")
    assert secret.read_text() == "export PATH=/usr/bin\n"


def test_a_link_to_an_earlier_report_is_refused_too(nano, tmp_path):
    """A link that points at an attnkit report is still a link: the page would land wherever it points."""
    real = _report(nano, tmp_path / "real.html")
    before = real.read_text()
    link = tmp_path / "link.html"
    link.symlink_to(real)
    with pytest.raises(ValueError, match="is a symbolic link"):
        _report(nano, link)
    assert real.read_text() == before


def test_a_fifo_is_refused_not_opened(nano, tmp_path, capsys):
    """Issue 21 item 15: --out x.html hung forever when x.html was a FIFO (it was opened to read its head)."""
    fifo = tmp_path / "x.html"
    os.mkfifo(fifo)

    def hung(*_):
        raise TimeoutError("the report blocked on the FIFO")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(60)
    try:
        with pytest.raises(ValueError, match=re.escape("is a FIFO (named pipe), not a regular file; the report is "
                                                       "written only to a regular file")):
            _report(nano, fifo, overwrite=True)
        assert main([*ARGS, "--out", str(fifo)]) == 2
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert "is a FIFO" in capsys.readouterr().err
    assert fifo.exists() and not fifo.is_file()


def test_a_failed_write_keeps_the_earlier_report(nano, tmp_path):
    """Issue 21 item 4: a write that fails half-way (here: the file-size limit, as a full disk) destroyed the earlier
    report; now the page goes to a temporary file that is renamed only once complete."""
    out = tmp_path / "r.html"
    first = _report(nano, out).read_bytes()
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing us
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, old_limit[1]))
    try:
        with pytest.raises(EnvironmentUnsupportedError, match=re.escape(f"could not write the report to {str(out)!r}: ")
                           + ".*nothing was changed there"):
            ak.diagnostics.report(nano, "a different text", out=out, doctor=False)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)
    assert out.read_bytes() == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html"]  # no temporary file left behind


@pytest.mark.parametrize("flag", ["--text", "--title", "--out", "target"])
def test_arguments_that_are_not_utf8_give_a_typed_error(tmp_path, capsys, flag):
    """Issue 21 item 18: an argument with undecodable bytes (Python hands it over as lone surrogates) crashed."""
    bad = os.fsdecode(b"caf\xe9")  # 'caf\udce9'
    out = str(tmp_path / "r.html")
    args = {"--text": [*ARGS[:2], "--text", bad, "--no-doctor", "--out", out],
            "--title": [*ARGS, "--title", bad, "--out", out],
            "--out": [*ARGS, "--out", str(tmp_path / f"{bad}.html")],
            "target": ["report", bad, "--no-doctor", "--out", out]}[flag]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "is not valid UTF-8 (byte " in err and "pass it as UTF-8 text" in err and "Traceback" not in err, err
    assert not os.listdir(tmp_path)


def test_the_library_refuses_text_that_is_not_utf8(nano, tmp_path):
    with pytest.raises(ValueError, match=re.escape("title 'x\\udcff' is not valid UTF-8")):
        _report(nano, tmp_path / "r.html", title="x\udcff")
    with pytest.raises(ValueError, match="tokens .* is not valid UTF-8"):
        ak.diagnostics.report(nano, "x\udcff", out=tmp_path / "r.html", doctor=False)


def test_hostile_strings_stay_inside_the_data_element(nano):
    """Issue 21 item 2 (the half without a browser): no label can close or re-open the script element, the header
    facts escape the model's class name, and the labels read back unchanged."""
    cls = type("Evil<img src=x onerror=alert(1)>Model", (type(nano),), {})
    model = build_lm("nano").eval()
    model.__class__ = cls
    page = ak.diagnostics.report(model, list(range(97, 97 + len(HOSTILE))), labels=HOSTILE, out=None, doctor=False,
                                 title="<b>title</b>")
    assert page.count("<script") == 3 and page.count("</script>") == 3
    data = re.search(r'<script type="application/json" id="ak-meta">(.*?)</script>', page, re.S).group(1)
    assert not re.search(r"[<>&]", data)
    assert json.loads(data)["labels"] == HOSTILE == read_page(page)[0]["labels"]
    assert "<img" not in page and "&lt;img src=x onerror=alert(1)&gt;Model" in page
    assert "<b>title</b>" not in page and "&lt;b&gt;title&lt;/b&gt;" in page

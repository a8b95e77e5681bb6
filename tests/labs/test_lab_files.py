"""A lab's outputs follow the file rules of every other command (issue 33 item 8): ``attnkit lab NAME --out DIR
--overwrite`` wrote through symbolic links (the link's target was overwritten) and blocked forever on a FIFO.

A tiny lab registered here writes every kind of output a lab writes (results.json, summary.md, a PNG) in a second.
"""

import json
import os
import re
import signal
from pathlib import Path

import pytest

import attnkit.labs
from attnkit.cli.main import main
from attnkit.labs import LABS, run_lab
from attnkit.labs.registry import lab
from attnkit.labs.report import Claim

NAME = "files-probe"
OUTPUTS = ("results.json", "summary.md", "curve.png")
RAN = []


@pytest.fixture(autouse=True)
def probe_lab():
    def measure(p, plots):
        RAN.append(p)
        with plots.figure("curve", "a line") as ax:
            ax.plot([0, 1], [0, p["y"]])
        return {"y": p["y"]}

    lab(NAME, "a probe of the lab's writers", sizes={"default": {"y": 1}, "quick": {"y": 2}},
        claims=[Claim("y is positive", "y > 0", lambda m: (str(m["y"]), [m["y"] > 0]))])(measure)
    RAN.clear()
    yield
    LABS.pop(NAME)


@pytest.fixture(autouse=True)
def no_hang():
    """A write that blocks (a FIFO opened for writing) fails the test after 20 s instead of hanging it."""
    def hung(*_):
        raise TimeoutError("a lab write blocked")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("name", OUTPUTS)
def test_overwrite_replaces_a_link_and_never_writes_its_target(name, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    (out / name).symlink_to(target)
    assert main(["lab", NAME, "--quick", "--out", str(out), "--overwrite"]) == 0
    assert target.read_text() == "keep me"  # the link's target untouched
    assert not (out / name).is_symlink() and (out / name).is_file()  # the link itself replaced by the output
    assert json.loads((out / "results.json").read_text())["lab"] == NAME
    assert sorted(p.name for p in out.iterdir()) == sorted(OUTPUTS)  # no temporary file left


@pytest.mark.parametrize("name", OUTPUTS)
def test_a_fifo_at_an_output_name_is_refused_before_the_lab_runs(name, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / name)
    assert main(["lab", NAME, "--quick", "--out", str(out), "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnkit lab: error: --out ") and f"{name}' is a FIFO (named pipe), not a regular file" in err
    assert RAN == []  # refused before measuring


def test_without_overwrite_a_link_in_the_folder_is_refused(tmp_path, capsys):
    out = tmp_path / "out"
    run_lab(NAME, quick=True, out=out)
    (out / "summary.md").unlink()
    (out / "summary.md").symlink_to(tmp_path / "elsewhere.md")
    RAN.clear()
    assert main(["lab", NAME, "--quick", "--out", str(out)]) == 2
    assert "is not an earlier output of lab 'files-probe'" in capsys.readouterr().err and RAN == []
    assert not (tmp_path / "elsewhere.md").exists()


def test_an_earlier_output_is_rewritten_in_place(tmp_path):
    out = tmp_path / "out"
    run_lab(NAME, quick=True, out=out)
    first = (out / "curve.png").read_bytes()
    run_lab(NAME, out=out)  # the same folder again, default size: no overwrite needed
    assert json.loads((out / "results.json").read_text())["size"] == "default"
    assert (out / "curve.png").read_bytes() != first and sorted(p.name for p in out.iterdir()) == sorted(OUTPUTS)


#: a call that writes a file by itself instead of through attnkit._files (write_atomic, viz.save_png)
DIRECT_WRITE = re.compile(r"\.write_(text|bytes)\(|\.savefig\(|\bjson\.dump\(|\btorch\.save\(|\bnp\.save|"
                          r"\bopen\([^)]*['\"][wax+]b?['\"]|\.open\(['\"][wax]")


def test_no_lab_module_writes_a_file_by_itself():
    root = Path(attnkit.labs.__file__).parent
    found = [f"{p.name}:{n}: {line.strip()}" for p in sorted(root.rglob("*.py"))
             for n, line in enumerate(p.read_text().splitlines(), 1) if DIRECT_WRITE.search(line)]
    assert found == []


def test_the_scan_finds_direct_writes():
    for line in ('(out / "a.json").write_text(x)', "fig.savefig(path, dpi=80)", 'open(p, "w")', "json.dump(x, f)",
                 "torch.save(rows, p)", 'path.open("wb")'):
        assert DIRECT_WRITE.search(line), line
    assert not DIRECT_WRITE.search('json.loads(path.read_text())') and not DIRECT_WRITE.search('open(p, "rb")')

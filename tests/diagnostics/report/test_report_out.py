"""``attnkit report --out``: a typo never destroys a file (weights, configs, folders); an earlier report is replaced."""

import pytest

from attnkit.cli.main import main

ARGS = ["report", "nano", "--text", "hi", "--no-doctor"]


def test_an_existing_file_that_is_not_a_report_is_kept(tmp_path, capsys):
    """The regression: --out model.safetensors replaced a model's weights with the page."""
    weights = tmp_path / "model.html"
    weights.write_bytes(b"\x00weights")
    assert main([*ARGS, "--out", str(weights)]) == 2
    err = capsys.readouterr().err
    assert "exists and is not an attnkit report; pick another out, or pass --overwrite to replace it." in err
    assert weights.read_bytes() == b"\x00weights"
    assert main([*ARGS, "--out", str(weights), "--overwrite"]) == 0
    assert weights.read_text().startswith("<!DOCTYPE html>")


def test_an_earlier_report_is_replaced(tmp_path):
    out = tmp_path / "r.html"
    assert main([*ARGS, "--out", str(out)]) == 0
    first = out.read_text()
    assert main([*ARGS[:3], "hello there", "--no-doctor", "--out", str(out)]) == 0
    assert out.read_text() != first


@pytest.mark.parametrize("name,message", [
    ("model.safetensors", "does not end in .html; the report is an HTML page: use e.g."),
    ("config.json", "does not end in .html"),
    ("folder", "is a folder; give a file name such as"),
])
def test_names_that_are_not_pages_are_refused(tmp_path, capsys, name, message):
    out = tmp_path / name
    if name == "folder":
        out.mkdir()
    else:
        out.write_text("{}")
    assert main([*ARGS, "--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert out.is_dir() if name == "folder" else out.read_text() == "{}"

"""One place for writing an output file safely (``attnkit._files``), used by the report, the head-importance
figure (``attnkit heads --out``, ``head_importance(...).figure``) and ``save_heatmaps``."""

from __future__ import annotations

import os

import pytest
import torch

from attnkit import _files
from attnkit.cli.main import main
from attnkit.diagnostics.capture import capture
from attnkit.diagnostics.importance import head_importance
from attnkit.diagnostics.viz import PNG, save_heatmaps
from attnkit.errors import AttnkitTypeError, AttnkitValueError, EnvironmentUnsupportedError
from attnkit.models.builders import build_lm

KIND = _files.OutputKind("thing", (".txt",), "a text file", b"made-by-attnkit")


def test_rules(tmp_path):
    with pytest.raises(AttnkitTypeError, match="out must be a path to a .txt file, got 3"):
        _files.check_out(3, KIND)
    with pytest.raises(AttnkitValueError, match=r"is a folder; give a file name such as '.*thing\.txt'"):
        _files.check_out(tmp_path, KIND)
    with pytest.raises(AttnkitValueError, match=r"--out '.*a\.png' does not end in \.txt; the thing is a text file"):
        _files.check_out(tmp_path / "a.png", KIND, option="--out")
    theirs = tmp_path / "theirs.txt"
    theirs.write_text("precious")
    with pytest.raises(AttnkitValueError, match="exists and is not an attnkit thing; pick another out, or pass "
                                                r"overwrite=True to replace it\.$"):
        _files.check_out(theirs, KIND)
    assert _files.check_out(theirs, KIND, overwrite=True) == theirs
    (tmp_path / "link.txt").symlink_to(theirs)
    with pytest.raises(AttnkitValueError, match="is a symbolic link .* the thing is never written through a link"):
        _files.check_out(tmp_path / "link.txt", KIND)
    _files.write_atomic(_files.check_out(tmp_path / "link.txt", KIND, True), b"made-by-attnkit 1", KIND)
    assert theirs.read_text() == "precious" and not (tmp_path / "link.txt").is_symlink()
    assert _files.check_out(tmp_path / "link.txt", KIND) == tmp_path / "link.txt"  # ours now: no overwrite needed
    assert (tmp_path / "link.txt").stat().st_mode & 0o777 == 0o666 & ~_umask()
    os.mkfifo(tmp_path / "pipe.txt")
    with pytest.raises(AttnkitValueError, match=r"is a FIFO \(named pipe\), not a regular file"):
        _files.check_out(tmp_path / "pipe.txt", KIND, True)
    with pytest.raises(AttnkitValueError, match="is not valid UTF-8"):
        _files.check_out(tmp_path / "\udcff.txt", KIND)
    with pytest.raises(AttnkitValueError, match="cannot be used: "):
        _files.check_out(theirs / "under-a-file.txt", KIND)
    with pytest.raises(EnvironmentUnsupportedError, match=r"could not write the thing to .*nothing was changed"):
        _files.write_atomic(theirs / "x.txt", b"", KIND)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_heads_never_overwrites_a_png_it_did_not_write(tmp_path, capsys):
    photo = tmp_path / "holiday.png"
    photo.write_bytes(b"\x89PNG\r\n\x1a\nmy photo")
    assert main(["heads", "nano", "--text", "hi", "--out", str(photo)]) == 2
    assert f"--out {str(photo)!r} exists and is not an attnkit figure" in capsys.readouterr().err
    assert photo.read_bytes().endswith(b"my photo")
    (tmp_path / "link.png").symlink_to(photo)
    assert main(["heads", "nano", "--text", "hi", "--out", str(tmp_path / "link.png")]) == 2
    assert "the figure is never written through a link" in capsys.readouterr().err
    out = tmp_path / "heads.png"
    assert main(["heads", "nano", "--text", "hi", "--out", str(out)]) == 0
    assert main(["heads", "nano", "--text", "hi", "--out", str(out)]) == 0  # its own earlier figure: replaced
    assert main(["heads", "nano", "--text", "hi", "--out", str(tmp_path / "link.png"), "--overwrite"]) == 0
    assert photo.read_bytes().endswith(b"my photo") and not (tmp_path / "link.png").is_symlink()


def test_importance_figure_and_heatmaps_follow_the_rules(tmp_path):
    model = build_lm("nano").eval()
    tokens = torch.randint(0, 257, (1, 6))
    theirs = tmp_path / "f.png"
    theirs.write_bytes(b"not ours")
    result = head_importance(model, tokens)
    with pytest.raises(AttnkitValueError, match="path '.*f.png' exists and is not an attnkit figure"):
        result.figure(theirs)
    result.figure(theirs, overwrite=True)
    assert PNG.marker in theirs.read_bytes()[:4096]
    with capture(model) as cap:
        model(tokens)
    folder = tmp_path / "attn"
    folder.mkdir()
    (folder / "blocks.0.attn.png").write_bytes(b"someone else's")
    with pytest.raises(AttnkitValueError, match="blocks.0.attn.png' exists and is not an attnkit figure"):
        save_heatmaps(cap, folder)
    assert (folder / "blocks.0.attn.png").read_bytes() == b"someone else's"
    assert len(save_heatmaps(cap, folder, overwrite=True)) == 2 and len(save_heatmaps(cap, folder)) == 2


def test_save_figures_and_plot_paths_follow_the_rules(tmp_path):
    from attnkit.diagnostics.viz import metric_bars, save_figures

    model = build_lm("nano").eval()
    (tmp_path / "grid.png").write_bytes(b"someone else's")
    with pytest.raises(AttnkitValueError, match=r"out_dir '.*grid\.png' exists and is not an attnkit figure"):
        save_figures(model, "hello", tmp_path)
    assert not (tmp_path / "heatmap.png").exists()  # checked before any figure is drawn
    paths = save_figures(model, "hello", tmp_path, overwrite=True)
    assert all(PNG.marker in p.read_bytes()[:4096] for p in paths.values())
    assert save_figures(model, "hello", tmp_path).keys() == paths.keys()  # its own figures: replaced
    (tmp_path / "bars.png").write_bytes(b"x")
    with pytest.raises(AttnkitValueError, match="path '.*bars.png' exists and is not an attnkit figure"):
        metric_bars([{"layer": 0, "head": 0, "entropy": 1.0}], path=tmp_path / "bars.png")

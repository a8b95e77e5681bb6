"""Static figures: token labels on both axes, a colour bar, the mask told apart from zero weight, files written."""

import matplotlib
import numpy as np
import pytest
import torch

from attnkit.diagnostics import capture
from attnkit.diagnostics.report import tokenize
from attnkit.diagnostics.viz import FORBIDDEN, head_grid, heatmap, mask_picture, metric_bars, save_figures, save_heatmaps
from attnkit.errors import AttnkitValueError
from conftest import TEXT, small_model

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def test_heatmap_has_token_labels_colour_bar_and_mask():
    w = torch.softmax(torch.randn(5, 5), -1).tril()
    allowed = torch.ones(5, 5, dtype=torch.bool).tril()
    labels = ["a", "b", "c", "d", "e"]
    ax = heatmap(w, labels=labels, allowed=allowed, title="t")
    fig = ax.figure
    assert [t.get_text() for t in ax.get_xticklabels()] == labels
    assert [t.get_text() for t in ax.get_yticklabels()] == labels
    assert len(fig.axes) == 2 and fig.axes[1].get_ylabel() == "attention probability"  # the colour bar
    image = ax.get_images()[0]
    data = image.get_array()
    assert data.mask[0, 1] and not data.mask[1, 0]  # forbidden cells are masked (drawn grey), not zero
    rgba = image.to_rgba(data)
    assert matplotlib.colors.to_hex(rgba[0, 1]) == FORBIDDEN and matplotlib.colors.to_hex(rgba[1, 1]) != FORBIDDEN
    assert len(ax.patches) == 10  # one hatched patch per forbidden cell
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["forbidden by the mask", "allowed, p = 0"]
    plt.close(fig)


def test_heatmap_thins_labels_on_long_inputs():
    ax = heatmap(torch.full((200, 200), 1 / 200), labels=[str(i) for i in range(200)])
    assert 30 <= len(ax.get_xticklabels()) <= 64
    plt.close(ax.figure)


def test_mask_picture_counts_pairs():
    ax = mask_picture(torch.ones(4, 4, dtype=torch.bool).tril(), labels=list("wxyz"))
    assert ax.get_title() == "mask: 10 of 16 pairs may attend"
    assert [t.get_text() for t in ax.get_xticklabels()] == list("wxyz")
    plt.close(ax.figure)


def test_head_grid_and_metric_bars():
    layers = [torch.softmax(torch.randn(3, 6, 6), -1) for _ in range(2)]
    fig = head_grid(layers, names=["a", "b"], verdicts=[["healthy", "uniform", "collapsed"]] * 2)
    assert len([ax for ax in fig.axes if ax.get_visible()]) == 6
    assert fig.axes[0].get_title() == "head 0" and fig.axes[0].get_ylabel() == "a"
    plt.close(fig)
    table = [{"layer": l, "head": h, "entropy": 0.5 + h, "verdict": "healthy" if h else "collapsed"}
             for l in range(2) for h in range(3)]
    ax = metric_bars(table, "entropy")
    assert [p.get_height() for p in ax.patches] == [0.5, 1.5, 2.5] * 2
    assert [t.get_text() for t in ax.get_xticklabels()] == ["L0", "L1"]
    plt.close(ax.figure)
    with pytest.raises(AttnkitValueError, match="metric_bars: metric 'nope' is not in the table rows"):
        metric_bars(table, "nope")
    with pytest.raises(AttnkitValueError, match="head_grid needs at least one layer"):
        head_grid([])
    with pytest.raises(AttnkitValueError, match=r"weights must be a 2-d tensor \(Lq, Lk\)"):
        heatmap(torch.ones(2, 3, 3))


def test_save_figures_writes_pngs(tmp_path):
    paths = save_figures(small_model(), TEXT, tmp_path, layer=1, head=2)
    assert set(paths) == {"heatmap", "grid", "mask", "entropy"}
    for p in paths.values():
        assert p.read_bytes()[:4] == b"\x89PNG" and p.stat().st_size > 5000
    with pytest.raises(AttnkitValueError, match="layer=5, head=0 is outside the model's 3 layers x 4 heads"):
        save_figures(small_model(), TEXT, tmp_path, layer=5)


def test_save_heatmaps_labels_and_mask(tmp_path, monkeypatch):
    model = small_model()
    ids, labels = tokenize(model, "abcdef")
    saved = []
    real = matplotlib.figure.Figure.savefig

    def spy(self, *a, **k):
        saved.append(self)
        return real(self, *a, **k)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", spy)
    with capture(model) as cap:
        model(ids)
    paths = save_heatmaps(cap, tmp_path / "attn", labels=labels)
    assert paths == [tmp_path / "attn" / f"blocks.{i}.attn.png" for i in range(3)]
    ax = saved[0].axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == list("abcdef")
    assert np.ma.is_masked(ax.get_images()[0].get_array())  # the causal mask is drawn

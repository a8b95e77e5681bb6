"""Benchmark plots label every line in every panel, and each series keeps one colour across panels.

The old plots drew the legend on the first panel only while matplotlib's colour cycle restarted per panel, so a
series missing from one panel shifted the colours of the others (naive attention looked cheaper than attnkit in
``attention_memory.png``). These tests capture the figures as they are saved and read their lines back.
"""

import json
from pathlib import Path

import matplotlib
import pytest
from matplotlib.figure import Figure

from attnkit.bench import attention, linear

matplotlib.use("Agg")
RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


@pytest.fixture
def saved(monkeypatch):
    """Figures passed to ``Figure.savefig``, in order (the file is still written)."""
    figures = []
    real = Figure.savefig

    def spy(self, *args, **kwargs):
        figures.append(self)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", spy)
    return figures


def check_labels_and_colours(fig: Figure) -> dict[str, str]:
    """Every axis with lines has a legend naming exactly its lines; one colour per series label figure-wide."""
    colour_of: dict[str, str] = {}
    for ax in fig.axes:
        if not ax.lines:
            continue
        labels = [line.get_label() for line in ax.lines]
        legend = ax.get_legend()
        assert legend is not None, f"panel {ax.get_title()!r} draws {labels} without a legend"
        assert [t.get_text() for t in legend.get_texts()] == labels, ax.get_title()
        for handle, line in zip(legend.legend_handles, ax.lines):
            assert handle.get_color() == line.get_color(), f"legend colour differs from line {line.get_label()}"
        for line in ax.lines:
            name, colour = line.get_label(), matplotlib.colors.to_hex(line.get_color())
            assert colour_of.setdefault(name, colour) == colour, (
                f"series {name!r} is {colour} in panel {ax.get_title()!r} but {colour_of[name]} elsewhere")
    assert len(set(colour_of.values())) == len(colour_of), f"two series share a colour: {colour_of}"
    return colour_of


def test_attention_plots_from_committed_results(saved, tmp_path):
    payload = json.loads((RESULTS / "attention.json").read_text())
    paths = attention.plot(payload, tmp_path)
    assert [p.name for p in paths] == ["attention_time.png", "attention_fwd_time.png", "attention_memory.png"]
    assert all(p.stat().st_size > 0 for p in paths) and len(saved) == 3
    for fig in saved:
        colours = check_labels_and_colours(fig)
        assert {"attnkit", "sdpa_dense", "naive"} <= set(colours)


def test_series_missing_from_first_panel_keeps_its_colour(saved, tmp_path):
    """A contender absent from the first panel (the old colour-shift bug) still gets its own colour everywhere."""
    def row(case, n, who):
        return {"case": case, "n": n, "contenders": {w: {"fwd_ms": 1.0 + i, "fwdbwd_ms": 2.0 + i} for i, w in
                                                     enumerate(who)}}
    payload = {"rows": [row("a", 1, ["attnkit", "sdpa"]), row("a", 2, ["attnkit", "sdpa"]),
                        row("b", 1, ["attnkit", "naive", "sdpa"]), row("b", 2, ["attnkit", "naive", "sdpa"])]}
    attention.plot(payload, tmp_path, name="synthetic")
    colours = check_labels_and_colours(saved[0])
    assert set(colours) == {"attnkit", "sdpa", "naive"}
    panel_b = saved[0].axes[1]
    assert [line.get_label() for line in panel_b.lines] == ["attnkit", "naive", "sdpa"]


def test_linear_plot_from_committed_results(saved, tmp_path):
    payload = json.loads((RESULTS / "linear.json").read_text())
    linear.plot(payload, tmp_path / "linear.png")
    assert (tmp_path / "linear.png").stat().st_size > 0
    colours = check_labels_and_colours(saved[0])
    assert {"linear", "sdpa", "attnkit", "softmax_cache", "linear_state"} == set(colours)
    assert [ax.get_xlabel() for ax in saved[0].axes] == ["N", "N", "context length"]


def test_replot_writes_next_to_results_and_refuses_unknown(tmp_path):
    from attnkit.bench.plots import replot

    src = tmp_path / "attention_window.json"
    src.write_text((RESULTS / "attention_window.json").read_text())
    assert [p.name for p in replot(src)] == ["attention_window_time.png", "attention_window_fwd_time.png",
                                             "attention_window_memory.png"]
    other = tmp_path / "decode.json"
    other.write_text(json.dumps({"benchmark": "decode"}))
    with pytest.raises(ValueError, match=r"no plot for results file .*decode.json.*benchmark 'decode'"):
        replot(other)

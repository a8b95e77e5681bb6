"""Benchmark plots that cannot mislabel a line: one colour, marker and line style per series for the whole
figure (not per panel), and a legend on every panel naming exactly the lines drawn in it.

Matplotlib's colour cycle restarts on every axis, so a series that is missing from one panel shifts the
colours of all the series after it; a legend drawn on the first panel only then names the wrong lines in the
others. Every bench plot goes through :func:`line_panels`, which fixes the style of each series up front.

Data shape: ``panels`` maps a panel title to ``{series name: [(x, y), ...]}``.

``attnkit bench plots benchmarks/results/*.json`` redraws the committed plots from recorded results (no re-run).
"""


from __future__ import annotations

import argparse
import json
import math
import textwrap
from pathlib import Path

SUMMARY = "redraw the plots of recorded results (benchmarks/results/*.json) without re-running"

_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
            "#17becf")
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")
_LINES = ("-", "--", "-.", ":")


#: contenders that appear in several suites keep the same style in every figure, not only within one
KNOWN_SERIES = ("attnkit", "sdpa_dense", "naive", "nn_mha", "sdpa_per_doc", "sdpa_causal_nobias", "flex",
                "attnkit_bf16", "linear", "softmax")


def series_styles(names) -> dict[str, dict]:
    """A fixed style per series name: the known contenders always get the same one (in every figure), others
    the next free one in first-seen order. Colour, marker and line style all differ between neighbours, and
    series drawn later are thinner with smaller markers, so two series on top of each other (equal values)
    both stay visible."""
    order = list(dict.fromkeys(names))
    taken, slot = set(), {}
    for name in order:
        if name in KNOWN_SERIES:
            slot[name] = KNOWN_SERIES.index(name)
            taken.add(slot[name])
    free = (i for i in range(10**6) if i not in taken)
    for name in order:
        if name not in slot:
            slot[name] = next(free)
    return {name: {"color": _COLOURS[i % len(_COLOURS)], "marker": _MARKERS[i % len(_MARKERS)],
                   "linestyle": _LINES[i % len(_LINES)], "linewidth": max(0.8, 2.4 - 0.4 * rank),
                   "markersize": max(3.0, 7.0 - rank)} for rank, (name, i) in enumerate(slot.items())}


def line_panels(panels: dict[str, dict[str, list[tuple[float, float]]]], path: Path | str, *,
                ylabel: str | dict[str, str], xlabel: str | dict[str, str] = "N", log: str = "both",
                ncols: int | None = None, title: str | None = None, dpi: int = 90,
                panel_size: tuple[float, float] = (4.0, 3.5)) -> Path:
    """Draw one line panel per entry of ``panels`` and save the figure to ``path``.

    ``ylabel``/``xlabel``: one label, or one per panel title; ``log``: "both" (log-log), "x", "y" or "none".
    Series keep one style across all panels; each panel's legend lists the series drawn in it. Returns the path.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, NullFormatter, ScalarFormatter

    styles = series_styles(name for series in panels.values() for name in series)
    n = len(panels)
    ncols = ncols or (n if n <= 3 else math.ceil(n / 2))
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(panel_size[0] * ncols, panel_size[1] * nrows), squeeze=False)
    for ax, (panel, series) in zip(axes.flat, panels.items()):
        for name, pts in series.items():
            if pts:
                xs, ys = zip(*sorted(pts))
                ax.plot(xs, ys, label=name, **styles[name])
        if log in ("both", "x"):
            ax.set_xscale("log")
            measured = sorted({x for pts in series.values() for x, _ in pts})
            if 0 < len(measured) <= 8:  # label exactly the measured lengths (a decade tick alone hides them)
                ax.xaxis.set_major_locator(FixedLocator(measured))
                ax.xaxis.set_major_formatter(ScalarFormatter())
            ax.xaxis.set_minor_formatter(NullFormatter())  # minor labels (2x10^3, 3x10^3, ...) overlap
        if log in ("both", "y"):
            ax.set_yscale("log")
        ax.set(title=panel, xlabel=_label(xlabel, panel), ylabel=_label(ylabel, panel))
        ax.grid(True, which="both", alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    if title:  # wrapped to the figure's width (~9 characters per inch at the default size): never cut at the edges
        fig.suptitle("\n".join(textwrap.wrap(title, max(24, int(fig.get_figwidth() * 9)))))
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def _label(label: str | dict[str, str], panel: str) -> str:
    return label if isinstance(label, str) else label.get(panel, "")


def replot(results: Path | str) -> list[Path]:
    """Redraw the plots of one recorded results file next to it, through the ``replot`` of the suite that wrote
    it (:func:`attnkit.bench.replotter`); returns the paths written."""
    from attnkit.bench import replotter

    results = Path(results)
    payload = json.loads(results.read_text())
    suite = payload.get("benchmark", results.stem)
    redraw = replotter(suite)
    if redraw is None:
        raise ValueError(f"replot: no plot for results file {str(results)!r} (benchmark {suite!r}); expected the "
                         "results of a suite that defines replot (attention*, linear, cp, dispatch)")
    return redraw(payload, results)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", nargs="+", type=Path, help="benchmarks/results/*.json files to redraw")


def run(args: argparse.Namespace) -> int:
    for results in args.results:
        for path in replot(results):
            print(f"wrote {path}")
    return 0

"""Static attention figures (matplotlib, PNG): heatmaps with token labels and a colour bar, a layers x heads grid,
mask pictures and per-head metric bars. The same colours as the HTML report: white = allowed but unused,
blue = weight, hatched grey = forbidden by the mask.

>>> from attnkit.diagnostics import capture
>>> from attnkit.diagnostics.viz import save_heatmaps, save_figures
>>> with capture(model) as cap:
...     model(tokens)
>>> paths = save_heatmaps(cap, "out/attn", labels=labels)   # out/attn/blocks.0.attn.png, ... (one per layer)
>>> paths = save_figures(model, "some text", "out/figures")  # heatmap, grid, mask, metric bars of one input

Shape legend: B batch, H heads, h captured heads, r captured rows, L / Lq / Lk lengths.
"""

from __future__ import annotations

from pathlib import Path

import torch

from attnkit import _files
from attnkit.errors import AttnkitValueError, describe

CMAP_COLOURS = ["#ffffff", "#edf8b1", "#7fcdbb", "#2c7fb8", "#081d58"]  # the report's colour scale
CMAP_STOPS = [0.0, 0.12, 0.4, 0.7, 1.0]
FORBIDDEN = "#bdbdbd"
VERDICT_COLOURS = {"healthy": "#1e8449", "uniform": "#d68910", "collapsed": "#c0392b", "empty": "#888888"}


#: a PNG figure attnkit writes: matplotlib's ``Software`` text chunk says attnkit, so an earlier one is recognised
PNG = _files.OutputKind("figure", (".png",), "a PNG image", b"Software\x00attnkit")


def save_png(fig, path: str | Path, *, overwrite: bool = False, dpi: int = 100, option: str = "path") -> Path:
    """Save ``fig`` as a PNG at ``path`` by the rules of :mod:`attnkit._files`: a ``.png`` name, never through a
    link, never over a file attnkit did not write unless ``overwrite``, atomically."""
    path = _files.check_out(path, PNG, overwrite, option=option)
    return _files.write_atomic(path, lambda f: fig.savefig(f, format="png", dpi=dpi,
                                                           metadata={"Software": "attnkit"}), PNG)


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def colormap():
    """The report's colour map (white for 0) with forbidden (masked) cells drawn in grey."""
    from matplotlib.colors import LinearSegmentedColormap

    return LinearSegmentedColormap.from_list("attnkit", list(zip(CMAP_STOPS, CMAP_COLOURS))).with_extremes(bad=FORBIDDEN)


def _matrix(x, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise AttnkitValueError(f"{name} must be a 2-d tensor (Lq, Lk), got {describe(x)}; pick one head, e.g. "
                                "weights[0, h].")
    return x.detach().float().cpu()


def _tick_labels(ax, labels_q, labels_k, max_labels: int = 64) -> None:
    for labels, setter, rot in ((labels_q, ax.set_yticks, 0), (labels_k, ax.set_xticks, 90)):
        if labels is None:
            continue
        every = max(1, -(-len(labels) // max_labels))  # ceil: at most max_labels ticks
        idx = list(range(0, len(labels), every))
        setter(idx, [f"{labels[i]}" for i in idx], rotation=rot, fontsize=7 if len(idx) > 24 else 8)


def heatmap(weights: torch.Tensor, *, labels=None, key_labels=None, allowed: torch.Tensor | None = None,
            title: str | None = None, ax=None, vmax: float | None = 1.0, colorbar: bool = True):
    """Draw one head's probabilities ``(Lq, Lk)`` with token labels on both axes and a colour bar.

    ``allowed`` ``(Lq, Lk)`` bool: forbidden cells (False) are hatched grey, so masked keys never look like
    zero weight. ``labels`` label the queries (and the keys, unless ``key_labels``). Returns the axes.
    """
    import matplotlib.patches as mpatches
    import numpy as np

    plt = _plt()
    w = _matrix(weights, "weights")
    if ax is None:
        side = min(12.0, 2.5 + 0.22 * w.shape[1])
        _, ax = plt.subplots(figsize=(side + 1.2, min(12.0, 2.5 + 0.22 * w.shape[0])))
    data = w.numpy().astype(float)
    if allowed is not None:
        allowed = _matrix(allowed, "allowed").bool().numpy()
        data = np.ma.masked_where(~allowed, data)
    image = ax.imshow(data, cmap=colormap(), vmin=0.0, vmax=vmax if vmax is not None else float(w.max()),
                      interpolation="nearest", aspect="auto")
    if allowed is not None and 0 < (~allowed).sum() <= 5000:  # hatching each forbidden cell (grey alone past that)
        ys, xs = np.nonzero(~allowed)
        for y, x in zip(ys, xs):
            ax.add_patch(mpatches.Rectangle((x - 0.5, y - 0.5), 1, 1, fill=False, hatch="///", edgecolor="#8d8d8d",
                                            linewidth=0))
    _tick_labels(ax, labels, key_labels if key_labels is not None else labels)
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query (attending)")
    if title:
        ax.set_title(title, fontsize=10)
    if colorbar:
        cbar = ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.03)
        cbar.set_label("attention probability")
        if allowed is not None:
            ax.legend(handles=[mpatches.Patch(facecolor=FORBIDDEN, hatch="///", edgecolor="#8d8d8d",
                                              label="forbidden by the mask"),
                               mpatches.Patch(facecolor="white", edgecolor="#999", label="allowed, p = 0")],
                      loc="upper center", bbox_to_anchor=(0.5, -0.08 if labels is None else -0.12), ncol=2, fontsize=8,
                      frameon=False)
    return ax


def mask_picture(allowed: torch.Tensor, *, labels=None, title: str = "mask", ax=None):
    """A boolean mask ``(Lq, Lk)`` as a picture: blue = may attend, hatched grey = forbidden. Returns the axes."""
    import matplotlib.patches as mpatches
    from matplotlib.colors import ListedColormap

    plt = _plt()
    m = _matrix(allowed, "allowed").bool()
    if ax is None:
        _, ax = plt.subplots(figsize=(min(10.0, 2.0 + 0.2 * m.shape[1]), min(10.0, 2.0 + 0.2 * m.shape[0])))
    ax.imshow(m.numpy(), cmap=ListedColormap([FORBIDDEN, "#2c7fb8"]), vmin=0, vmax=1, interpolation="nearest")
    _tick_labels(ax, labels, labels)
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    ax.set_title(f"{title}: {int(m.sum())} of {m.numel()} pairs may attend", fontsize=10)
    ax.legend(handles=[mpatches.Patch(color="#2c7fb8", label="may attend"),
                       mpatches.Patch(color=FORBIDDEN, label="forbidden")], loc="upper center",
              bbox_to_anchor=(0.5, -0.12 if labels is None else -0.2), ncol=2, fontsize=8, frameon=False)
    return ax


def head_grid(layers: list[torch.Tensor], *, names: list[str] | None = None, verdicts: list[list[str]] | None = None,
              path: str | Path | None = None, overwrite: bool = False):
    """A layers x heads grid of thumbnails from one ``(H, L, L)`` tensor per layer; a border colour per verdict.
    Returns the figure (saved to ``path`` when given, by :func:`save_png`'s rules)."""
    plt = _plt()
    if not layers:
        raise AttnkitValueError("head_grid needs at least one layer of weights (H, L, L).")
    H = max(w.shape[0] for w in layers)
    fig, axes = plt.subplots(len(layers), H, figsize=(1.3 * H + 1, 1.3 * len(layers) + 0.6), squeeze=False)
    cmap = colormap()
    for l, w in enumerate(layers):
        for h in range(H):
            ax = axes[l, h]
            ax.set_xticks([])
            ax.set_yticks([])
            if h >= w.shape[0]:
                ax.set_visible(False)
                continue
            ax.imshow(w[h].detach().float().cpu().numpy() ** 0.5, cmap=cmap, vmin=0, vmax=1, interpolation="nearest")
            if verdicts is not None:
                for spine in ax.spines.values():
                    spine.set_edgecolor(VERDICT_COLOURS.get(verdicts[l][h], "#888"))
                    spine.set_linewidth(2)
            if l == 0:
                ax.set_title(f"head {h}", fontsize=8)
            if h == 0:
                ax.set_ylabel(names[l] if names else f"layer {l}", fontsize=7)
    fig.suptitle("attention per head (colour: sqrt p; border: verdict)", fontsize=9)
    fig.tight_layout()
    if path is not None:
        save_png(fig, path, overwrite=overwrite)
    return fig


def metric_bars(table: list[dict], metric: str = "entropy", *, path: str | Path | None = None, ax=None,
                overwrite: bool = False):
    """One bar per head (grouped by layer) of ``metric`` from report rows (``layer``, ``head``, ``verdict`` and the
    metric), coloured by verdict. Returns the axes (the figure saved to ``path`` when given, by :func:`save_png`'s
    rules)."""
    import matplotlib.patches as mpatches

    plt = _plt()
    if not table or metric not in table[0]:
        raise AttnkitValueError(f"metric_bars: metric {metric!r} is not in the table rows "
                                f"({sorted(table[0]) if table else 'no rows'}); pick one of the per-head metrics.")
    if ax is None:
        _, ax = plt.subplots(figsize=(max(6.0, 0.22 * len(table) + 2), 3.4))
    xs, values, colours, ticks = [], [], [], []
    x = 0
    for l in sorted({r["layer"] for r in table}):
        rows = [r for r in table if r["layer"] == l]
        ticks.append((x + (len(rows) - 1) / 2, f"L{l}"))
        for r in rows:
            xs.append(x)
            values.append(float("nan") if r[metric] is None else r[metric])
            colours.append(VERDICT_COLOURS.get(r.get("verdict", "healthy"), "#888"))
            x += 1
        x += 1  # a gap between layers
    ax.bar(xs, values, color=colours, width=0.8)
    ax.set_xticks([t for t, _ in ticks], [n for _, n in ticks])
    ax.set_ylabel(metric.replace("_", " "))
    ax.set_title(f"{metric.replace('_', ' ')} per head (bars grouped by layer)", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    present = sorted({r.get("verdict", "healthy") for r in table})
    ax.legend(handles=[mpatches.Patch(color=VERDICT_COLOURS.get(v, "#888"), label=v) for v in present], fontsize=8)
    if path is not None:
        ax.figure.tight_layout()
        save_png(ax.figure, path, overwrite=overwrite)
    return ax


def save_heatmaps(cap, folder: str | Path, *, batch_index: int = 0, max_heads: int = 16, labels=None,
                  overwrite: bool = False) -> list[Path]:
    """Write the last record of each layer of ``cap`` (a :class:`capture`) as ``{folder}/{layer}.png``: one
    labelled heatmap per head with the mask drawn and a colour bar. ``folder`` is created if missing; each file
    follows :func:`save_png`'s rules (an existing PNG attnkit did not write is refused unless ``overwrite``)."""
    plt = _plt()
    layers = cap.by_layer()
    if not layers:
        raise AttnkitValueError("the capture holds no records; run the model inside `with capture(model) as cap:` "
                                "before saving heatmaps.")
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise AttnkitValueError(f"save_heatmaps(folder={str(folder)!r}): that path is a file, not a folder; "
                                "pass a folder (one PNG per layer is written inside it).")
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for layer, records in layers.items():
        record = records[-1]
        weights = record.weights[batch_index].float().cpu()  # (h, r, Lk)
        allowed = None
        if record.allowed is not None:
            a = record.allowed
            allowed = a[min(batch_index, a.shape[0] - 1)].expand(weights.shape).cpu()  # (h, r, Lk)
        heads = record.heads[:max_heads]
        side = min(6.0, 2.0 + 0.16 * weights.shape[-1])
        fig, axes = plt.subplots(1, len(heads), figsize=((side + 1.3) * len(heads), side + 1.2), squeeze=False)
        q_labels = None if labels is None else [labels[r] for r in record.rows]
        for ax, i, head in zip(axes[0], range(len(heads)), heads):
            heatmap(weights[i], labels=q_labels, key_labels=labels, allowed=None if allowed is None else allowed[i],
                    title=f"head {head}", ax=ax)
        fig.suptitle(layer or "<module>", fontsize=10)
        fig.tight_layout()
        try:
            paths.append(save_png(fig, folder / f"{layer or 'module'}.png", overwrite=overwrite, dpi=80))
        finally:
            plt.close(fig)
    return paths


def save_figures(model, tokens, out_dir: str | Path, *, labels=None, tokenizer=None, layer: int = 0, head: int = 0,
                 metric: str = "entropy", overwrite: bool = False) -> dict[str, Path]:
    """The static figures of one input: ``heatmap.png`` (layer/head), ``grid.png``, ``mask.png`` and
    ``{metric}.png``, under ``out_dir``, each by :func:`save_png`'s rules (an existing PNG attnkit did not write is
    refused unless ``overwrite``). Returns ``{figure: path}``."""
    from attnkit.diagnostics.report import _as_tokens
    from attnkit.diagnostics.report.collect import collect
    from attnkit.diagnostics.report.page import metrics_table

    plt = _plt()
    ids, labels = _as_tokens(model, tokens, labels, tokenizer)
    data = collect(model, ids, labels)
    if not 0 <= layer < len(data.layers) or not 0 <= head < data.layers[layer].num_heads:
        raise AttnkitValueError(f"layer={layer}, head={head} is outside the model's {len(data.layers)} layers x "
                                f"{data.layers[0].num_heads} heads; pick indices from 0.")
    out = Path(out_dir)
    for name in ("heatmap", "grid", "mask", metric):  # every name before any figure is drawn
        _files.check_out(out / f"{name}.png", PNG, overwrite, option="out_dir")
    out.mkdir(parents=True, exist_ok=True)
    chosen = data.layers[layer]
    allowed = None if chosen.allowed is None else chosen.allowed[min(head, chosen.allowed.shape[0] - 1)]
    paths = {}
    ax = heatmap(chosen.weights[head], labels=labels, allowed=allowed, title=f"layer {layer} ({chosen.name}), head {head}")
    ax.figure.tight_layout()
    save_png(ax.figure, out / "heatmap.png", overwrite=overwrite)
    plt.close(ax.figure)
    paths["heatmap"] = out / "heatmap.png"
    fig = head_grid([x.weights for x in data.layers], names=[x.name for x in data.layers],
                    verdicts=[x.verdicts for x in data.layers], path=out / "grid.png", overwrite=overwrite)
    plt.close(fig)
    paths["grid"] = out / "grid.png"
    if allowed is not None:
        ax = mask_picture(allowed, labels=labels, title=f"mask of {chosen.name}")
        ax.figure.tight_layout()
        save_png(ax.figure, out / "mask.png", overwrite=overwrite)
        plt.close(ax.figure)
        paths["mask"] = out / "mask.png"
    ax = metric_bars(metrics_table(data), metric, path=out / f"{metric}.png", overwrite=overwrite)
    plt.close(ax.figure)
    paths[metric] = out / f"{metric}.png"
    return paths

"""The head-importance panel: a layers x heads table of how much each head matters, as measured elsewhere.

The report only draws what it is given: an object with ``.scores`` (layers, heads) floats (e.g. the loss change when
the head is ablated), ``.objective`` (what was measured, e.g. "next-token loss"), ``.ablation`` (how a head was
removed, e.g. "zero") and ``.baseline`` (the objective with every head in place), such as
``ak.diagnostics.head_importance`` (``attnkit.diagnostics.importance``) returns: NaN where a layer has fewer
heads than the widest one, or did not run. Cells are coloured by score (largest = darkest); every
string is escaped.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass

from attnkit.errors import AttnkitTypeError, AttnkitValueError, describe


@dataclass
class Importance:
    """The panel's data: ``scores`` (layers, heads) as nested lists of floats (NaN allowed: shown as n/a)."""

    scores: list[list[float]]
    objective: str
    ablation: str
    baseline: float | None


def importance_panel(obj) -> Importance | None:
    """Read ``obj`` (None, or anything with ``.scores`` (layers, heads), ``.objective``, ``.ablation``, ``.baseline``)."""
    if obj is None:
        return None
    missing = [a for a in ("scores", "objective", "ablation", "baseline") if not hasattr(obj, a)]
    if missing:
        raise AttnkitTypeError(f"head_importance must have .scores (layers, heads), .objective, .ablation and .baseline "
                               f"(ak.diagnostics.head_importance returns one); {describe(obj)} lacks "
                               f"{', '.join('.' + m for m in missing)}.")
    scores = obj.scores
    scores = scores.tolist() if hasattr(scores, "tolist") else scores
    try:
        rows = [[float(x) for x in row] for row in scores]
    except (TypeError, ValueError) as exc:
        raise AttnkitValueError(f"head_importance.scores must be a (layers, heads) array of floats, got "
                                f"{describe(obj.scores)}.") from exc
    if not rows or len({len(r) for r in rows}) != 1 or not rows[0]:
        raise AttnkitValueError(f"head_importance.scores must be a non-empty (layers, heads) array, got rows of "
                                f"lengths {[len(r) for r in rows]}.")
    baseline = None if obj.baseline is None else float(obj.baseline)
    return Importance(rows, str(obj.objective), str(obj.ablation), baseline)


def check_importance_shape(importance: Importance, data) -> None:
    """The scores must have one row per attention layer and one column per query head of the report's widest layer
    (narrower layers' extra columns are NaN, as ``head_importance`` writes them)."""
    heads = [layer.num_heads for layer in data.layers]
    rows, width = len(importance.scores), len(importance.scores[0])
    if (rows, width) != (len(heads), max(heads)):
        raise AttnkitValueError(f"head_importance.scores has shape ({rows}, {width}) but the model has {len(heads)} "
                                f"attention layers with {heads} heads; compute it on the same model.")


def _colour(t: float) -> str:
    """0..1 -> white to the report's navy (the heatmap's end colours), as CSS."""
    lo, hi = (255, 255, 255), (8, 29, 88)
    r, g, b = (round(a + t * (c - a)) for a, c in zip(lo, hi))
    return f"rgb({r},{g},{b})"


def importance_html(importance: Importance | None, layer_names: list[str]) -> str:
    """The panel as an HTML table (layers as rows, heads as columns), or "" when there is none."""
    if importance is None:
        return ""
    finite = [x for row in importance.scores for x in row if math.isfinite(x)]
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 1.0)
    span = hi - lo if hi > lo else 1.0
    head = "".join(f"<th>h{h}</th>" for h in range(len(importance.scores[0])))
    body = []
    for l, row in enumerate(importance.scores):
        cells = []
        for h, x in enumerate(row):
            if not math.isfinite(x):
                cells.append(f'<td data-layer="{l}" data-head="{h}" class="na">n/a</td>')
                continue
            t = (x - lo) / span
            cells.append(f'<td data-layer="{l}" data-head="{h}" data-score="{x!r}" style="background:{_colour(t)};'
                         f'color:{"#fff" if t > 0.55 else "#1d2330"}" title="layer {l} head {h}: {x:.4g}">{x:.3g}</td>')
        name = html.escape(layer_names[l] if l < len(layer_names) else str(l))
        body.append(f'<tr><th class="text">L{l} {name}</th>{"".join(cells)}</tr>')
    base = "" if importance.baseline is None else f"; with every head: {importance.baseline:.4g}"
    return (f'<section id="importance-section"><h2>Head importance</h2><p class="note">Change in '
            f'{html.escape(importance.objective)} when a head is removed ({html.escape(importance.ablation)} '
            f'ablation){html.escape(base)}; darker = larger. Click a cell to open the head.</p>'
            f'<table id="importance"><thead><tr><th class="text">layer</th>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table></section>')

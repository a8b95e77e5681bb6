"""The report page: one self-contained HTML file (inline script and style, data embedded, a Content-Security-Policy
that forbids every network request) from :class:`~attnkit.diagnostics.report.collect.Collected` data.

The doctor's report, the training curves and the monitor's verdicts are rendered here as plain HTML/SVG; the
attention explorer (grid, heatmap, hover, filter, sortable table) is ``report.js`` drawing on canvases.
"""

from __future__ import annotations

import html
import json
import math
from importlib import resources

from attnkit.diagnostics.report.collect import Collected
from attnkit.diagnostics.report.encode import STEP, Buffer, encode_layer, encode_mask

COLUMNS = [("layer", "layer", "int"), ("name", "name", "text"), ("head", "head", "int"), ("kv", "kv head", "int"),
           ("entropy", "entropy (nats)", "num"), ("norm_entropy", "entropy / log n", "num"),
           ("max_prob", "max p", "num"), ("sink_mass", "sink (first token)", "num"),
           ("distance", "mean distance", "num"), ("prev_token", "previous token", "num"),
           ("masked_mass", "masked mass", "sci"), ("verdict", "verdict", "text")]


def _num(x: float) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(float(x), 6)


def metrics_table(data: Collected) -> list[dict]:
    """One row per (layer, head): ``layer``, ``name``, ``head``, ``kv`` (its KV head), the metrics and the verdict."""
    table = []
    for l, layer in enumerate(data.layers):
        G = layer.num_heads // layer.kv_heads
        for h in range(layer.num_heads):
            m = {k: _num(v[h]) for k, v in layer.metrics.items()}
            table.append({"layer": l, "name": layer.name, "head": h, "kv": h // G, **m, "verdict": layer.verdicts[h]})
    return table


def payload(data: Collected, *, dense_max: int = 512, top_k: int = 32) -> tuple[dict, str]:
    """``(meta, blob)``: the JSON the page reads and the base64 data buffer."""
    L = len(data.tokens)
    buf, masks, mask_ids = Buffer(), [], {}
    layers, verdicts = [], []
    sparse = top_k if dense_max < L and top_k < L else None
    for layer in data.layers:
        heads = encode_layer(buf, layer.weights, sparse)
        mask = None
        if layer.allowed is not None:
            mask = []
            for m in layer.allowed:  # (L, L) per mask head
                key = m.numpy().tobytes()
                if key not in mask_ids:
                    mask_ids[key] = len(masks)
                    masks.append(encode_mask(buf, m))
                mask.append(mask_ids[key])
        layers.append({"name": layer.name, "H": layer.num_heads, "Hkv": layer.kv_heads, "heads": heads, "mask": mask})
        verdicts.append(layer.verdicts)
    table = metrics_table(data)
    by_head = [[{k: r[k] for k in layer.metrics} for r in table if r["layer"] == l] for l, layer in enumerate(data.layers)]
    meta = {"L": L, "step": STEP, "labels": data.labels, "ids": data.tokens, "layers": layers, "masks": masks,
            "columns": COLUMNS, "table": table, "metricsByHead": by_head, "verdicts": verdicts,
            "sparse_top_k": sparse}
    return meta, buf.encoded()


def _asset(name: str) -> str:
    return resources.files("attnkit.diagnostics.report").joinpath(name).read_text(encoding="utf-8")


def _script_json(obj) -> str:
    """JSON safe inside a <script> element (no "</" sequence can close it)."""
    return json.dumps(obj, separators=(",", ":")).replace("</", "<\\/")


def doctor_html(doctor: dict | None) -> str:
    if doctor is None:
        return '<p class="note">The doctor was not run (pass doctor=True / leave out --no-doctor).</p>'
    rows = "".join(
        f'<tr><td class="text status-{html.escape(c["status"])}">{html.escape(c["status"])}</td>'
        f'<td class="text">{html.escape(c["name"])}</td><td class="evidence">{html.escape(c["evidence"])}'
        + (f'<br><b>fix:</b> {html.escape(c["fix"])}' if c.get("fix") else "") + "</td></tr>"
        for c in doctor["checks"])
    counts = ", ".join(f"{n} {s}" for s, n in doctor["counts"].items())
    return (f'<p class="note">{html.escape(doctor["subject"])} ({html.escape(doctor["kind"])}): {counts}'
            f'{" - no failures" if doctor["ok"] else " - FAILED"}</p>'
            f'<table id="doctor"><thead><tr><th class="text">status</th><th class="text">check</th>'
            f'<th class="text">evidence</th></tr></thead><tbody>{rows}</tbody></table>')


def _polyline_svg(series: dict[str, list[tuple[float, float]]], title: str, ylabel: str) -> str:
    """A small line chart as inline SVG (no script): one coloured polyline per series, with axes and a legend."""
    pts = [p for s in series.values() for p in s]
    if not pts:
        return ""
    W, H, pad_l, pad_b, pad_t, pad_r = 560, 260, 58, 34, 26, 130
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    x1, y1 = (x1 if x1 > x0 else x0 + 1), (y1 if y1 > y0 else y0 + 1)

    def X(x):
        return pad_l + (x - x0) / (x1 - x0) * (W - pad_l - pad_r)

    def Y(y):
        return H - pad_b - (y - y0) / (y1 - y0) * (H - pad_b - pad_t)

    colours = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"]
    parts = [f'<svg width="{W}" height="{H}" viewBox="0 0 {W} {H}" role="img" aria-label="{html.escape(title)}">',
             f'<text x="{pad_l}" y="16" font-size="13" font-weight="600">{html.escape(title)}</text>',
             f'<line x1="{pad_l}" y1="{H - pad_b}" x2="{W - pad_r}" y2="{H - pad_b}" stroke="#888"/>',
             f'<line x1="{pad_l}" y1="{pad_t}" x2="{pad_l}" y2="{H - pad_b}" stroke="#888"/>']
    for t in range(5):
        yv, xv = y0 + (y1 - y0) * t / 4, x0 + (x1 - x0) * t / 4
        parts.append(f'<text x="{pad_l - 6}" y="{Y(yv) + 4:.1f}" font-size="10" text-anchor="end">{yv:.3g}</text>')
        parts.append(f'<text x="{X(xv):.1f}" y="{H - pad_b + 14}" font-size="10" text-anchor="middle">{xv:.0f}</text>')
    parts.append(f'<text x="{(W - pad_r + pad_l) / 2}" y="{H - 4}" font-size="11" text-anchor="middle">step</text>')
    parts.append(f'<text x="12" y="{(H - pad_b + pad_t) / 2}" font-size="11" text-anchor="middle" '
                 f'transform="rotate(-90 12 {(H - pad_b + pad_t) / 2})">{html.escape(ylabel)}</text>')
    for i, (name, s) in enumerate(series.items()):
        colour = colours[i % len(colours)]
        line = " ".join(f"{X(x):.1f},{Y(y):.1f}" for x, y in s)
        marker = "".join(f'<circle cx="{X(x):.1f}" cy="{Y(y):.1f}" r="2.5" fill="{colour}"/>' for x, y in s) \
            if len(s) <= 60 else ""
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{line}"/>{marker}')
        ly = pad_t + 14 * i + 6
        parts.append(f'<line x1="{W - pad_r + 10}" y1="{ly}" x2="{W - pad_r + 28}" y2="{ly}" stroke="{colour}" '
                     f'stroke-width="2"/><text x="{W - pad_r + 32}" y="{ly + 4}" font-size="11">{html.escape(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def curves_html(records: list[dict] | None) -> str:
    """Training curves (loss, validation loss) and the attention monitor's verdicts from ``metrics.jsonl``."""
    if not records:
        return ""
    loss = {"train loss": [(r["step"], r["loss"]) for r in records if "loss" in r and "step" in r],
            "validation loss": [(r["step"], r["val_loss"]) for r in records if "val_loss" in r and "step" in r]}
    out = [_polyline_svg({k: v for k, v in loss.items() if v}, "loss", "cross-entropy (nats/token)")]
    checks = [r for r in records if "attention" in r and "step" in r]
    if checks:
        counts: dict[str, list] = {}
        for r in checks:
            tally: dict[str, int] = {}
            for info in r["attention"].values():
                for v in info.get("verdicts", []):
                    tally[v] = tally.get(v, 0) + 1
            for v in ("healthy", "uniform", "collapsed"):
                counts.setdefault(f"{v} heads", []).append((r["step"], tally.get(v, 0)))
        out.append(_polyline_svg(counts, "attention monitor: heads per verdict", "heads"))
        last = checks[-1]
        rows = "".join(
            f'<tr><td class="text">{html.escape(layer or "<model>")}</td>'
            + "".join(f'<td class="text verdict-{html.escape(v)}">{html.escape(v)}</td>' for v in info.get("verdicts", []))
            + "</tr>" for layer, info in last["attention"].items())
        out.append(f'<p class="note">Monitor verdicts per head at step {last["step"]} (the last check):</p>'
                   f'<table id="monitor"><tbody>{rows}</tbody></table>')
    return '<div class="curves">' + "".join(out) + "</div>"


#: the page may run its inline script and style and show data: images; nothing else (no request of any kind)
CSP = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:"

TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{csp}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>{title}</title>
<style>{css}</style></head>
<body>
<header><h1>{title}</h1><div class="facts">{facts}</div></header>
<main>
<div id="error" class="banner" style="display:none"></div>
<section><h2>Input tokens</h2>
<p class="note">Hover a token: its row (where it attends) and column (what attends to it) light up in the heatmap,
and the tokens it attends to are shaded.</p><div id="tokens"></div></section>
<section><h2>Attention</h2>{sparse_note}
<div class="controls">
<label>layers <input type="text" id="filter-layers" placeholder="e.g. 0,2-3"></label>
<label>heads <input type="text" id="filter-heads" placeholder="all"></label>
<label>verdict <select id="filter-verdict"><option value="">any</option><option>healthy</option><option>uniform</option>
<option>collapsed</option><option>empty</option></select></label>
<span id="filter-count" class="note"></span>
<label>colour <select id="scale"><option value="sqrt">sqrt(p)</option><option value="linear">p</option>
<option value="max">p / head max</option></select></label>
<label><input type="checkbox" id="show-mask" checked> show the mask</label>
</div>
<div class="explorer">
<div class="gridcol"><p class="note">Layers x heads{gqa_note}; click a thumbnail. Borders: red collapsed, orange uniform.</p>
<div id="grid"></div></div>
<div id="viewer"><h3 id="viewer-title"></h3><div id="viewer-facts" class="note"></div>
<div class="heat"><canvas id="xlabels"></canvas><canvas id="ylabels"></canvas>
<div class="heatwrap"><canvas id="heatmap"></canvas><canvas id="overlay"></canvas></div>
<div class="cbar"><span id="cbar-title"></span><canvas id="colorbar"></canvas></div></div>
<div class="note">rows: queries (attending), columns: keys (attended to).
<span class="swatch zero"></span>allowed, unused (p = 0) <span class="swatch forbidden"></span>forbidden by the mask.
Mask: {mask_note}.</div>
<div id="tooltip"></div></div>
</div></section>
<section><h2>Per-head metrics</h2>
<p class="note">Click a column to sort, a row to open its heatmap. Means over rows with at least two visible keys;
masked mass is the largest probability on forbidden keys over all rows (must be 0). Verdicts: collapsed when
mean max p &ge; {collapsed}, uniform when entropy / log n &ge; {uniform}.</p>
<div id="metrics-wrap"><table id="metrics"><thead><tr></tr></thead><tbody></tbody></table></div></section>
<section><h2>Doctor</h2>{doctor}</section>
{curves}
</main>
<script type="application/json" id="ak-meta">{meta}</script>
<script type="application/octet-stream" id="ak-blob">{blob}</script>
<script>{js}</script>
</body></html>
"""


def render(data: Collected, *, title: str, facts: str, doctor: dict | None = None, records: list[dict] | None = None,
           dense_max: int = 512, top_k: int = 32, thresholds=None) -> str:
    """The complete HTML page as a string."""
    from attnkit.diagnostics.metrics import HealthThresholds

    thresholds = thresholds or HealthThresholds()
    meta, blob = payload(data, dense_max=dense_max, top_k=top_k)
    sparse = meta["sparse_top_k"]
    sparse_note = (f'<p class="banner">{len(data.tokens)} tokens: each row keeps its {sparse} largest weights '
                   f'(more than {dense_max} tokens); hovering a cell states the mass a row leaves out.</p>'
                   if sparse else "")
    gqa = any(layer.kv_heads != layer.num_heads for layer in data.layers)
    curves = curves_html(records)
    return TEMPLATE.format(
        csp=CSP, title=html.escape(title), facts=facts, css=_asset("report.css"), js=_asset("report.js"),
        sparse_note=sparse_note, gqa_note=", query heads boxed by the KV head they share" if gqa else "",
        mask_note=html.escape(data.mask_note), collapsed=thresholds.collapsed_max_prob,
        uniform=thresholds.uniform_norm_entropy, doctor=doctor_html(doctor),
        curves=f"<section><h2>Training</h2>{curves}</section>" if curves else "",
        meta=_script_json(meta), blob=blob)

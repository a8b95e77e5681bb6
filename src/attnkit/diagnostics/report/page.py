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
from attnkit.diagnostics.report.importance import importance_html

COLUMNS = [("layer", "layer", "int"), ("name", "name", "text"), ("head", "head", "int"), ("kv", "kv head", "int"),
           ("entropy", "entropy (nats)", "num"), ("norm_entropy", "entropy / log n", "num"),
           ("max_prob", "max p", "num"), ("sink_mass", "sink (first token)", "num"),
           ("distance", "mean distance", "num"), ("prev_token", "previous token", "num"),
           ("det_previous_token", "prev-token head", "num"), ("det_duplicate_token", "duplicate head", "num"),
           ("det_induction", "induction head", "num"),
           ("masked_mass", "masked mass", "sci"), ("verdict", "verdict", "text")]


#: a column shown only when some layer has the metric (learned sinks: gpt-oss), inserted after the one named
OPTIONAL_COLUMNS = [("sink_mass", ("learned_sink", "learned sink", "num"))]


def columns(data: Collected) -> list[tuple[str, str, str]]:
    """The metrics table's columns: :data:`COLUMNS`, plus each optional one some layer has."""
    out = list(COLUMNS)
    for after, column in OPTIONAL_COLUMNS:
        if any(column[0] in layer.metrics for layer in data.layers):
            out.insert([c[0] for c in out].index(after) + 1, column)
    return out


def _heads_text(layer) -> str:
    if layer.kv_heads == layer.num_heads:
        return f"{layer.num_heads}"
    G = layer.num_heads // layer.kv_heads
    return (f"{layer.num_heads} query, {layer.kv_heads} KV: "
            + ("multi-query (all share one)" if layer.kv_heads == 1 else f"{layer.kv_heads} groups of {G}"))


def layers_html(data: Collected) -> str:
    """The layers table: each layer's kind (what its mask says), heads and GQA groups, q/k and value head sizes
    (MLA: they differ), softmax scale, learned sinks; then the layers that make no softmax call, with the reason."""
    rows = []
    for l, layer in enumerate(data.layers):
        dims = "" if not layer.head_dim else (
            f"{layer.head_dim}" if layer.v_head_dim in (0, layer.head_dim) else
            f"q/k {layer.head_dim}, v {layer.v_head_dim} (MLA)")
        sinks = ""
        if layer.sinks:
            mass = layer.metrics.get("learned_sink", [])
            sinks = "learned: " + ", ".join(f"{x:.2f}" for x in mass) + " of each row (per head)"
        scale = "" if layer.scale is None else f"{layer.scale:.4g}"
        rows.append(f'<tr data-layer="{l}"><td>{l}</td><td class="text">{html.escape(layer.name)}</td>'
                    f'<td class="text kind">{html.escape(layer.kind or "?")}</td>'
                    f'<td class="text">{html.escape(_heads_text(layer))}</td><td class="text">{html.escape(dims)}</td>'
                    f'<td>{scale}</td><td class="text">{html.escape(sinks)}</td></tr>')
    for name, reason in data.skipped:
        rows.append(f'<tr class="skipped"><td></td><td class="text">{html.escape(name)}</td>'
                    f'<td class="text kind">skipped</td><td class="text" colspan="4">{html.escape(reason)}</td></tr>')
    return ('<section id="layers-section"><h2>Layers</h2><p class="note">What each layer is, as its mask says '
            '(full, sliding W keys, chunked C, local (left, right)); its query and KV heads (query heads in groups '
            'that share a KV head); the head sizes; the softmax scale; the mass learned attention sinks take. '
            'Layers that make no softmax attention call are listed last, skipped, with what they are.</p>'
            '<table id="layers"><thead><tr><th>#</th><th class="text">layer</th><th class="text">kind</th>'
            '<th class="text">heads</th><th class="text">head size</th><th>scale</th><th class="text">sinks</th>'
            f'</tr></thead><tbody>{"".join(rows)}</tbody></table></section>')


DETECTOR_TITLES = {"previous_token": "previous-token", "duplicate_token": "duplicate-token", "induction": "induction"}


def detectors_html(data: Collected) -> str:
    """One line per head detector: the heads that score highest on this text (TransformerLens' detect_head
    score), or "" when no layer was scored."""
    import math

    lines = []
    for name, title in DETECTOR_TITLES.items():
        key = f"det_{name}"
        found = [(v, l, h) for l, layer in enumerate(data.layers) for h, v in enumerate(layer.metrics.get(key, []))
                 if isinstance(v, float) and math.isfinite(v)]
        if not found:
            continue
        best = sorted(found, reverse=True)[:3]
        lines.append(f"<li><b>{title}</b>: " + ", ".join(f"L{l} H{h} {v:.3f}" for v, l, h in best) + "</li>")
    if not lines:
        return ""
    return ('<div id="detectors"><p class="note">Head detectors (TransformerLens <code>detect_head</code>: the share '
            'of a head\'s attention on the positions a previous-token, duplicate-token or induction head would attend '
            'to on this text, 1 = a perfect such head; duplicate and induction need repeated tokens). Highest:</p>'
            f'<ul>{"".join(lines)}</ul></div>')


def generated_html(gen: dict | None) -> str:
    """The generated-tokens section (drawn by report.js from ``meta["generated"]``), or "" without one."""
    if gen is None:
        return ""
    sparse = gen["sparse_top_k"]
    note = (f" Each row keeps its {sparse} largest weights (the rows would take {gen['bytes']:,} bytes); the mass "
            "left out is stated." if sparse else "")
    return ('<section id="generated-section"><h2>Generated tokens</h2>'
            f'<p class="note">The model continued the text greedily for {gen["N"]} tokens (bold). Click one: the '
            'earlier tokens are shaded by how much the query that produced it attended to them, in the layer and '
            'head chosen (or their mean), and the heatmap shows every step (rows) over every earlier token '
            f'(columns).{note}</p>'
            '<div class="controls"><label>layer <select id="gen-layer"></select></label>'
            '<label>head <select id="gen-head"></select></label><span id="gen-facts" class="note"></span></div>'
            '<div id="gen-tokens"></div><div class="heat"><canvas id="gen-heat"></canvas></div></section>')


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


def payload(data: Collected, *, dense_max: int = 512, top_k: int = 32, compare: Collected | None = None,
            names: tuple[str, str] = ("model", "compare"), generated=None) -> tuple[dict, str]:
    """``(meta, blob)``: the JSON the page reads and the base64 data buffer. With ``compare``, ``meta["compare"]``
    holds the second checkpoint's heads (same layout; drawn with the model's mask)."""
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
        layers.append({"name": layer.name, "kind": layer.kind, "H": layer.num_heads, "Hkv": layer.kv_heads,
                       "heads": heads, "mask": mask})
        verdicts.append(layer.verdicts)
    table = metrics_table(data)
    by_head = [[{k: r[k] for k in layer.metrics} for r in table if r["layer"] == l] for l, layer in enumerate(data.layers)]
    meta = {"L": L, "step": STEP, "labels": data.labels, "ids": data.tokens, "layers": layers, "masks": masks,
            "columns": columns(data), "table": table, "metricsByHead": by_head, "verdicts": verdicts,
            "sparse_top_k": sparse, "names": list(names), "compare": None, "generated": None}
    if generated is not None:
        from attnkit.diagnostics.report.generated import encode_generated

        meta["generated"] = encode_generated(buf, generated, top_k=top_k)
    if compare is not None:
        meta["compare"] = {"heads": [encode_layer(buf, layer.weights, sparse) for layer in compare.layers],
                           "verdicts": [layer.verdicts for layer in compare.layers]}
    return meta, buf.encoded()


def _asset(name: str) -> str:
    return resources.files("attnkit.diagnostics.report").joinpath(name).read_text(encoding="utf-8")


#: characters JSON may hold that HTML would read inside a <script> element ("</script>", "<!--" ...)
_SCRIPT_UNSAFE = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def _script_json(obj) -> str:
    """JSON safe inside a <script> element: ``<``, ``>`` and ``&`` (and U+2028/9) are written as ``\\uXXXX``
    escapes, so no token label ("</script>", "<!--") can close or re-open the element; ``JSON.parse`` reads them
    back unchanged."""
    text = json.dumps(obj, separators=(",", ":"))
    for ch, esc in _SCRIPT_UNSAFE.items():
        text = text.replace(ch, esc)
    return text


def doctor_html(doctor: dict | None) -> str:
    if doctor is None:
        return '<p class="note">The doctor was not run (pass doctor=True).</p>'
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


def _polyline_svg(series: dict[str, list[tuple[float, float]]], title: str, ylabel: str,
                  hline: tuple[str, float] | None = None) -> str:
    """A small line chart as inline SVG (no script): one coloured polyline per series, with axes and a legend;
    ``hline`` (label, y) adds a dashed grey horizontal line (e.g. the unigram baseline)."""
    pts = [p for s in series.values() for p in s]
    if not pts:
        return ""
    W, H, pad_l, pad_b, pad_t, pad_r = 600, 260, 58, 34, 26, 175
    xs, ys = [p[0] for p in pts], [p[1] for p in pts] + ([hline[1]] if hline else [])
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
    if hline is not None:
        ly, y = pad_t + 14 * len(series) + 6, Y(hline[1])
        parts.append(f'<line class="baseline" x1="{pad_l}" y1="{y:.1f}" x2="{W - pad_r}" y2="{y:.1f}" stroke="#777" '
                     f'stroke-dasharray="5 4" stroke-width="1.5"/><line x1="{W - pad_r + 10}" y1="{ly}" '
                     f'x2="{W - pad_r + 28}" y2="{ly}" stroke="#777" stroke-dasharray="4 3" stroke-width="2"/>'
                     f'<text x="{W - pad_r + 32}" y="{ly + 4}" font-size="11">{html.escape(hline[0])}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _baseline_of(records: list[dict], baseline: float | None) -> float | None:
    """The unigram baseline: the one given, else the last ``unigram_loss`` a record carries (None if none does)."""
    if baseline is not None:
        return float(baseline)
    found = [r["unigram_loss"] for r in records if isinstance(r.get("unigram_loss"), (int, float))]
    return float(found[-1]) if found else None


def curves_html(records: list[dict] | None, baseline: float | None = None) -> str:
    """Training curves (loss, validation loss, the unigram baseline) and the attention monitor's verdicts from
    ``metrics.jsonl``."""
    if not records:
        return ""
    loss = {"train loss": [(r["step"], r["loss"]) for r in records if "loss" in r and "step" in r],
            "validation loss": [(r["step"], r["val_loss"]) for r in records if "val_loss" in r and "step" in r]}
    base = _baseline_of(records, baseline)
    out = [_polyline_svg({k: v for k, v in loss.items() if v}, "loss", "cross-entropy (nats/token)",
                         None if base is None else (f"unigram baseline {base:.2f}", base))]
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
<div id="error" class="banner" style="display:none"></div>{warning}
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
{layers}
{generated}
<section id="headview-section"><h2>Head view</h2>
<p class="note">The open head as lines from each query token (left) to the keys it attends to (right), opacity = weight
(as BertViz draws it). Hover or click a token on the left to keep only its lines.</p>
<div id="headview-wrap"><svg id="headview"></svg></div></section>
{compare}
{importance}
<section><h2>Per-head metrics</h2>
<p class="note">Click a column to sort, a row to open its heatmap. Means over rows with at least two visible keys;
masked mass is the largest probability on forbidden keys over all rows (must be 0). Verdicts: collapsed when
mean max p &ge; {collapsed}, uniform when entropy / log n &ge; {uniform}.</p>
{detectors}
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
           dense_max: int = 512, top_k: int = 32, thresholds=None, compare: Collected | None = None,
           names: tuple[str, str] = ("model", "compare"), importance=None, warning: str | None = None,
           baseline: float | None = None, generated=None) -> str:
    """The complete HTML page as a string. Every string a model or a user controls (title, facts, names, labels,
    layer names, doctor text) is escaped: HTML text here, ``\\u003c``-escaped JSON in the data element."""
    from attnkit.diagnostics.metrics import HealthThresholds

    thresholds = thresholds or HealthThresholds()
    meta, blob = payload(data, dense_max=dense_max, top_k=top_k, compare=compare, names=names, generated=generated)
    sparse = meta["sparse_top_k"]
    sparse_note = (f'<p class="banner">{len(data.tokens)} tokens: each row keeps its {sparse} largest weights '
                   f'(more than {dense_max} tokens); hovering a cell states the mass a row leaves out.</p>'
                   if sparse else "")
    gqa = any(layer.kv_heads != layer.num_heads for layer in data.layers)
    curves = curves_html(records, baseline)
    a, b = (html.escape(n) for n in names)
    compare_html = "" if compare is None else (
        f'<section id="compare-section"><h2>Comparison: {a} vs {b}</h2><p class="note">The open head in both '
        f'checkpoints on the same tokens (same colour scale and mask), and their difference ({a} minus {b}: red where '
        f'{a} attends more, blue where {b} does).</p><div class="compare">'
        f'<figure><figcaption>{a}</figcaption><canvas id="compare-a"></canvas></figure>'
        f'<figure><figcaption>{b}</figcaption><canvas id="compare-b"></canvas></figure>'
        f'<figure><figcaption>{a} &minus; {b}</figcaption><canvas id="compare-diff"></canvas></figure></div>'
        f'<div id="compare-facts" class="note"></div></section>')
    return TEMPLATE.format(
        csp=CSP, title=html.escape(title), facts=html.escape(facts, quote=False),
        warning=f'<p class="banner" id="length-warning">{html.escape(warning)}</p>' if warning else "",
        compare=compare_html, layers=layers_html(data), generated=generated_html(meta["generated"]),
        detectors=detectors_html(data), importance=importance_html(importance, [layer.name for layer in data.layers]),
        css=_asset("report.css"), js=_asset("report.js"),
        sparse_note=sparse_note, gqa_note=", query heads boxed by the KV head they share" if gqa else "",
        mask_note=html.escape(data.mask_note), collapsed=thresholds.collapsed_max_prob,
        uniform=thresholds.uniform_norm_entropy, doctor=doctor_html(doctor),
        curves=f"<section><h2>Training</h2>{curves}</section>" if curves else "",
        meta=_script_json(meta), blob=blob)

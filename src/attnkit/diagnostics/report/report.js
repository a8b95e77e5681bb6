/* attnkit report explorer: decodes the embedded data and draws it on canvases. No network, no libraries.
 * Data: #ak-meta (JSON) + #ak-blob (base64 of a zlib buffer; spans [offset, length] into it). */
(async function () {
  "use strict";
  const META = JSON.parse(document.getElementById("ak-meta").textContent);
  const L = META.L, STEP = META.step, LABELS = META.labels;
  const $ = (id) => document.getElementById(id);

  function b64bytes(s) {
    const bin = atob(s), out = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }
  async function inflate(bytes) {
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"));
    return new Uint8Array(await new Response(stream).arrayBuffer());
  }
  const BLOB = await inflate(b64bytes(document.getElementById("ak-blob").textContent.trim()));
  const u8 = (s) => new Uint8Array(BLOB.buffer, s[0], s[1]);
  const u16 = (s) => new Uint16Array(BLOB.buffer, s[0], s[1] / 2);

  // ---- colours: white (0) -> yellow-green -> blue -> navy (1); forbidden cells are grey hatching
  const STOPS = [[0, [255, 255, 255]], [0.12, [237, 248, 177]], [0.4, [127, 205, 187]], [0.7, [44, 127, 184]],
                 [1, [8, 29, 88]]];
  const LUT = new Uint8Array(256 * 3);
  for (let i = 0; i < 256; i++) {
    const t = i / 255;
    let s = 0;
    while (s < STOPS.length - 2 && t > STOPS[s + 1][0]) s++;
    const [t0, c0] = STOPS[s], [t1, c1] = STOPS[s + 1], f = (t - t0) / (t1 - t0);
    for (let c = 0; c < 3; c++) LUT[3 * i + c] = Math.round(c0[c] + f * (c1[c] - c0[c]));
  }
  const FORBID = [[168, 168, 168], [196, 196, 196]];

  // ---- weights: one decoded (L, L) Float32Array per head; the last few are kept (16 MiB each at 2048 tokens)
  // (which = 1: the compared checkpoint's head, META.compare)
  const cache = new Map(), CACHE_HEADS = 8;
  function headData(l, h, which = 0) {
    const key = (which * 10000 + l) * 100000 + h;
    if (cache.has(key)) { const hit = cache.get(key); cache.delete(key); cache.set(key, hit); return hit; }
    if (cache.size >= CACHE_HEADS) cache.delete(cache.keys().next().value);
    const hd = which ? META.compare.heads[l][h] : META.layers[l].heads[h], w = new Float32Array(L * L);
    let rest = null;
    if (hd.fmt === "dense") {
      const q = u8(hd.w);
      for (let i = 0; i < q.length; i++) w[i] = q[i] * STEP;
    } else {
      const idx = u16(hd.idx), val = u8(hd.val), k = hd.k;
      for (let i = 0; i < L; i++) for (let r = 0; r < k; r++) w[i * L + idx[i * k + r]] = val[i * k + r] * STEP;
      rest = Array.from(u8(hd.rest), (x) => x * STEP);
    }
    let max = 0;
    for (let i = 0; i < w.length; i++) if (w[i] > max) max = w[i];
    const out = { w, rest, max, topk: hd.fmt === "topk" ? hd.k : 0 };
    cache.set(key, out);
    return out;
  }
  const maskCache = new Map();
  function maskOf(l, h) {  // Uint8Array (L*L) of 0/1, or null = every key visible
    const m = META.layers[l].mask;
    if (m === null) return null;
    const id = m[m.length === 1 ? 0 : h];
    if (!maskCache.has(id)) {
      const bits = u8(META.masks[id]), out = new Uint8Array(L * L);
      for (let i = 0; i < out.length; i++) out[i] = (bits[i >> 3] >> (7 - (i & 7))) & 1;
      maskCache.set(id, out);
    }
    return maskCache.get(id);
  }

  // ---- colour scales (the colour bar follows the chosen one)
  const scale = () => $("scale").value;
  function level(v, hmax) {  // value -> 0..255 colour index
    let t = scale() === "sqrt" ? Math.sqrt(v) : scale() === "max" ? (hmax > 0 ? v / hmax : 0) : v;
    return Math.max(0, Math.min(255, Math.round(255 * t)));
  }
  function inverse(t, hmax) { return scale() === "sqrt" ? t * t : scale() === "max" ? t * hmax : t; }

  // ---- tokens
  const tokBox = $("tokens");
  LABELS.forEach((lab, i) => {
    const s = document.createElement("span");
    s.className = "tok"; s.textContent = lab; s.dataset.i = i; s.title = `token ${i} (id ${META.ids[i]})`;
    tokBox.appendChild(s);
  });
  const tokSpans = tokBox.children;

  // ---- grid of thumbnails, grouped by KV head
  const grid = $("grid"), thumbs = [];
  const maxHeads = Math.max(...META.layers.map((x) => x.H));
  grid.style.setProperty("--thumb", (maxHeads > 16 ? 28 : maxHeads > 8 ? 40 : 54) + "px");
  META.layers.forEach((layer, l) => {
    const row = document.createElement("div");
    row.className = "layer-row"; row.dataset.layer = l;
    const name = document.createElement("div");
    name.className = "lname"; name.title = layer.name;
    const num = document.createElement("b"), full = document.createElement("span");
    num.textContent = `L${l}`; full.textContent = layer.name + (layer.kind ? ` \u00b7 ${layer.kind}` : "");  // wrapped: never cut off
    name.append(num, full);
    row.appendChild(name);
    const groups = document.createElement("div");
    groups.className = "groups";
    const gqa = layer.Hkv !== layer.H, G = gqa ? layer.H / layer.Hkv : layer.H, nGroups = gqa ? layer.Hkv : 1;
    for (let g = 0; g < nGroups; g++) {
      const box = document.createElement("div");
      box.className = "kv-group"; box.dataset.kv = g;
      if (gqa) {
        const lab = document.createElement("span");
        lab.className = "kvlabel"; lab.textContent = `kv ${g}`; box.appendChild(lab);
      }
      for (let h = g * G; h < (g + 1) * G; h++) {
        const hd = layer.heads[h], T = hd.T, c = document.createElement("canvas");
        c.width = T; c.height = T; c.className = `thumb v-${META.verdicts[l][h]}`;
        c.dataset.layer = l; c.dataset.head = h;
        c.title = `layer ${l} (${layer.name}) head ${h}` + (gqa ? `, kv head ${g}` : "") + `: ${META.verdicts[l][h]}`;
        const img = c.getContext("2d").createImageData(T, T), t = u8(hd.thumb);
        for (let i = 0; i < T * T; i++) {
          const v = t[i];
          img.data[4 * i] = LUT[3 * v]; img.data[4 * i + 1] = LUT[3 * v + 1]; img.data[4 * i + 2] = LUT[3 * v + 2];
          img.data[4 * i + 3] = 255;
        }
        c.getContext("2d").putImageData(img, 0, 0);
        c.addEventListener("click", () => open(l, h));
        box.appendChild(c); thumbs.push(c);
      }
      groups.appendChild(box);
    }
    row.appendChild(groups); grid.appendChild(row);
  });

  // ---- the heatmap viewer
  const heat = $("heatmap"), overlay = $("overlay"), xl = $("xlabels"), yl = $("ylabels"), cbar = $("colorbar");
  // the heatmap fits the viewer's width (labels 96 px, colour bar 72 px, gaps): no horizontal scrollbar
  const room = $("viewer").clientWidth - 96 - 72 - 48;
  const SIZE = Math.max(240, Math.min(720, L * 14, room)), DPR = window.devicePixelRatio || 1;
  heat.width = L; heat.height = L; heat.style.width = heat.style.height = SIZE + "px";
  overlay.width = overlay.height = Math.round(SIZE * DPR); overlay.style.width = overlay.style.height = SIZE + "px";
  const state = { layer: 0, head: 0, row: null, col: null };

  // paint one (L, L) head on a canvas of L x L pixels: colour per weight, forbidden cells hatched
  function paint(canvas, w, max, mask) {
    if (canvas.width !== L || canvas.height !== L) { canvas.width = L; canvas.height = L; }  // (a resize reallocates)
    const ctx = canvas.getContext("2d"), img = ctx.createImageData(L, L), d = img.data;
    for (let i = 0; i < L; i++) for (let j = 0; j < L; j++) {
      const p = i * L + j;
      let c;
      if (mask !== null && !mask[p]) c = FORBID[((i + j) >> 1) & 1];
      else { const v = 3 * level(w[p], max); c = [LUT[v], LUT[v + 1], LUT[v + 2]]; }
      d[4 * p] = c[0]; d[4 * p + 1] = c[1]; d[4 * p + 2] = c[2]; d[4 * p + 3] = 255;
    }
    ctx.putImageData(img, 0, 0);
  }
  const shownMask = () => ($("show-mask").checked ? maskOf(state.layer, state.head) : null);
  function drawHeat() {
    const { w, max } = headData(state.layer, state.head);
    paint(heat, w, max, shownMask());
    drawColorbar(max);
    drawCompare();
  }

  // ---- comparison with a second checkpoint (META.compare): both heads on one scale, and their difference
  function drawCompare() {
    if (!META.compare) return;
    const a = headData(state.layer, state.head), b = headData(state.layer, state.head, 1), mask = shownMask();
    const max = Math.max(a.max, b.max), CS = Math.max(200, Math.min(380, L * 8));
    for (const [id, d] of [["compare-a", a], ["compare-b", b]]) {
      const c = $(id); paint(c, d.w, max, mask); c.style.width = c.style.height = CS + "px";
    }
    const c = $("compare-diff");
    if (c.width !== L || c.height !== L) { c.width = L; c.height = L; }
    const ctx = c.getContext("2d"), img = ctx.createImageData(L, L);
    let diffSum = 0;
    for (let p = 0; p < L * L; p++) {
      const dv = a.w[p] - b.w[p], t = Math.min(1, Math.sqrt(Math.abs(dv)));
      diffSum += Math.abs(dv);
      const forbidden = mask !== null && !mask[p];
      const rgb = forbidden ? FORBID[0] : dv >= 0 ? [255, Math.round(255 * (1 - t)), Math.round(255 * (1 - t))]
                                                   : [Math.round(255 * (1 - t)), Math.round(255 * (1 - t)), 255];
      img.data.set([...rgb, 255], 4 * p);
    }
    ctx.putImageData(img, 0, 0); c.style.width = c.style.height = CS + "px";
    const names = META.names, vb = META.compare.verdicts[state.layer][state.head];
    $("compare-facts").textContent = `layer ${state.layer} (${META.layers[state.layer].name}), head ${state.head}: ` +
      `verdict ${META.verdicts[state.layer][state.head]} in ${names[0]}, ${vb} in ${names[1]}; ` +
      `mean |difference| per query row ${(diffSum / L).toFixed(3)} (of at most 2)`;
    $("compare-section").dataset.layer = state.layer; $("compare-section").dataset.head = state.head;
  }

  // "label index" within maxw pixels: a label that does not fit ends in an ellipsis (never silently cut)
  function fitLabel(ctx, label, suffix, maxw) {
    if (ctx.measureText(label + suffix).width <= maxw) return label + suffix;
    let n = label.length;
    while (n > 1 && ctx.measureText(label.slice(0, n - 1) + "\u2026" + suffix).width > maxw) n--;
    return label.slice(0, n - 1) + "\u2026" + suffix;
  }
  function drawLabels() {
    const cell = SIZE / L, every = Math.max(1, Math.ceil(11 / cell)), font = Math.min(11, Math.max(8, cell - 1));
    for (const [c, vertical] of [[xl, true], [yl, false]]) {
      const W = vertical ? SIZE : 96, H = vertical ? 96 : SIZE;
      c.width = Math.round(W * DPR); c.height = Math.round(H * DPR); c.style.width = W + "px"; c.style.height = H + "px";
      const ctx = c.getContext("2d");
      ctx.setTransform(DPR, 0, 0, DPR, 0, 0); ctx.clearRect(0, 0, W, H);
      ctx.font = `${font}px ui-monospace, Menlo, monospace`; ctx.fillStyle = "#333"; ctx.textBaseline = "middle";
      for (let i = 0; i < L; i += every) {
        const lab = fitLabel(ctx, LABELS[i], ` ${i}`, 88), mid = (i + 0.5) * cell + 1;
        ctx.save();
        if (vertical) { ctx.translate(mid, H - 4); ctx.rotate(-Math.PI / 2); ctx.textAlign = "left"; ctx.fillText(lab, 0, 0); }
        else { ctx.textAlign = "right"; ctx.fillText(lab, W - 4, mid); }
        ctx.restore();
      }
    }
  }

  function drawColorbar(hmax) {
    const W = 64, H = SIZE;
    cbar.width = Math.round(W * DPR); cbar.height = Math.round(H * DPR); cbar.style.width = W + "px"; cbar.style.height = H + "px";
    const ctx = cbar.getContext("2d");
    ctx.setTransform(DPR, 0, 0, DPR, 0, 0); ctx.clearRect(0, 0, W, H);
    for (let y = 0; y < H; y++) {
      const v = 3 * Math.round(255 * (1 - y / (H - 1)));
      ctx.fillStyle = `rgb(${LUT[v]},${LUT[v + 1]},${LUT[v + 2]})`; ctx.fillRect(0, y, 16, 1);
    }
    ctx.strokeStyle = "#888"; ctx.strokeRect(0.5, 0.5, 16, H - 1);
    ctx.fillStyle = "#222"; ctx.font = "11px system-ui, sans-serif"; ctx.textBaseline = "middle";
    for (const t of [0, 0.25, 0.5, 0.75, 1]) {
      const y = Math.min(H - 6, Math.max(6, (1 - t) * (H - 1)));
      ctx.fillRect(16, y, 4, 1); ctx.fillText(inverse(t, hmax).toFixed(3), 23, y);
    }
    $("cbar-title").textContent = { sqrt: "p (sqrt scale)", max: "p (0 to head max)", linear: "p (linear)" }[scale()];
  }

  function drawOverlay() {
    const ctx = overlay.getContext("2d"), cell = overlay.width / L;
    ctx.clearRect(0, 0, overlay.width, overlay.height);
    ctx.fillStyle = "rgba(255, 196, 0, 0.28)"; ctx.strokeStyle = "rgba(214, 137, 16, 0.95)"; ctx.lineWidth = Math.max(1, DPR);
    if (state.row !== null) { ctx.fillRect(0, state.row * cell, overlay.width, cell); ctx.strokeRect(0, state.row * cell, overlay.width, cell); }
    if (state.col !== null) { ctx.fillRect(state.col * cell, 0, cell, overlay.height); ctx.strokeRect(state.col * cell, 0, cell, overlay.height); }
    overlay.dataset.row = state.row === null ? "" : state.row;
    overlay.dataset.col = state.col === null ? "" : state.col;
  }

  function tint() {  // token strip: the hovered token's row (where it attends) as background strength
    const { w } = headData(state.layer, state.head);
    for (let j = 0; j < L; j++) {
      const s = tokSpans[j];
      s.classList.toggle("hovered", j === state.row);
      s.style.background = state.row === null ? "" : `rgba(44, 127, 184, ${Math.min(1, Math.sqrt(w[state.row * L + j])).toFixed(3)})`;
    }
  }

  function describeCell(i, j) {
    const { w, rest, topk } = headData(state.layer, state.head), mask = maskOf(state.layer, state.head);
    const allowed = mask === null || mask[i * L + j] === 1;
    let text = `query ${i} ${JSON.stringify(LABELS[i])} -> key ${j} ${JSON.stringify(LABELS[j])}: `;
    if (!allowed) text += "forbidden by the mask";
    else if (topk && w[i * L + j] === 0) text += `not in this row's top-${topk} (row mass left out: ${rest[i].toFixed(3)})`;
    else text += `p = ${w[i * L + j].toFixed(3)} (stored to \u00b1${(STEP / 2).toFixed(3)})`;
    return text;
  }

  // ---- head view: lines from each query token (left) to the keys it attends to (right), opacity = weight
  const hv = $("headview"), SVGNS = hv.namespaceURI, ROW = 18;
  const longest = Math.min(24, Math.max(...LABELS.map((s) => s.length)));
  const XL = 24 + 8 * longest, XR = XL + 220, HV_W = XR + XL;  // label column, lines, label column
  const HV_ALL_MAX = 96;  // longer inputs draw the lines of the chosen query only (L^2 lines would be too many)
  function svgEl(tag, attrs, text) {
    const e = document.createElementNS(SVGNS, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  // the token labels are drawn once; each redraw replaces the lines and re-weights the key labels
  const hvH = L * ROW + 8, hvLines = svgEl("g", { class: "hv-lines" }), hvLeft = [], hvRight = [];
  hv.setAttribute("width", HV_W); hv.setAttribute("height", hvH); hv.setAttribute("viewBox", `0 0 ${HV_W} ${hvH}`);
  hv.dataset.xl = XL; hv.dataset.xr = XR;
  hv.appendChild(hvLines);
  for (let i = 0; i < L; i++) {
    const y = i * ROW + ROW / 2 + 8, lab = LABELS[i].length > 24 ? LABELS[i].slice(0, 23) + "\u2026" : LABELS[i];
    const left = svgEl("text", { x: XL - 8, y, "text-anchor": "end", class: "hv-q", "data-i": i }, lab);
    left.appendChild(svgEl("title", {}, `${LABELS[i]} (token ${i})`));
    const right = svgEl("text", { x: XR + 8, y, class: "hv-k", "data-i": i }, lab);
    hv.append(left, right); hvLeft.push(left); hvRight.push(right);
  }
  const hvNote = svgEl("text", { x: XL + 8, y: 14, class: "hv-note" }, `${L} tokens: hover a token`);
  let hvShown = null;  // the query whose labels are marked (null: none)
  function drawHeadView() {
    const { w } = headData(state.layer, state.head), q = state.row, lines = [];
    const rows = q !== null ? [q] : L <= HV_ALL_MAX ? [...Array(L).keys()] : [];
    for (const i of rows) for (let j = 0; j < L; j++) {
      const p = w[i * L + j];
      if (p < (q !== null ? STEP : 0.02)) continue;
      lines.push(svgEl("line", { x1: XL, y1: i * ROW + ROW / 2 + 4, x2: XR, y2: j * ROW + ROW / 2 + 4,
        stroke: "#1f5f99", "stroke-width": 2.5, "stroke-opacity": p.toFixed(3), "data-q": i, "data-k": j }));
    }
    hvLines.replaceChildren(...lines);
    if (hvShown !== null) hvLeft[hvShown].classList.remove("on");
    if (q !== null) hvLeft[q].classList.add("on");
    if (q !== null || hvShown !== null)
      for (let j = 0; j < L; j++) hvRight[j].setAttribute("fill-opacity",
        q === null ? 1 : Math.max(0.25, Math.min(1, Math.sqrt(w[q * L + j]) * 1.5)).toFixed(3));
    hvShown = q;
    hv.dataset.layer = state.layer; hv.dataset.head = state.head; hv.dataset.query = q === null ? "" : q;
    if (q === null && L > HV_ALL_MAX) hv.appendChild(hvNote); else hvNote.remove();
  }
  hv.addEventListener("mouseover", (e) => {
    const i = e.target.classList && e.target.classList.contains("hv-q") ? e.target.dataset.i : undefined;
    if (i !== undefined && +i !== state.row) highlight(+i, +i, `token ${i} ${JSON.stringify(LABELS[+i])}: its lines`);
  });
  hv.addEventListener("mouseleave", () => highlight(null, null));

  function highlight(row, col, text) {
    const redraw = row !== state.row;
    state.row = row; state.col = col;
    drawOverlay(); tint();
    if (redraw) drawHeadView();
    $("tooltip").textContent = text || "";
  }

  heat.addEventListener("mousemove", (e) => {
    const r = heat.getBoundingClientRect();
    const i = Math.min(L - 1, Math.floor(((e.clientY - r.top) / r.height) * L));
    const j = Math.min(L - 1, Math.floor(((e.clientX - r.left) / r.width) * L));
    highlight(i, j, describeCell(i, j));
  });
  heat.addEventListener("mouseleave", () => highlight(null, null));
  tokBox.addEventListener("mouseover", (e) => {
    const i = e.target.dataset && e.target.dataset.i;
    if (i !== undefined) highlight(+i, +i, `token ${i} ${JSON.stringify(LABELS[+i])}: row = where it attends, column = what attends to it`);
  });
  tokBox.addEventListener("mouseleave", () => highlight(null, null));

  function open(l, h) {
    state.layer = l; state.head = h;
    const layer = META.layers[l], G = layer.H / layer.Hkv, m = META.metricsByHead[l][h];
    $("viewer-title").textContent = `layer ${l} (${layer.name}${layer.kind ? ", " + layer.kind : ""}), head ${h}` + (layer.Hkv !== layer.H ? `, kv head ${Math.floor(h / G)}` : "");
    $("viewer-facts").textContent = `verdict ${META.verdicts[l][h]}; entropy ${fmt(m.entropy)} nats; sink ${fmt(m.sink_mass)}; ` +
      `mean distance ${fmt(m.distance)}; previous token ${fmt(m.prev_token)}; masked mass ${fmt(m.masked_mass, 1)}`;
    heat.dataset.layer = l; heat.dataset.head = h;
    for (const t of thumbs) t.classList.toggle("selected", +t.dataset.layer === l && +t.dataset.head === h);
    drawHeat(); drawOverlay(); tint(); drawHeadView();
  }
  for (const td of document.querySelectorAll("#importance td[data-head]"))
    td.addEventListener("click", () => open(+td.dataset.layer, +td.dataset.head));
  $("scale").addEventListener("change", drawHeat);
  $("show-mask").addEventListener("change", drawHeat);

  // ---- metrics table (sortable)
  const COLS = META.columns;
  const fmt = (v, sci) => (v === null || v === undefined ? "n/a" : typeof v === "string" ? v :
    sci ? (v === 0 ? "0" : v.toExponential(1)) : v.toFixed(3));
  const tbody = $("metrics").querySelector("tbody"), thead = $("metrics").querySelector("thead tr");
  COLS.forEach(([key, title, kind]) => {
    const th = document.createElement("th");
    th.textContent = title; th.dataset.key = key; if (kind === "text") th.className = "text";
    th.addEventListener("click", () => sortBy(key, th.dataset.sort === "asc" ? "desc" : "asc"));
    thead.appendChild(th);
  });
  const rows = META.table.map((r) => {
    const tr = document.createElement("tr");
    tr.dataset.layer = r.layer; tr.dataset.head = r.head;
    for (const [key, , kind] of COLS) {
      const td = document.createElement("td");
      td.textContent = kind === "int" ? r[key] : fmt(r[key], kind === "sci");
      if (kind === "text") td.className = "text" + (key === "verdict" ? ` verdict-${r[key]}` : "");
      tr.appendChild(td);
    }
    tr.addEventListener("click", () => open(r.layer, r.head));
    tbody.appendChild(tr);
    return { r, tr };
  });
  function sortBy(key, dir) {
    const sign = dir === "asc" ? 1 : -1;
    rows.sort((a, b) => {
      const x = a.r[key], y = b.r[key];
      if (x === y) return 0;
      if (x === null) return 1;
      if (y === null) return -1;
      return (x < y ? -1 : 1) * sign;
    });
    for (const { tr } of rows) tbody.appendChild(tr);
    for (const th of thead.children) th.dataset.sort = th.dataset.key === key ? dir : "";
  }

  // ---- layer / head / verdict filter
  function parseSet(text) {
    text = text.trim();
    if (!text) return null;
    const out = new Set();
    for (const part of text.split(",")) {
      const m = part.trim().match(/^(\d+)(?:\s*-\s*(\d+))?$/);
      if (!m) continue;
      for (let i = +m[1]; i <= +(m[2] || m[1]); i++) out.add(i);
    }
    return out;
  }
  function applyFilter() {
    const ls = parseSet($("filter-layers").value), hs = parseSet($("filter-heads").value), v = $("filter-verdict").value;
    const keep = (l, h) => (!ls || ls.has(l)) && (!hs || hs.has(h)) && (!v || META.verdicts[l][h] === v);
    for (const t of thumbs) t.style.display = keep(+t.dataset.layer, +t.dataset.head) ? "" : "none";
    for (const row of grid.children) {
      const l = +row.dataset.layer;
      row.style.display = META.layers[l].heads.some((_, h) => keep(l, h)) ? "" : "none";
      for (const box of row.querySelectorAll(".kv-group"))
        box.style.display = [...box.querySelectorAll("canvas")].some((c) => c.style.display !== "none") ? "" : "none";
    }
    for (const { r, tr } of rows) tr.style.display = keep(r.layer, r.head) ? "" : "none";
    $("filter-count").textContent = `${thumbs.filter((t) => t.style.display !== "none").length} of ${thumbs.length} heads shown`;
  }
  for (const id of ["filter-layers", "filter-heads", "filter-verdict"]) $(id).addEventListener("input", applyFilter);

  // ---- generated tokens (META.generated): per step, the row of the query that produced the new token
  const GEN = META.generated, genState = { step: 0, layer: -1, head: -1 };
  const genRows = new Map();
  function genHead(l, h) {  // Float32Array (N*K) of one head's generated rows
    const key = l * 100000 + h;
    if (genRows.has(key)) return genRows.get(key);
    const hd = GEN.layers[l].heads[h], N = GEN.N, K = GEN.K, w = new Float32Array(N * K);
    if (hd.fmt === "dense") {
      const q = u8(hd.w);
      for (let i = 0; i < q.length; i++) w[i] = q[i] * STEP;
    } else {
      const idx = u16(hd.idx), val = u8(hd.val), k = hd.k;
      for (let i = 0; i < N; i++) for (let r = 0; r < k; r++) w[i * K + idx[i * k + r]] = val[i * k + r] * STEP;
    }
    if (genRows.size > 64) genRows.delete(genRows.keys().next().value);
    genRows.set(key, w);
    return w;
  }
  function genWeights() {  // (N*K) mean over the chosen layer(s) and head(s)
    const N = GEN.N, K = GEN.K, out = new Float32Array(N * K);
    const ls = genState.layer < 0 ? GEN.layers.map((_, l) => l) : [genState.layer];
    let n = 0;
    for (const l of ls) {
      const hs = genState.head < 0 ? GEN.layers[l].heads.map((_, h) => h) : [genState.head].filter((h) => h < GEN.layers[l].H);
      for (const h of hs) { const w = genHead(l, h); for (let i = 0; i < out.length; i++) out[i] += w[i]; n++; }
    }
    if (n) for (let i = 0; i < out.length; i++) out[i] /= n;
    return out;
  }
  function genDraw() {
    const N = GEN.N, K = GEN.K, P = GEN.P, w = genWeights(), s = genState.step;
    const row = w.subarray(s * K, (s + 1) * K), seen = P + s;  // keys 0 .. P+s-1
    let max = 0;
    for (let j = 0; j < seen; j++) max = Math.max(max, row[j]);
    for (const span of $("gen-tokens").children) {
      const j = +span.dataset.i;
      span.classList.toggle("selected", j === P + s);
      span.style.background = j < seen && max > 0 ? `rgba(44,127,184,${(row[j] / max).toFixed(3)})` : "";
      span.style.color = j < seen && row[j] / max > 0.6 ? "#fff" : "";
      span.title = j < seen ? `p = ${row[j].toFixed(3)}` : (j === P + s ? "the new token" : "");
    }
    const order = Array.from({ length: seen }, (_, j) => j).sort((a, b) => row[b] - row[a]).slice(0, 5);
    const what = (genState.layer < 0 ? "all layers" : `layer ${genState.layer}`) + ", " + (genState.head < 0 ? "mean of heads" : `head ${genState.head}`);
    $("gen-facts").textContent = `step ${s}: ${JSON.stringify(GEN.labels[P + s])} (${what}) looked at ` +
      order.map((j) => `${JSON.stringify(GEN.labels[j])} ${row[j].toFixed(2)}`).join(", ");
    const c = $("gen-heat"), cell = Math.max(2, Math.min(14, Math.floor(900 / K)));
    c.width = K * cell; c.height = N * cell;
    const ctx = c.getContext("2d");
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, c.width, c.height);
    for (let i = 0; i < N; i++) {
      let m = 0;
      for (let j = 0; j < P + i; j++) m = Math.max(m, w[i * K + j]);
      for (let j = 0; j < K; j++) {
        if (j >= P + i) { ctx.fillStyle = "#e4e4e4"; ctx.fillRect(j * cell, i * cell, cell, cell); continue; }
        const v = Math.round(255 * Math.sqrt(w[i * K + j]));
        ctx.fillStyle = `rgb(${LUT[3 * v]},${LUT[3 * v + 1]},${LUT[3 * v + 2]})`;
        ctx.fillRect(j * cell, i * cell, cell, cell);
      }
      if (i === s) { ctx.strokeStyle = "#d62728"; ctx.lineWidth = 2; ctx.strokeRect(1, i * cell + 1, c.width - 2, cell - 2); }
    }
  }
  function genSelect(step) { genState.step = Math.max(0, Math.min(GEN.N - 1, step)); genDraw(); }
  if (GEN) {
    const box = $("gen-tokens");
    GEN.ids.forEach((_, j) => {
      const span = document.createElement("span");
      span.className = "tok" + (j >= GEN.P ? " gen-token" : "");
      span.dataset.i = j; span.textContent = GEN.labels[j];
      if (j >= GEN.P) { span.dataset.step = j - GEN.P; span.addEventListener("click", () => genSelect(j - GEN.P)); }
      box.appendChild(span);
    });
    const ls = $("gen-layer"), hs = $("gen-head");
    ls.add(new Option("all (mean)", "-1"));
    GEN.layers.forEach((layer, l) => ls.add(new Option(`L${l} ${layer.name}`, String(l))));
    hs.add(new Option("mean", "-1"));
    for (let h = 0; h < Math.max(...GEN.layers.map((x) => x.H)); h++) hs.add(new Option(`h${h}`, String(h)));
    ls.addEventListener("change", () => { genState.layer = +ls.value; genDraw(); });
    hs.addEventListener("change", () => { genState.head = +hs.value; genDraw(); });
    genDraw();
  }

  drawLabels();
  open(0, 0);
  applyFilter();
  window.attnkit = {
    ready: true, tti_ms: performance.now(), L, state, open, highlight, sortBy, fitLabel,
    weight: (l, h, i, j) => headData(l, h).w[i * L + j],
    compareWeight: (l, h, i, j) => headData(l, h, 1).w[i * L + j],
    allowed: (l, h, i, j) => { const m = maskOf(l, h); return m === null || m[i * L + j] === 1; },
    generated: GEN ? { N: GEN.N, P: GEN.P, K: GEN.K, state: genState, select: genSelect,
      weight: (l, h, s, j) => genHead(l, h)[s * GEN.K + j],
      choose: (l, h) => { genState.layer = l; genState.head = h; $("gen-layer").value = String(l); $("gen-head").value = String(h); genDraw(); } } : null,
  };
  document.body.dataset.ready = "1";
})().catch((err) => {
  document.body.dataset.ready = "error";
  const box = document.getElementById("error");
  box.style.display = ""; box.textContent = "The report failed to load: " + err;
  throw err;
});

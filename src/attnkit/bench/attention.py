"""``attnkit bench attention``: attention speed and memory for every mask kind against the baselines.

For each mask kind and N, side by side in one process (``round_robin``: random order per round, medians):
attnkit ``auto``, PyTorch SDPA with the equivalent dense mask (or ``is_causal`` where that is exact), the
tutorial's naive implementation, ``torch.nn.MultiheadAttention`` (with its projections, as a user runs it),
and compiled flex (``--flex``; CPU: inference only). Forward (no grad) and forward+backward times, GFLOP/s
counting only the unmasked entries (4 * D flops each forward, 2.5x that for the backward), the fraction of
this machine's matmul peak (``F.linear``, measured in the same run) and peak memory of forward+backward.

Slow contenders are cut where they stop fitting in time or memory (``--naive-max``, ``--mha-max``,
``--dense-max``); the results say so. Results: ``benchmarks/results/attention.json`` and PNG plots.

Shape legend: B batch (1), H heads, Hkv key/value heads, N sequence length, D head dim.
"""


from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch
import torch.nn.functional as F

import attnkit as ak
from attnkit._progress import progress
from attnkit._timing import round_robin
from attnkit.bench.common import RESULTS_DIR, matmul_peak_gflops, peak_memory_bytes, write_results
from attnkit.bench.plots import line_panels

SUMMARY = "attention speed and memory for every mask kind vs SDPA, naive, nn.MultiheadAttention, flex"

M = ak.masks
CASES = ["causal", "noncausal", "padding", "window256", "documents", "strided", "alibi", "gqa"]


def case_inputs(case: str, n: int, heads: int, dim: int):
    """(mask, bias, Hkv) of a case at length n."""
    if case == "noncausal":
        return None, None, heads
    if case == "padding":
        return M.padding(torch.tensor([3 * n // 4])), None, heads  # a quarter of the keys is padding
    if case == "window256":
        return M.sliding_window(256), None, heads
    if case == "documents":
        doc = min(2048, max(1, n // 8))  # 8 packed documents (of 2048 at N = 16384)
        return M.document(torch.arange(n)[None] // doc) & M.causal(), None, heads
    if case == "strided":
        return M.causal() & M.strided(128), None, heads
    if case == "alibi":
        return M.causal(), ak.positions.ALiBi(heads), heads
    if case == "gqa":
        return M.causal(), None, max(1, heads // 4)
    return M.causal(), None, heads


def naive(q, k, v, allowed, bias):
    """The tutorial: scores = q k^T / sqrt(d); bias; masked_fill; softmax; @ v (GQA by repeating heads)."""
    k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))  # (B, H, N, D)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, N, N)
    if bias is not None:
        scores = scores + bias
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    return scores.softmax(-1) @ v


def contenders(case, n, args, dtype=torch.float32):
    """name -> (forward fn, forward+backward fn), and the unmasked entry count."""
    H, D = args.heads, args.head_dim
    mask, bias, Hkv = case_inputs(case, n, H, D)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, H, n, D, generator=g, dtype=dtype)
    k = torch.randn(1, Hkv, n, D, generator=g, dtype=dtype)
    v = torch.randn(1, Hkv, n, D, generator=g, dtype=dtype)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    allowed = mask.to_dense(n) if mask is not None else None  # (1, 1, N, N) bool, built outside the timings
    entries = int(allowed.sum()) if allowed is not None else n * n
    causal_flag = M.is_plain_causal(mask) and bias is None
    dense_bias = bias.materialize(*[torch.arange(n)[None]] * 2).to(dtype) if bias is not None and n <= args.dense_max else None
    out: dict[str, tuple] = {}

    def both(fn):
        def fb():
            fn(*leaves).sum().backward()
        return (lambda: fn(q, k, v)), fb

    # the mask is prepared once, outside the timings, as a model prepares it once per forward for all its layers
    # (and as SDPA's dense mask `allowed` is built outside them)
    prepared = ak.masks.prepare(mask, n) if mask is not None else None
    out["attnkit"] = both(lambda q, k, v: ak.attention(q, k, v, prepared, bias=bias))
    if n <= args.dense_max or case in ("causal", "noncausal", "gqa"):
        sdpa_mask = None if causal_flag or allowed is None else allowed
        if dense_bias is not None:
            sdpa_mask = dense_bias.masked_fill(~allowed, float("-inf"))
        if bias is None or dense_bias is not None:
            out["sdpa_dense"] = both(lambda q, k, v: F.scaled_dot_product_attention(
                q, k, v, attn_mask=sdpa_mask, is_causal=causal_flag and sdpa_mask is None, enable_gqa=Hkv != H))
    if bias is not None:  # the speed to match: the same attention without the bias, SDPA's fused causal kernel
        out["sdpa_causal_nobias"] = both(lambda q, k, v: F.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=Hkv != H))
    if case == "documents" and n >= 16:
        doc = min(2048, max(1, n // 8))

        def per_doc(q, k, v):  # SDPA run separately on each document
            return torch.cat([F.scaled_dot_product_attention(q[:, :, s:s + doc], k[:, :, s:s + doc], v[:, :, s:s + doc],
                                                             is_causal=True) for s in range(0, n, doc)], dim=2)
        out["sdpa_per_doc"] = both(per_doc)
    if n <= args.naive_max:
        out["naive"] = both(lambda q, k, v: naive(q, k, v, allowed, dense_bias))
    if n <= args.mha_max and Hkv == H and bias is None:
        mha = torch.nn.MultiheadAttention(H * D, H, batch_first=True, dtype=dtype)
        x = torch.randn(1, n, H * D, generator=g, dtype=dtype)
        xg = x.clone().requires_grad_(True)
        blocked = None if allowed is None else ~allowed[0, 0]  # (N, N) True = blocked (MHA polarity)
        out["nn_mha"] = (lambda: mha(x, x, x, attn_mask=blocked, need_weights=False)[0],
                         lambda: mha(xg, xg, xg, attn_mask=blocked, need_weights=False)[0].sum().backward())
    if args.flex:
        out["flex"] = ((lambda: ak.attention(q, k, v, mask, bias=bias, backend="flex")), None)
    return out, entries, Hkv


def run_case(case, n, args, peak):
    fns, entries, _ = contenders(case, n, args)
    repeats = max(1, args.repeats // max(1, n // 1024)) if n > 1024 else args.repeats
    warmup = 0 if n >= 16384 else 1
    with torch.no_grad():
        fwd = round_robin({k: f for k, (f, _) in fns.items()}, repeats, warmup=warmup)
    fb = round_robin({k: b for k, (_, b) in fns.items() if b is not None}, repeats, warmup=warmup)
    flops = 4 * args.head_dim * args.heads * entries
    row = {"case": case, "n": n, "repeats": repeats, "unmasked_entries_per_head": entries, "contenders": {}}
    for name in fns:
        r = {"fwd_ms": 1e3 * fwd[name], "fwd_gflops": flops / fwd[name] / 1e9}
        r["fwd_peak_fraction"] = r["fwd_gflops"] / peak
        if name in fb:
            r.update(fwdbwd_ms=1e3 * fb[name], fwdbwd_gflops=3.5 * flops / fb[name] / 1e9)
            r["fwdbwd_peak_fraction"] = r["fwdbwd_gflops"] / peak
        row["contenders"][name] = r
    if n in args.memory_at:
        for name, (_, b) in fns.items():
            if b is not None and name != "nn_mha":
                row["contenders"][name]["fwdbwd_peak_bytes"] = peak_memory_bytes(b)
    nobias = row["contenders"].get("sdpa_causal_nobias")
    if nobias:
        ak_ = row["contenders"]["attnkit"]
        row["attnkit_time_over_sdpa_causal_nobias"] = {m: ak_[f"{m}_ms"] / nobias[f"{m}_ms"] for m in ("fwd", "fwdbwd")}
    base = row["contenders"].get("sdpa_dense")
    if base:
        ak_ = row["contenders"]["attnkit"]
        row["attnkit_speedup_vs_sdpa_dense"] = {m: base[f"{m}_ms"] / ak_[f"{m}_ms"] for m in ("fwd", "fwdbwd")}
    return row


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cases", nargs="+", default=CASES, choices=CASES)
    parser.add_argument("--n", nargs="+", type=int, default=[256, 1024, 4096, 16384], help="sequence lengths")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5, help="rounds at N <= 1024 (fewer above)")
    parser.add_argument("--naive-max", type=int, default=4096, help="largest N for the naive implementation")
    parser.add_argument("--mha-max", type=int, default=4096, help="largest N for nn.MultiheadAttention")
    parser.add_argument("--dense-max", type=int, default=16384,
                        help="largest N for SDPA with a dense mask/bias on the sparse cases")
    parser.add_argument("--memory-at", nargs="+", type=int, default=[4096, 16384],
                        help="N at which to record peak memory of forward+backward")
    parser.add_argument("--flex", action="store_true", help="also time compiled flex (CPU: forward only)")
    parser.add_argument("--bf16", action="store_true", help="also time attnkit in bfloat16 vs float32")
    parser.add_argument("--name", default="attention", help="results file name under benchmarks/results/")
    parser.add_argument("--no-plot", action="store_true")


def run(args: argparse.Namespace) -> int:
    torch.manual_seed(0)
    peak = matmul_peak_gflops()
    print(f"matmul peak now: mm {peak['mm']:.0f} GFLOP/s, linear (oneDNN) {peak['linear']:.0f} GFLOP/s")
    rows = []
    for n, case in progress([(n, case) for n in args.n for case in args.cases], desc="bench attention", unit="case"):
        row = run_case(case, n, args, peak["linear"])
        rows.append(row)
        c = row["contenders"]
        print(f"{case:10s} N={n:6d} " + "  ".join(
            f"{k} {v['fwd_ms']:.1f}/{v.get('fwdbwd_ms', float('nan')):.1f}ms" for k, v in c.items()), flush=True)
    payload = {"matmul_peak_gflops": peak, "heads": args.heads, "head_dim": args.head_dim, "dtype": "float32",
               "note": "2-core CPU; read ratios from one run, not absolute times. "
                       f"naive up to N={args.naive_max}, nn.MultiheadAttention up to N={args.mha_max} (time/memory).",
               "rows": rows}
    if args.bf16:
        payload["bf16"] = bf16_speedup(args)
    path = write_results(args.name, payload)
    print(f"wrote {path}")
    if not args.no_plot:
        for p in plot(payload, Path(RESULTS_DIR), args.name):
            print(f"wrote {p}")
    return 0


def bf16_speedup(args, n: int = 4096) -> dict:
    out = {}
    for case in ("causal", "window256"):
        mask, bias, Hkv = case_inputs(case, n, args.heads, args.head_dim)
        fns = {}
        for dtype in (torch.float32, torch.bfloat16):
            q, k, v = (torch.randn(1, h, n, args.head_dim, dtype=dtype) for h in (args.heads, Hkv, Hkv))
            fns[str(dtype)] = (lambda q=q, k=k, v=v, mask=mask: ak.attention(q, k, v, mask))
        with torch.no_grad():
            t = round_robin(fns, args.repeats)
        out[case] = {"n": n, "fp32_ms": 1e3 * t["torch.float32"], "bf16_ms": 1e3 * t["torch.bfloat16"],
                     "speedup": t["torch.float32"] / t["torch.bfloat16"]}
    return out


def plot(payload: dict, out_dir: Path, name: str = "attention") -> list[Path]:
    """One figure per metric (time fwd+bwd, time fwd, peak memory), one panel per case, one style per contender."""
    rows = payload["rows"]
    cases = list(dict.fromkeys(r["case"] for r in rows))
    paths = []
    for metric, label, suffix in (("fwdbwd_ms", "forward+backward time (ms)", "time"),
                                  ("fwd_ms", "forward time (ms)", "fwd_time"),
                                  ("fwdbwd_peak_bytes", "peak memory fwd+bwd (bytes)", "memory")):
        panels: dict[str, dict[str, list]] = {case: {} for case in cases}
        for r in rows:
            for who, c in r["contenders"].items():
                if metric in c:
                    panels[r["case"]].setdefault(who, []).append((r["n"], c[metric]))
        if not any(panels.values()):  # not recorded in this run (e.g. --memory-at 0): no empty figure
            continue
        paths.append(line_panels(panels, out_dir / f"{name}_{suffix}.png", ylabel=label))
    return paths


def replot(payload: dict, results: Path) -> list[Path]:
    """``attnkit bench plots``: this suite's figures redrawn next to ``results``."""
    return plot(payload, results.parent, results.stem)


def markdown_table(payload: dict) -> str:
    """The results as a Markdown table: times in ms (fwd / fwd+bwd), attnkit's speedup over dense SDPA, memory."""
    lines = ["| case | N | attnkit fwd / fwd+bwd ms | SDPA dense mask | other contenders | speedup vs SDPA "
             "(fwd / fwd+bwd) | attnkit useful GFLOP/s fwd+bwd (peak fraction) | peak MiB attnkit / SDPA / naive |",
             "|---|---|---|---|---|---|---|---|"]
    for r in payload["rows"]:
        c = r["contenders"]
        ak_, sd = c["attnkit"], c.get("sdpa_dense")

        def t(x):
            return f"{x['fwd_ms']:.1f} / {x.get('fwdbwd_ms', float('nan')):.1f}" if x else "not run"

        others = "; ".join(f"{n} {t(x)}" for n, x in c.items() if n not in ("attnkit", "sdpa_dense"))
        sp = r.get("attnkit_speedup_vs_sdpa_dense")
        mem = " / ".join(f"{c[n]['fwdbwd_peak_bytes'] / 2**20:.0f}" if n in c and "fwdbwd_peak_bytes" in c[n] else "-"
                         for n in ("attnkit", "sdpa_dense", "naive"))
        lines.append(f"| {r['case']} | {r['n']} | {t(ak_)} | {t(sd)} | {others} | "
                     + (f"{sp['fwd']:.2f}x / {sp['fwdbwd']:.2f}x" if sp else "-")
                     + f" | {ak_.get('fwdbwd_gflops', float('nan')):.0f} ({ak_.get('fwdbwd_peak_fraction', 0):.2f}) | {mem} |")
    return "\n".join(lines)

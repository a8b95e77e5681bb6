"""``attnkit bench dispatch``: what ``ak.attention`` costs over calling PyTorch SDPA directly, side by side in
one process (round-robin medians).

- **overhead**: a tiny call (B=1, H=8, N=16, D=64) where the kernel takes microseconds, so every microsecond of
  Python shows: ``ak.attention`` with a prepared causal mask (every layer after the first), with an unprepared
  ``causal()`` and with no mask, each against the direct SDPA call computing the same thing
  (``is_causal=True`` / no mask). Reported: the median extra microseconds per call.
- **sizes**: attnkit / SDPA time at N = 256, 1024 (causal and not), where the per-call cost fades.
- **decode**: one decoding step's attention, q ``(B, H, Lq, D)`` against a cache's k, v ``(B, Hkv, ctx, D)``
  under a causal mask (bottom-right: the queries are the newest tokens), over a grid of Lq, B, head layouts
  (MHA / GQA / MQA), dtypes and contexts. The baseline is the best direct SDPA call a user would write for it:
  ``enable_gqa=True`` or keys repeated with ``repeat_interleave`` (GQA/MQA), with the bottom-right mask built
  once outside the timing (Lq > 1; SDPA's ``is_causal`` is top-left, wrong here). attnkit runs as a user calls
  it: ``ak.attention(q, k, v, ak.masks.causal())``, and with the mask prepared once. Reported: best SDPA time /
  attnkit time (> 1: attnkit faster), the median over ``BLOCKS`` blocks of side-by-side rounds.

Shape legend: B batch, H query heads, Hkv key/value heads, G = H / Hkv, Lq queries, ctx keys, D head dim.
"""


from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F

import attnkit as ak
from attnkit._timing import round_robin
from attnkit.bench.common import RESULTS_DIR, write_results
from attnkit.bench.plots import line_panels

SUMMARY = "per-call cost of ak.attention over a direct SDPA call, and decode-step attention vs the best SDPA call"

#: head layouts of the decode grid: (H, Hkv)
HEADS = {"MHA": (8, 8), "GQA": (8, 2), "MQA": (8, 1)}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
#: the decode targets of issue 24: best SDPA / attnkit at least this, by context
TARGETS = {512: 0.85, 2048: 0.95, 4096: 0.95, 8192: 0.95}
#: each decode cell is timed in this many blocks of rounds; its ratio is the median of the blocks' ratios (a burst
#: of load on a shared machine spoils one block, not the cell)
BLOCKS = 5
#: a cell whose blocks' ratios spread more than this (interquartile range / median) is "unstable": its ratio is not
#: known to 20%, so it is not judged against a target (a busy machine; ``attnkit bench`` warns of the load)
UNSTABLE = 0.2
#: a cell is "unstable" too when a contender's median call took more than this times its fastest call: other work
#: held the CPU through most of its calls (quiet: ~1.05), which bends ratios without spreading the blocks
INFLATED = 1.5


def overhead(repeats: int, n: int = 16) -> dict:
    """Median extra microseconds per call of ``ak.attention`` over the direct SDPA call (see the docstring)."""
    q, k, v = torch.randn(3, 1, 8, n, 64).unbind(0)  # (B=1, H=8, N, D=64) each
    prepared = ak.masks.prepare(ak.masks.causal(), n)
    fns = {"sdpa_causal": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
           "sdpa_nomask": lambda: F.scaled_dot_product_attention(q, k, v),
           "attnkit_prepared": lambda: ak.attention(q, k, v, prepared),
           "attnkit_unprepared": lambda: ak.attention(q, k, v, ak.masks.causal()),
           "attnkit_nomask": lambda: ak.attention(q, k, v)}
    t = round_robin(fns, repeats, warmup=20)
    us = {name: 1e6 * s for name, s in t.items()}
    return {"shape": f"B=1, H=8, N={n}, D=64, float32", "repeats": repeats, "median_us": us,
            "overhead_us": {"prepared": us["attnkit_prepared"] - us["sdpa_causal"],
                            "unprepared": us["attnkit_unprepared"] - us["sdpa_causal"],
                            "no_mask": us["attnkit_nomask"] - us["sdpa_nomask"]},
            "targets_us": {"prepared": 10.0, "unprepared": 20.0}}


def dense_sizes(sizes: list[int], repeats: int) -> list[dict]:
    """attnkit / SDPA time at larger N (B=1, H=8, D=64, fp32, forward), causal and not: where the per-call cost
    stops showing. (Was ``benchmarks/dispatch.py``.)"""
    rows = []
    for n in sizes:
        for causal in (False, True):
            q, k, v = torch.randn(3, 1, 8, n, 64).unbind(0)  # (B=1, H=8, N, D=64) each
            mask = ak.masks.causal() if causal else None
            t = round_robin({"attnkit": lambda q=q, k=k, v=v, mask=mask: ak.attention(q, k, v, mask),
                             "sdpa": lambda q=q, k=k, v=v, c=causal: F.scaled_dot_product_attention(q, k, v, is_causal=c)},
                            max(5, repeats * 256 // n))
            rows.append({"n": n, "causal": causal, "attnkit_ms": 1e3 * t["attnkit"], "sdpa_ms": 1e3 * t["sdpa"],
                         "attnkit_over_sdpa": t["attnkit"] / t["sdpa"]})
            print(f"  N={n:5d} causal={causal!s:5}  attnkit / SDPA time {rows[-1]['attnkit_over_sdpa']:.3f}")
    return rows


def decode_cell(batch: int, q_len: int, layout: str, dtype: torch.dtype, ctx: int, repeats: int) -> dict:
    """Median times of one decode call's contenders and the ratios best SDPA / attnkit."""
    H, Hkv = HEADS[layout]
    G = H // Hkv
    q = torch.randn(batch, H, q_len, 64, dtype=dtype)  # (B, H, Lq, D)
    k, v = torch.randn(2, batch, Hkv, ctx, 64, dtype=dtype).unbind(0)  # (B, Hkv, ctx, D) each
    bottom_right = None if q_len == 1 else torch.ones(q_len, ctx, dtype=torch.bool).tril(ctx - q_len)  # (Lq, ctx)
    prepared = ak.masks.prepare(ak.masks.causal(), q_len, ctx)
    fns = {"sdpa_gqa": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=bottom_right, enable_gqa=G > 1),
           "attnkit": lambda: ak.attention(q, k, v, ak.masks.causal()),
           "attnkit_prepared": lambda: ak.attention(q, k, v, prepared)}
    # keys repeated per call allocate and free G x the cache: its rounds run apart, right after, so those
    # allocations do not land between the other contenders' calls
    repeat = {} if G == 1 else {"sdpa_repeat": lambda: F.scaled_dot_product_attention(
        q, k.repeat_interleave(G, 1), v.repeat_interleave(G, 1), attn_mask=bottom_right)}  # (B, H, ctx, D) keys
    blocks, samples = [], {}
    for i in range(BLOCKS):
        n = max(3, repeats // BLOCKS)
        blocks.append({**round_robin(fns, n, warmup=3 if i == 0 else 0, samples=samples),
                       **(round_robin(repeat, n, warmup=1, samples=samples) if repeat else {})})
    t = {name: statistics.median(b[name] for b in blocks) for name in (*fns, *repeat)}

    def ratios(name):  # per block (its contenders ran side by side)
        return [min(s for n, s in b.items() if n.startswith("sdpa")) / b[name] for b in blocks]

    plain, prepared = ratios("attnkit"), ratios("attnkit_prepared")
    inflation = max(statistics.median(ts) / min(ts) for ts in samples.values())
    return {"batch": batch, "q_len": q_len, "heads": layout, "dtype": str(dtype).removeprefix("torch."), "ctx": ctx,
            "median_us": {name: 1e6 * s for name, s in t.items()},
            "best_sdpa": min((n for n in t if n.startswith("sdpa")), key=t.get),
            "ratio": statistics.median(plain), "ratio_prepared": statistics.median(prepared),
            "spread": max(spread(plain), spread(prepared)), "inflation": inflation,
            "unstable": max(spread(plain), spread(prepared)) > UNSTABLE or inflation > INFLATED}


def spread(values: list[float]) -> float:
    """Interquartile range / median of ``values`` (the blocks' ratios of one cell): 0 when every block agrees."""
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return (q3 - q1) / statistics.median(values)


def decode_grid(args) -> list[dict]:
    rows = []
    for dtype_name in args.dtypes:
        for ctx in args.contexts:
            for layout in args.heads:
                for batch in args.batches:
                    for q_len in args.q_lens:
                        reps = max(5, args.repeats * 512 // ctx)  # the long cells are slower: fewer rounds
                        row = decode_cell(batch, q_len, layout, DTYPES[dtype_name], ctx, reps)
                        rows.append(row)
                        print(f"  {dtype_name} ctx={ctx:5d} {layout} B={batch} Lq={q_len}: attnkit "
                              f"{row['median_us']['attnkit']:8.1f} us  best SDPA ({row['best_sdpa']}) "
                              f"{row['median_us'][row['best_sdpa']]:8.1f} us  ratio {row['ratio']:.2f} "
                              f"(prepared {row['ratio_prepared']:.2f})"
                              + (f"  UNSTABLE (blocks spread {row['spread']:.0%}, median/fastest call "
                                 f"{row['inflation']:.2f})" if row["unstable"] else ""))
    return rows


def summarise(rows: list[dict]) -> dict:
    """Per dtype and context: the lowest and the median ratio over the grid, and whether the target is met."""
    out = {}
    for dtype in sorted({r["dtype"] for r in rows}):
        for ctx in sorted({r["ctx"] for r in rows}):
            cell = [r for r in rows if r["dtype"] == dtype and r["ctx"] == ctx]
            ratios, prepared = [r["ratio"] for r in cell], [r["ratio_prepared"] for r in cell]
            target = TARGETS.get(ctx)
            unstable = sum(r.get("unstable", False) for r in cell)
            # a target is judged only when every cell's ratio is known to 20%: else "can't say" (None)
            out[f"{dtype} ctx={ctx}"] = {
                "min_ratio": min(ratios), "median_ratio": statistics.median(ratios),
                "min_ratio_prepared": min(prepared), "median_ratio_prepared": statistics.median(prepared),
                "unstable_cells": unstable, "cells": len(cell),
                "target": target, "met": None if target is None or unstable else min(ratios) >= target}
    return out


def plot(payload: dict, path: Path) -> Path:
    """Ratio best SDPA / attnkit against the context, one panel per dtype: the lowest and median over the grid."""
    panels: dict[str, dict[str, list]] = {}
    for label, s in payload["decode"]["summary"].items():
        dtype, ctx = label.split(" ctx=")
        series = panels.setdefault(dtype, {})
        for name, key in (("attnkit (lowest over grid)", "min_ratio"), ("attnkit (median)", "median_ratio"),
                          ("attnkit prepared (lowest)", "min_ratio_prepared")):
            series.setdefault(name, []).append((int(ctx), s[key]))
        if s["target"] is not None:
            series.setdefault("target (for the lowest cell)", []).append((int(ctx), s["target"]))
    return line_panels(panels, path, ylabel="best direct SDPA time / attnkit time", xlabel="context (keys)",
                       log="x", title="decode-step attention: attnkit vs the best direct SDPA call")


def replot(payload: dict, results: Path) -> list[Path]:
    """``attnkit bench plots``: the decode figure redrawn next to ``results`` (none without a decode grid)."""
    return [plot(payload, results.parent / f"{results.stem}_decode.png")] if "decode" in payload else []


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeats", type=int, default=60, help="rounds per decode cell at ctx 512 (fewer above)")
    parser.add_argument("--overhead-repeats", type=int, default=3000)
    parser.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=list(DTYPES))
    parser.add_argument("--contexts", type=int, nargs="+", default=[512, 2048, 8192])
    parser.add_argument("--heads", nargs="+", choices=list(HEADS), default=list(HEADS))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--q-lens", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--sizes", type=int, nargs="*", default=[256, 1024], help="N of the attnkit / SDPA rows")
    parser.add_argument("--skip-decode", action="store_true", help="measure the per-call overhead only")
    parser.add_argument("--out", default=str(RESULTS_DIR))


def run(args: argparse.Namespace) -> int:
    torch.manual_seed(0)
    per_call = overhead(args.overhead_repeats)
    print("per-call overhead over a direct SDPA call (B=1, H=8, N=16, D=64): " + ", ".join(
        f"{name} {us:.1f} us" for name, us in per_call["overhead_us"].items()))
    payload = {"overhead": per_call, "sizes": dense_sizes(args.sizes, args.repeats)}
    out = Path(args.out)
    if not args.skip_decode:
        rows = decode_grid(args)
        payload["decode"] = {"grid": {"dtypes": args.dtypes, "contexts": args.contexts, "heads": args.heads,
                                      "batches": args.batches, "q_lens": args.q_lens, "D": 64},
                             "targets": {str(c): t for c, t in TARGETS.items()}, "rows": rows,
                             "summary": summarise(rows)}
        for label, s in payload["decode"]["summary"].items():
            verdict = ("met" if s["met"] else "NOT met" if s["met"] is False else
                       f"can't say: {s['unstable_cells']} of {s['cells']} cells unstable (their blocks' ratios spread "
                       f"> {UNSTABLE:.0%}, or calls slowed > {INFLATED}x by other work)" if s["unstable_cells"] else "no target")
            print(f"{label}: lowest ratio {s['min_ratio']:.2f} (median {s['median_ratio']:.2f}; prepared lowest "
                  f"{s['min_ratio_prepared']:.2f}); target {s['target']}: {verdict}")
        out.mkdir(parents=True, exist_ok=True)
        payload["plot"] = str(plot(payload, out / "dispatch_decode.png"))
    payload["notes"] = ("Round-robin medians on a shared machine: read ratios. Decode baseline: the faster of SDPA "
                        "enable_gqa=True and SDPA on repeat_interleave'd keys, with the bottom-right causal mask built "
                        "outside the timing. attnkit: ak.attention(q, k, v, ak.masks.causal()) as a user writes it "
                        "(ratio) and with the mask prepared once (ratio_prepared).")
    print(f"wrote {write_results('dispatch', payload, out)}")
    return 0

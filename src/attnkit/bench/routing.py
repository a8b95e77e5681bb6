"""``attnkit bench routing``: does ``auto`` pick the fastest backend? Regret = time(auto's choice) / time(fastest).

A grid of the calls users make (:mod:`attnkit.bench.cells`): causal, sliding windows 64-1024, chunked, packed
documents, padding, strided, global tokens, ALiBi, softcap, sinks; prefill lengths and decode steps; GQA (and MHA
on a few kinds); float32 and bfloat16; forward and forward+backward. Per cell every capable backend is timed side
by side (round-robin medians, one process), then:

- **regret** of auto's choice by predicted cost (the calibration in force: ``attnkit tune``'s file or the built-in
  defaults), and
- **baseline regret** of the choice by rank alone (``cost.use(None)``: the router before cost routing, same run),
- **useful GFLOP/s** of every backend: the FLOPs of the allowed pairs only (4 D per pair and head, x3 with the
  backward) over its time.

``math`` and ``eager`` materialise every score: they are timed only up to ``DENSE_MAX_ENTRIES`` query x key entries
per head (and always when a router picks them), since at L = 1024 math ran 35x slower than blocksparse.
Results: ``benchmarks/results/routing.json`` and ``routing.png`` (regret per cell, both routers).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path

import torch

from attnkit._timing import round_robin
from attnkit.backends import cost, registry
from attnkit.bench import cells
from attnkit.bench.cells import Cell
from attnkit.bench.common import RESULTS_DIR, write_results

SUMMARY = "routing regret: time of auto's choice / time of the fastest capable backend, over a grid of calls"

KINDS = ("none", "causal", "sliding64", "sliding128", "sliding256", "sliding512", "sliding1024", "chunked256",
         "documents", "padding", "causal_padding", "strided64", "global", "alibi", "softcap", "sinks")
#: a few kinds also with MHA heads, and at the short end of the lengths
MHA_KINDS = ("causal", "sliding128", "padding")
DECODE = (("causal", 4096), ("sliding128", 4096), ("padding", 2048))
DENSE_MAX_ENTRIES = cost.DENSE_PRICED_MAX_ENTRIES
DENSE = ("eager", "math")
#: the targets of issue 32
WORST_TARGET, GEOMEAN_TARGET = 1.25, 1.05


def grid(args: argparse.Namespace) -> list[Cell]:
    out = []
    for dtype in args.dtypes:
        for direction in args.directions:
            for L in args.lengths:
                out += [Cell(kind, L, L, "GQA", dtype, direction) for kind in args.kinds]
                if L <= 1024:
                    out += [Cell(kind, L, L, "MHA", dtype, direction) for kind in MHA_KINDS if kind in args.kinds]
            if direction == "forward" and not args.no_decode:
                out += [Cell(kind, L, 1, "GQA", dtype, direction) for kind, L in DECODE]
    return out


def choices(cell: Cell) -> tuple[str, str]:
    """(auto's choice by predicted cost, the choice by rank alone) for ``cell``."""
    call = cells.call_of(cell)
    with torch.set_grad_enabled(cell.direction == "train"):
        by_cost = registry.select(call).name
        with cost.use(None):
            by_rank = registry.select(cells.call_of(cell)).name
    return by_cost, by_rank


def measure(cell: Cell, repeats: int) -> dict:
    by_cost, by_rank = choices(cell)
    names = [n for n in cells.capable(cell)
             if n not in DENSE or cell.Lq * cell.L <= DENSE_MAX_ENTRIES or n in (by_cost, by_rank)]
    with torch.set_grad_enabled(cell.direction == "train"):
        times = round_robin({n: cells.runner(cell, n) for n in names}, repeats, warmup=1)
    fastest = min(times, key=times.get)
    flops = useful_flops(cell)
    return {"cell": cell.name, "kind": cell.kind, "L": cell.L, "Lq": cell.Lq, "heads": cell.heads,
            "dtype": cell.dtype, "direction": cell.direction, "times_ms": {n: 1e3 * t for n, t in times.items()},
            "fastest": fastest, "auto": by_cost, "baseline": by_rank,
            "regret": times[by_cost] / times[fastest], "baseline_regret": times[by_rank] / times[fastest],
            "useful_gflops": {n: flops / t / 1e9 for n, t in times.items()}}


def useful_flops(cell: Cell) -> float:
    """FLOPs of the allowed (query, key) pairs only: 4 D per pair and head (q k^T and p v), x3 with the backward."""
    q, _, _, mask, _ = cells.make(cell)
    H = q.shape[1]
    pairs = cell.Lq * cell.L if mask is None else float(mask.dense().expand(1, 1, cell.Lq, cell.L).sum())
    return 4.0 * H * pairs * cells.D * (3 if cell.direction == "train" else 1)


def summarise(rows: list[dict]) -> dict:
    def stats(key):
        values = [r[key] for r in rows]
        return {"worst": max(values), "geomean": math.exp(statistics.fmean(math.log(v) for v in values)),
                "worst_cell": max(rows, key=lambda r: r[key])["cell"], "cells_over_1.25": sum(v > 1.25 for v in values)}

    out = {"cells": len(rows), "auto": stats("regret"), "baseline": stats("baseline_regret")}
    out["met"] = out["auto"]["worst"] <= WORST_TARGET and out["auto"]["geomean"] <= GEOMEAN_TARGET
    return out


def plot(payload: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted(payload["rows"], key=lambda r: r["baseline_regret"])
    fig, ax = plt.subplots(figsize=(max(8, len(rows) * 0.09), 4.5))
    x = range(len(rows))
    ax.plot(x, [r["baseline_regret"] for r in rows], "o", ms=3, label="by rank (before)", color="tab:gray")
    ax.plot(x, [r["regret"] for r in rows], "o", ms=3, label="by predicted cost (auto)", color="tab:blue")
    ax.axhline(WORST_TARGET, ls="--", lw=1, color="tab:red", label=f"worst target {WORST_TARGET}x")
    ax.set_yscale("log")
    ax.set_xlabel("cells (sorted by the rank router's regret)")
    ax.set_ylabel("time(choice) / time(fastest)")
    s = payload["summary"]
    ax.set_title(f"routing regret, {s['cells']} cells: auto worst {s['auto']['worst']:.2f}x, geomean "
                 f"{s['auto']['geomean']:.3f}x (by rank: {s['baseline']['worst']:.2f}x, {s['baseline']['geomean']:.3f}x)",
                 fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def replot(payload: dict, results: Path) -> list[Path]:
    return [plot(payload, results.parent / f"{results.stem}.png")] if "rows" in payload else []


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeats", type=int, default=3, help="side-by-side rounds per cell (default 3)")
    parser.add_argument("--dtypes", nargs="+", choices=list(cells.DTYPES), default=list(cells.DTYPES))
    parser.add_argument("--directions", nargs="+", choices=list(cost.DIRECTIONS), default=list(cost.DIRECTIONS))
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048], help="prefill lengths L")
    parser.add_argument("--kinds", nargs="+", choices=list(cells.KINDS), default=list(KINDS))
    parser.add_argument("--no-decode", action="store_true", help="skip the decode steps (Lq = 1)")
    parser.add_argument("--name", default="routing", help="results name (benchmarks/results/NAME.json)")
    parser.add_argument("--out", default=str(RESULTS_DIR))


def run(args: argparse.Namespace) -> int:
    torch.manual_seed(0)
    calibration = cost.active(torch.device("cpu"))
    todo = grid(args)
    print(f"routing: {len(todo)} cells, calibration: {calibration.source if calibration else 'none'}")
    rows, start = [], time.perf_counter()
    for cell in todo:
        row = measure(cell, args.repeats)
        rows.append(row)
        flag = "  <-- over 1.25x" if row["regret"] > WORST_TARGET else ""
        print(f"  {row['cell']:<40} fastest {row['fastest']:<11} auto {row['auto']:<11} {row['regret']:.2f}x "
              f"(by rank {row['baseline']:<11} {row['baseline_regret']:.2f}x){flag}", flush=True)
    payload = {"rows": rows, "summary": summarise(rows), "seconds": time.perf_counter() - start,
               "calibration": calibration.source if calibration else None,
               "load_1min": _load(), "grid": {"lengths": args.lengths, "dtypes": args.dtypes,
                                              "directions": args.directions, "kinds": args.kinds, "B": 1, "D": cells.D,
                                              "heads": cells.HEADS, "decode": not args.no_decode},
               "notes": ("Round-robin medians, every capable backend side by side per cell (math/eager only up to "
                         f"{DENSE_MAX_ENTRIES} entries per head unless a router picks them). regret: auto by predicted "
                         "cost; baseline_regret: the same registry routing by rank alone (cost.use(None)), the "
                         "router before cost routing, timed in the same rounds.")}
    s = payload["summary"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    payload["plot"] = str(plot(payload, out / f"{args.name}.png"))
    print(f"auto: worst {s['auto']['worst']:.2f}x ({s['auto']['worst_cell']}), geomean {s['auto']['geomean']:.3f}x; "
          f"by rank: worst {s['baseline']['worst']:.2f}x, geomean {s['baseline']['geomean']:.3f}x; targets "
          f"{WORST_TARGET}/{GEOMEAN_TARGET}: {'met' if s['met'] else 'NOT met'}")
    print(f"wrote {write_results(args.name, payload, out)}")
    return 0


def _load() -> float | None:
    try:
        import os

        return os.getloadavg()[0]
    except OSError:
        return None

"""Dispatch overhead: ak.attention (auto) against calling PyTorch SDPA directly, and the tutorial's naive
implementation, side by side in one process. Medians of several runs; ratios are what to read.

    .venv/bin/python benchmarks/dispatch.py            # writes benchmarks/results/dispatch.json
"""

from __future__ import annotations

import json
import math
import platform
import random
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import attnkit as ak


def naive(q, k, v, causal):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        L = q.shape[-2]
        scores = scores.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
    return scores.softmax(-1) @ v


def round_robin(fns: dict, repeats: int) -> dict[str, float]:
    """Median seconds per contender, running them in a fresh random order each round so that machine noise
    and cache pollution (the naive contender evicts the caches) hit all alike."""
    order = list(fns)
    rng = random.Random(0)
    for fn in fns.values():  # warm-up
        fn(), fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        rng.shuffle(order)
        for name in order:
            fn = fns[name]
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def dispatch_overhead_us(repeats: int = 300) -> float:
    """Median extra microseconds of ak.attention over a direct SDPA call at a tiny size."""
    q, k, v = torch.randn(3, 1, 8, 16, 64).unbind(0)
    t = round_robin({"attnkit": lambda: ak.attention(q, k, v, ak.masks.causal()),
                     "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)}, repeats)
    return 1e6 * (t["attnkit"] - t["sdpa"])


def main() -> None:
    torch.manual_seed(0)
    rows = []
    for n in (256, 1024, 4096):
        for causal in (False, True):
            q, k, v = torch.randn(3, 1, 8, n, 64).unbind(0)  # (B=1, H=8, N, D=64) each
            mask = ak.masks.causal() if causal else None
            repeats = {256: 101, 1024: 21}.get(n, 7)
            fns = {
                "attnkit": lambda: ak.attention(q, k, v, mask),
                "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                "naive": lambda: naive(q, k, v, causal),
            }
            t = round_robin(fns, repeats)
            rows.append({"n": n, "causal": causal, **{f"{k_}_ms": 1e3 * v_ for k_, v_ in t.items()},
                         "attnkit_over_sdpa": t["attnkit"] / t["sdpa"], "naive_over_attnkit": t["naive"] / t["attnkit"]})
            r = rows[-1]
            print(f"N={n:5d} causal={causal!s:5}  attnkit {r['attnkit_ms']:8.2f} ms  sdpa {r['sdpa_ms']:8.2f} ms  "
                  f"naive {r['naive_ms']:8.2f} ms  attnkit/sdpa {r['attnkit_over_sdpa']:.3f}  "
                  f"naive/attnkit {r['naive_over_attnkit']:.2f}")
    overhead = dispatch_overhead_us()
    print(f"dispatch overhead at N=16 (causal): {overhead:.1f} us per call")
    out = {
        "dispatch_overhead_us": overhead,
        "benchmark": "dispatch", "command": "python benchmarks/dispatch.py", "dtype": "float32",
        "shape": "B=1, H=8, D=64, forward only",
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "threads": torch.get_num_threads(), "cpu_capability": torch.backends.cpu.get_cpu_capability()},
        "versions": {"python": sys.version.split()[0], "torch": torch.__version__, "attnkit": ak.__version__},
        "rows": rows,
    }
    path = Path(__file__).parent / "results" / "dispatch.json"
    path.write_text(json.dumps(out, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

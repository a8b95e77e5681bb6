"""Dispatch overhead: ak.attention (auto) against calling PyTorch SDPA directly, and the tutorial's naive
implementation, side by side in one process (bench.common.round_robin: random order per round, medians).

    .venv/bin/python benchmarks/dispatch.py            # writes benchmarks/results/dispatch.json
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F

import attnkit as ak
from attnkit.bench.common import round_robin, write_results


def naive(q, k, v, causal):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        L = q.shape[-2]
        scores = scores.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
    return scores.softmax(-1) @ v


def contenders(q, k, v, causal: bool) -> dict:
    mask = ak.masks.causal() if causal else None
    return {"attnkit": lambda: ak.attention(q, k, v, mask),
            "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
            "naive": lambda: naive(q, k, v, causal)}


def dispatch_overhead_us(repeats: int = 300) -> float:
    """Median extra microseconds of ak.attention over a direct SDPA call at a tiny size."""
    q, k, v = torch.randn(3, 1, 8, 16, 64).unbind(0)
    fns = contenders(q, k, v, causal=True)
    t = round_robin({name: fns[name] for name in ("attnkit", "sdpa")}, repeats)
    return 1e6 * (t["attnkit"] - t["sdpa"])


def main() -> None:
    torch.manual_seed(0)
    rows = []
    for n in (256, 1024, 4096):
        for causal in (False, True):
            q, k, v = torch.randn(3, 1, 8, n, 64).unbind(0)  # (B=1, H=8, N, D=64) each
            t = round_robin(contenders(q, k, v, causal), repeats={256: 101, 1024: 21}.get(n, 7))
            rows.append({"n": n, "causal": causal, **{f"{name}_ms": 1e3 * s for name, s in t.items()},
                         "attnkit_over_sdpa": t["attnkit"] / t["sdpa"], "naive_over_attnkit": t["naive"] / t["attnkit"]})
            r = rows[-1]
            print(f"N={n:5d} causal={causal!s:5}  attnkit {r['attnkit_ms']:8.2f} ms  sdpa {r['sdpa_ms']:8.2f} ms  "
                  f"naive {r['naive_ms']:8.2f} ms  attnkit/sdpa {r['attnkit_over_sdpa']:.3f}  "
                  f"naive/attnkit {r['naive_over_attnkit']:.2f}")
    overhead = dispatch_overhead_us()
    print(f"dispatch overhead at N=16 (causal): {overhead:.1f} us per call")
    path = write_results("dispatch", {"dtype": "float32", "shape": "B=1, H=8, D=64, forward only",
                                      "dispatch_overhead_us": overhead, "rows": rows},
                         Path(__file__).parent / "results")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

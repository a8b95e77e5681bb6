"""ALiBi causal forward (inference) against SDPA ``is_causal`` without the bias, side by side in one process.

CPU time of this thread (``time.thread_time``: a busy machine's other processes don't count), one thread,
B = 1, H = 4, D = 64, float32 unless told otherwise, the causal mask prepared once outside the timings (as a
model does per forward); rounds in random order, medians. Prints the ratio SDPA time / attnkit time (>= 1:
attnkit as fast).

    PYTHONPATH=src OMP_NUM_THREADS=1 python benchmarks/alibi_causal.py 512 1024 2048 4096
    GRAD=1 ...  # forward + backward instead
    B=4 H=8 DTYPE=bfloat16 ...  # another batch, head count or dtype

Shape legend: B batch, H heads, N sequence length, D head dim.
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import attnkit as ak

B, H, D = int(os.environ.get("B", 1)), int(os.environ.get("H", 4)), 64
DTYPE = getattr(torch, os.environ.get("DTYPE", "float32"))
REPS = int(os.environ.get("REPS", 9))
GRAD = os.environ.get("GRAD") == "1"


def medians(fns: dict) -> dict:
    times = {name: [] for name in fns}
    for fn in fns.values():
        fn()  # warm-up (builds the prepared mask's memo: tables, key rows)
    for _ in range(REPS):
        for name in random.sample(list(fns), len(fns)):
            start = time.thread_time()
            fns[name]()
            times[name].append(time.thread_time() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def measure(n: int) -> dict:
    """Median seconds of both contenders at length n."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, n, D, generator=g).to(DTYPE).requires_grad_(GRAD) for _ in range(3))  # (B, H, N, D)
    bias, prepared = ak.positions.ALiBi(H), ak.masks.prepare(ak.masks.causal(), n)

    def run(f):
        return (lambda: f().sum().backward()) if GRAD else f
    fns = {"attnkit": run(lambda: ak.attention(q, k, v, prepared, bias=bias)),
           "sdpa_causal_nobias": run(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))}
    with torch.set_grad_enabled(GRAD):
        return medians(fns)


def main(lengths: list[int]) -> None:
    torch.set_num_threads(1)
    for n in lengths:
        r = measure(n)
        print(f"B={B} H={H} {str(DTYPE)[6:]} N={n} {'fwd+bwd' if GRAD else 'fwd'}: attnkit {1e3 * r['attnkit']:.2f} ms, "
              f"SDPA is_causal without bias {1e3 * r['sdpa_causal_nobias']:.2f} ms, "
              f"ratio {r['sdpa_causal_nobias'] / r['attnkit']:.2f}x", flush=True)


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [512, 1024, 2048, 4096])

"""``attnkit bench linear``: linear attention against softmax attention — time and memory vs N, forward
and forward+backward, the crossover length, and the decode cost per token as the context grows.

Shape: B=1, H=8, D=64, causal, fp32. Softmax contenders: PyTorch SDPA (is_causal) and attnkit auto (which
routes to the fastest capable backend). Linear: attnkit's chunked form (training) and recurrent step (decoding).
"""


from __future__ import annotations

import argparse
from pathlib import Path

import torch

import attnkit as ak
from attnkit._progress import progress
from attnkit._timing import round_robin
from attnkit.bench.common import RESULTS_DIR, peak_memory_bytes, write_results
from attnkit.bench.plots import line_panels
from attnkit.functional.linear import LinearState, linear_attention

SUMMARY = "linear attention vs softmax attention: time, memory, crossover, decode cost"

H, D = 8, 64


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 4096, 16384, 65536])
    p.add_argument("--softmax-max", type=int, default=16384, help="largest N for softmax (quadratic) contenders")
    p.add_argument("--chunk-size", type=int, default=64)
    p.add_argument("--out", type=Path, default=RESULTS_DIR)


def _contenders(n: int, backward: bool, args) -> dict:
    q, k, v = (torch.randn(1, H, n, D, requires_grad=backward) for _ in range(3))  # (B, H, N, D) each

    def run(fn):
        def step():
            out = fn()
            if backward:
                out.sum().backward()
        return step

    fns = {"linear": run(lambda: linear_attention(q, k, v, chunk_size=args.chunk_size))}
    if n <= args.softmax_max:
        fns["sdpa"] = run(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
        fns["attnkit"] = run(lambda: ak.attention(q, k, v, ak.masks.causal()))
    return fns


def _decode_contenders(n: int) -> dict:
    """One new token against a context of n: softmax reads an n-key cache, linear a (D x D) state."""
    q = torch.randn(1, H, 1, D)
    k_cache, v_cache = torch.randn(1, H, n, D), torch.randn(1, H, n, D)  # (B, H, n, D): a filled KV cache
    state = LinearState(torch.rand(1, H, D, D), torch.rand(1, H, D), n)
    with torch.inference_mode():
        return {"softmax_cache": lambda: ak.attention(q, k_cache, v_cache, ak.masks.causal()),
                "linear_state": lambda: linear_attention(q, q, q, state=state, return_state=True)}


def run(args) -> int:
    rows, decode = [], []
    for n in progress(args.lengths, desc="bench linear", unit="length"):
        repeats = 7 if n <= 4096 else 3
        for backward in (False, True):
            fns = _contenders(n, backward, args)
            times = round_robin(fns, repeats, warmup=1)
            memory = {name: peak_memory_bytes(fn) for name, fn in fns.items()}
            row = {"n": n, "pass": "fwd+bwd" if backward else "fwd",
                   **{f"{name}_ms": 1e3 * t for name, t in times.items()},
                   **{f"{name}_peak_mib": m / 2**20 for name, m in memory.items()}}
            if "sdpa" in times:
                row["sdpa_over_linear"] = times["sdpa"] / times["linear"]
            rows.append(row)
            print("  ".join(f"{key}={value:.3g}" if isinstance(value, float) else f"{key}={value}"
                            for key, value in row.items()), flush=True)
        with torch.inference_mode():
            t = round_robin(_decode_contenders(n), 50, warmup=3)
        decode.append({"context": n, **{f"{name}_us": 1e6 * s for name, s in t.items()}})
        print(f"decode at context {n}: " + ", ".join(f"{k}={v:.1f} us" for k, v in decode[-1].items() if k != "context"),
              flush=True)
    crossover = {p: _crossover([r for r in rows if r["pass"] == p]) for p in ("fwd", "fwd+bwd")}
    print(f"crossover (first N where linear beats SDPA): {crossover}")
    payload = {"shape": f"B=1, H={H}, D={D}, causal, float32, chunk_size={args.chunk_size}",
               "note": "medians of interleaved runs on a shared 2-core machine; read the ratios",
               "rows": rows, "decode": decode, "crossover": crossover}
    path = write_results("linear", payload, args.out)
    plot(payload, Path(args.out) / "linear.png")
    print(f"wrote {path} and {Path(args.out) / 'linear.png'}")
    return 0


def _crossover(rows: list[dict]) -> int | None:
    for row in rows:
        if "sdpa_ms" in row and row["linear_ms"] < row["sdpa_ms"]:
            return row["n"]
    return None


def plot(payload: dict, path: Path) -> None:
    """Time of linear vs softmax attention (fwd, fwd+bwd) and decode cost per token vs context."""
    decode = "decode: one token vs context"
    panels: dict[str, dict[str, list]] = {}
    for which in ("fwd", "fwd+bwd"):
        rows = [r for r in payload["rows"] if r["pass"] == which]
        panels[f"time, {which}"] = {name: [(r["n"], r[f"{name}_ms"]) for r in rows if f"{name}_ms" in r]
                                    for name in ("linear", "sdpa", "attnkit")}
    panels[decode] = {name: [(d["context"], d[f"{name}_us"]) for d in payload["decode"]]
                      for name in ("softmax_cache", "linear_state")}
    line_panels(panels, path, ylabel={"time, fwd": "ms", "time, fwd+bwd": "ms", decode: "us per token per layer"},
                xlabel={decode: "context length"} | {p: "N" for p in panels if p != decode}, ncols=3,
                title=payload["shape"], dpi=110, panel_size=(5.0, 4.2))


def replot(payload: dict, results: Path) -> list[Path]:
    """``attnkit bench plots``: this suite's figure redrawn next to ``results``."""
    plot(payload, results.with_suffix(".png"))
    return [results.with_suffix(".png")]

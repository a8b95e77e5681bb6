"""``attnkit bench sparse``: how close ``blocksparse`` comes to the FLOP ideal on long sparse masks.

For each mask and N, side by side in one process (each round a fresh random order, medians of CPU time:
``time.process_time``, steadier than wall time on a shared machine; run it with ``OMP_NUM_THREADS=1``):
``blocksparse`` on a prepared mask, SDPA with ``is_causal`` at the same N (the fused kernel's speed on the
causal triangle), SDPA with the equivalent dense mask (the yardstick, ``--dense-max``), and with ``--baseline
REV`` the ``blocksparse`` of the commit REV (its ``block_plan.py`` and ``blocksparse.py`` loaded from ``git
archive REV``, everything else this checkout's), on the same prepared mask kind.

Useful GFLOP/s count only allowed pairs: 4 * D per pair and query head forward, 3.5x that forward+backward.
The ideal on the block-sparse yardstick is SDPA-with-the-dense-mask's time x the fraction of allowed pairs;
``ideal_fraction`` = that ideal / blocksparse's time. Results: ``benchmarks/results/NAME.json``.

Shape legend: B batch (1), H query heads, Hkv key/value heads, N sequence length, D head dim.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path

import torch
import torch.nn.functional as F

import attnkit as ak
from attnkit._validation import build_call
from attnkit.bench.common import export_revision, write_results

SUMMARY = "blocksparse's useful GFLOP/s on long sparse masks vs SDPA is_causal and the dense-mask yardstick"

M = ak.masks
MASKS = {
    "window256": lambda n: M.causal() & M.sliding_window(256),
    "window128": lambda n: M.causal() & M.sliding_window(128),
    "window512": lambda n: M.causal() & M.sliding_window(512),
    "chunked256": lambda n: M.chunked(256) & M.causal(),
    "strided128": lambda n: M.causal() & M.strided(128),
    "padding": lambda n: M.padding(torch.tensor([3 * n // 4])),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cases", nargs="+", default=["window256"], choices=list(MASKS))
    parser.add_argument("--n", nargs="+", type=int, default=[16384])
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=5, help="rounds (medians)")
    parser.add_argument("--dense-max", type=int, default=16384, help="largest N for SDPA with the dense mask")
    parser.add_argument("--no-backward", action="store_true", help="forward only")
    parser.add_argument("--baseline", default=None, metavar="REV",
                        help="also time blocksparse as committed at REV (e.g. main before a change)")
    parser.add_argument("--name", default="sparse", help="results file name under benchmarks/results/")


def _load(name: str, path: Path, replace: tuple = ()) -> types.ModuleType:
    source = path.read_text()
    for old, new in replace:
        source = source.replace(old, new)
    module = types.ModuleType(name)
    module.__file__ = str(path)
    sys.modules[name] = module
    exec(compile(source, str(path), "exec"), module.__dict__)
    return module


def baseline_backend(rev: str, into: Path):
    """REV's ``BlockSparseBackend()``: its planner and backend modules, the rest of attnkit this checkout's."""
    src = export_revision(rev, into) / "attnkit" / "backends"
    _load("_baseline_block_plan", src / "block_plan.py")
    module = _load("_baseline_blocksparse", src / "blocksparse.py", (
        ("from attnkit.backends.block_plan import", "from _baseline_block_plan import"),))
    return module.BlockSparseBackend()


def _cpu_round_robin(fns: dict, repeats: int, seed: int = 0) -> dict[str, float]:
    """Median CPU seconds per contender, one warm-up each, a fresh random order every round."""
    for fn in fns.values():
        fn()
    order, rng = list(fns), random.Random(seed)
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        rng.shuffle(order)
        for name in order:
            start = time.process_time()
            fns[name]()
            times[name].append(time.process_time() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def run_case(case: str, n: int, dtype: torch.dtype, args, old) -> dict:
    H, Hkv, D = args.heads, args.kv_heads, args.head_dim
    mask = MASKS[case](n)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, n, D, generator=g).to(dtype) for h in (H, Hkv, Hkv))
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    allowed = mask.to_dense(n)  # (1, 1, N, N) bool, built outside the timings
    pairs = int(allowed.sum())
    prepared = {who: M.prepare(mask, n) for who in ("blocksparse", "baseline")}  # separate memos (plans differ)

    def run_new(q, k, v):
        return ak.attention(q, k, v, prepared["blocksparse"], backend="blocksparse")

    def run_old(q, k, v):
        return old(build_call(q, k, v, prepared["baseline"]))

    fns = {"blocksparse": run_new, "sdpa_is_causal": lambda q, k, v: F.scaled_dot_product_attention(
        q, k, v, is_causal=True, enable_gqa=Hkv != H)}
    if old is not None:
        fns["baseline"] = run_old
    if n <= args.dense_max:
        fns["sdpa_dense"] = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=allowed,
                                                                           enable_gqa=Hkv != H)
    with torch.no_grad():
        fwd = _cpu_round_robin({name: (lambda f=f: f(q, k, v)) for name, f in fns.items()}, args.repeats)
    fb = {} if args.no_backward else _cpu_round_robin(
        {name: (lambda f=f: f(*leaves).sum().backward()) for name, f in fns.items()}, args.repeats)
    causal_pairs = n * (n + 1) // 2
    row = {"case": case, "n": n, "dtype": str(dtype).removeprefix("torch."), "allowed_pairs_per_head": pairs,
           "density": pairs / n**2, "contenders": {}}
    for name in fns:
        useful = causal_pairs if name == "sdpa_is_causal" else pairs
        r = {"fwd_ms": 1e3 * fwd[name], "fwd_useful_gflops": 4 * D * H * useful / fwd[name] / 1e9}
        if name in fb:
            r.update(fwdbwd_ms=1e3 * fb[name], fwdbwd_useful_gflops=14 * D * H * useful / fb[name] / 1e9)
        row["contenders"][name] = r
    dense = row["contenders"].get("sdpa_dense")
    if dense:
        for who in ("blocksparse", "baseline"):
            if who in row["contenders"]:
                c = row["contenders"][who]
                c["fwd_ideal_fraction"] = dense["fwd_ms"] * row["density"] / c["fwd_ms"]
                if "fwdbwd_ms" in c:
                    c["fwdbwd_ideal_fraction"] = dense["fwdbwd_ms"] * row["density"] / c["fwdbwd_ms"]
    return row


def run(args: argparse.Namespace) -> int:
    torch.manual_seed(0)
    load_before = _load_1min()
    with tempfile.TemporaryDirectory() as work:
        old = baseline_backend(args.baseline, Path(work) / "baseline") if args.baseline else None
        rows = []
        for n in args.n:
            for case in args.cases:
                for dtype in args.dtypes:
                    row = run_case(case, n, getattr(torch, dtype), args, old)
                    rows.append(row)
                    print(f"{case:10s} N={n:6d} {dtype:8s} " + "  ".join(
                        f"{who} {c['fwd_ms']:.0f}/{c.get('fwdbwd_ms', float('nan')):.0f}ms "
                        f"({c['fwd_useful_gflops']:.1f}/{c.get('fwdbwd_useful_gflops', float('nan')):.1f} GF/s"
                        + (f", ideal {100 * c['fwd_ideal_fraction']:.0f}%/"
                           f"{100 * c.get('fwdbwd_ideal_fraction', float('nan')):.0f}%" if "fwd_ideal_fraction" in c
                           else "") + ")"
                        for who, c in row["contenders"].items()), flush=True)
    payload = {"heads": args.heads, "kv_heads": args.kv_heads, "head_dim": args.head_dim, "baseline": args.baseline,
               "timing": "medians of CPU time (time.process_time) over rounds in a fresh random order",
               "load_1min": {"start": load_before, "end": _load_1min()}, "rows": rows}
    path = write_results(args.name, payload)
    print(f"wrote {path}")
    return 0


def _load_1min() -> float | None:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None

"""Lab ``efficient``: full vs sliding-window vs strided vs linear attention: quality, speed, memory.

Quality: four otherwise identical decoders (sinusoidal positions, so every kind gets the same position
signal; linear attention has no positional term of its own) trained on byte-level text at length L: full
causal attention, a sliding window of W keys, a strided pattern (a window of S keys | every S-th key back,
Child et al.) and linear attention (elu + 1 features). Speed and memory: one attention call forward +
backward at batch 1 over lengths, medians of rounds run in a random order (``bench.common.round_robin``),
and the memory kept for the backward pass (every tensor autograd saves, counted by a saved-tensor hook:
the activation memory that grows with length); the crossover is the first measured length from which the
contender stays faster than full attention.
"""

from __future__ import annotations

import torch

from attnkit import masks
from attnkit._progress import progress
from attnkit._timing import round_robin
from attnkit.backends import attention
from attnkit.functional.linear import linear_attention
from attnkit.labs.harness import evaluate, learned, seeded, text_data, tiny_lm, train
from attnkit.labs.registry import lab
from attnkit.labs.report import Claim, fmt, timed_at_size
from attnkit.labs.variants import lab_attention

KINDS = ("full", "window", "strided", "linear")


def strided_mask(stride: int):
    return masks.causal() & (masks.sliding_window(stride) | masks.strided(stride))


def model_for(kind: str, p: dict):
    common = {"embed_dim": p["dim"], "num_layers": p["layers"], "num_heads": p["heads"], "max_seq_len": p["seq_len"],
              "positions": "sinusoidal"}
    if kind == "window":
        return tiny_lm(window=p["window"], **common)
    if kind == "strided":
        return tiny_lm(attention=lab_attention(f"strided-{p['stride']}", mask=strided_mask(p["stride"])), **common)
    if kind == "linear":
        return tiny_lm(attention="linear", **common)
    return tiny_lm(**common)


def calls(kind: str, L: int, p: dict):
    """(forward + backward closure, forward closure) of one attention call at length L (B=1)."""
    H, D = p["bench_heads"], p["bench_head_dim"]
    g = torch.Generator().manual_seed(L)
    q, k, v = (torch.randn(1, H, L, D, generator=g).requires_grad_(True) for _ in range(3))  # (B, H, L, D)
    fn = {"full": lambda: attention(q, k, v, masks.causal()),
          "window": lambda: attention(q, k, v, masks.sliding_window(p["bench_window"])),
          "strided": lambda: attention(q, k, v, strided_mask(p["bench_stride"])),
          "linear": lambda: linear_attention(q, k, v)}[kind]

    def step():
        fn().sum().backward()

    return step, fn


def saved_bytes(forward) -> int:
    """Bytes of the tensors autograd keeps for the backward pass of ``forward()`` (each saved tensor once)."""
    seen: dict[int, int] = {}

    def pack(t):
        seen[id(t)] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = forward()
    del out
    return sum(seen.values())


def crossover(times: dict, kind: str) -> int | None:
    """The first length from which ``kind`` is faster than full attention at every longer measured length."""
    Ls = sorted(times, key=int)
    for i, L in enumerate(Ls):
        if all(times[M][kind] < times[M]["full"] for M in Ls[i:]):
            return int(L)
    return None


SIZES = {
    "default": {"dim": 64, "layers": 2, "heads": 2, "seq_len": 128, "window": 16, "stride": 8, "batch": 8,
                "steps": 400, "lr": 3e-3, "train_bytes": 1_000_000, "eval_windows": 16,
                "lengths": [256, 512, 1024, 2048, 4096], "repeats": 3, "bench_heads": 4, "bench_head_dim": 32,
                "bench_window": 128, "bench_stride": 64},
    "quick": {"dim": 16, "layers": 1, "heads": 2, "seq_len": 32, "window": 8, "stride": 4, "batch": 2, "steps": 3,
              "lr": 3e-3, "train_bytes": 100_000, "eval_windows": 2, "lengths": [64, 128], "repeats": 1,
              "bench_heads": 2, "bench_head_dim": 16, "bench_window": 16, "bench_stride": 8},
}

#: speed claims are judged only when the longest timed length reaches this (shorter calls time their overhead)
SPEED_FROM_LENGTH = 1024
TIMED = lambda m: timed_at_size(max(map(int, m["times"])), SPEED_FROM_LENGTH, "the longest timed length")  # noqa: E731
Q = lambda m, k: m["quality"][k]["val_loss"]  # noqa: E731
FULL_LEARNED = lambda m: learned(Q(m, "full"), "full attention")  # noqa: E731  (every quality claim's reference)


def _mem_ratio(m, kind):
    Ls = sorted(m["memory"], key=int)
    return m["memory"][Ls[-1]][kind] / m["memory"][Ls[0]][kind], int(Ls[-1]) // int(Ls[0])


CLAIMS = [
    Claim("Local patterns (sliding window, strided) cost little quality on text, where most signal is local",
          "window and strided validation loss each <= 1.05 x full attention's",
          lambda m: (f"full {fmt(Q(m, 'full'))}, window {fmt(Q(m, 'window'))}, strided {fmt(Q(m, 'strided'))}",
                     [Q(m, "window") <= 1.05 * Q(m, "full"), Q(m, "strided") <= 1.05 * Q(m, "full")]),
          needs=FULL_LEARNED),
    Claim("Linear attention trades quality for speed",
          "linear attention's validation loss >= 1.02 x full attention's",
          lambda m: (f"linear {fmt(Q(m, 'linear'))} vs full {fmt(Q(m, 'full'))}",
                     [Q(m, "linear") >= 1.02 * Q(m, "full")]),
          needs=FULL_LEARNED),
    Claim("Linear attention overtakes full attention beyond a crossover length",
          "linear faster than full (forward + backward) at some measured length",
          lambda m: (f"crossover {m['crossover']['linear'] or 'none'} (measured "
                     f"{', '.join(m['times'])}); at the longest: linear "
                     f"{fmt(1000 * m['times'][max(m['times'], key=int)]['linear'])} ms vs full "
                     f"{fmt(1000 * m['times'][max(m['times'], key=int)]['full'])} ms",
                     [m["crossover"]["linear"] is not None]),
          needs=TIMED),
    Claim("A sliding window is faster than full attention at long lengths",
          "window (forward + backward) at the longest length <= 0.7 x full",
          lambda m: (f"window {fmt(1000 * m['times'][max(m['times'], key=int)]['window'])} ms vs full "
                     f"{fmt(1000 * m['times'][max(m['times'], key=int)]['full'])} ms; crossover "
                     f"{m['crossover']['window'] or 'none'}",
                     [m["times"][max(m["times"], key=int)]["window"]
                      <= 0.7 * m["times"][max(m["times"], key=int)]["full"]]),
          needs=TIMED),
    Claim("Full attention needs memory quadratic in length; linear and windowed attention linear",
          "memory kept for backward: full grows >= (length ratio)^2 / 2 over the range; linear's <= 2 x the length "
          "ratio",
          lambda m: (f"memory growth over {_mem_ratio(m, 'full')[1]}x length: full {fmt(_mem_ratio(m, 'full')[0])}x,"
                     f" window {fmt(_mem_ratio(m, 'window')[0])}x, linear {fmt(_mem_ratio(m, 'linear')[0])}x",
                     [_mem_ratio(m, "full")[0] >= _mem_ratio(m, "full")[1] ** 2 / 2,
                      _mem_ratio(m, "linear")[0] <= 2 * _mem_ratio(m, "linear")[1]])),
]


@lab("efficient", "full vs sliding window vs strided vs linear attention", sizes=SIZES, claims=CLAIMS)
def measure(p: dict, plots) -> dict:
    data = text_data(p["train_bytes"], 100_000)
    x, y = data.eval_windows(p["seq_len"], p["eval_windows"] * p["seq_len"])
    quality = {}
    for kind in KINDS:
        seeded(p["seed"])
        model = model_for(kind, p)
        hist = train(model, data.sampler(p["batch"], p["seq_len"]), steps=p["steps"], lr=p["lr"], seed=p["seed"])
        quality[kind] = {"val_loss": evaluate(model, x, y), "step_ms": hist.median_step_ms()}
    times, memory = {}, {}
    for L in progress(p["lengths"], desc="lab efficient: timing", unit="length"):
        fns = {kind: calls(kind, L, p) for kind in KINDS}
        times[str(L)] = round_robin({kind: f[0] for kind, f in fns.items()}, repeats=p["repeats"], warmup=1)
        memory[str(L)] = {kind: saved_bytes(f[1]) for kind, f in fns.items()}
    cross = {kind: crossover(times, kind) for kind in KINDS if kind != "full"}
    with plots.figure("efficient", "one attention call, forward + backward, B=1", ncols=2) as (a, b):
        Ls = [int(L) for L in times]
        for kind in KINDS:
            label = f"{kind} ({fmt(quality[kind]['val_loss'])} nats)"
            a.plot(Ls, [1000 * times[str(L)][kind] for L in Ls], "-o", ms=3, label=label)
            b.plot(Ls, [memory[str(L)][kind] / 2**20 for L in Ls], "-o", ms=3, label=kind)
        for ax, label in ((a, "ms"), (b, "memory kept for backward (MiB)")):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("length")
            ax.set_ylabel(label)
        a.legend(fontsize=7, title="kind (val loss)", title_fontsize=7)
    notes = [f"Quality: 4 decoders of width {p['dim']}, {p['layers']} layers, sinusoidal positions, {p['steps']} steps"
             f" of {p['batch']} x {p['seq_len']} bytes; window W={p['window']}; strided S={p['stride']}.",
             f"Speed/memory: q, k, v (1, {p['bench_heads']}, L, {p['bench_head_dim']}) float32 through "
             f"attnkit.attention (backend auto: causal, sliding_window({p['bench_window']}), causal & "
             f"(sliding_window({p['bench_stride']}) | strided({p['bench_stride']}))) and "
             "attnkit.functional.linear_attention (chunked); medians of "
             f"{p['repeats']} rounds on a shared machine: read the ratios."]
    return {"quality": quality, "times": times, "memory": memory, "crossover": cross, "notes": notes}

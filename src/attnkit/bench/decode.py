"""``attnkit bench decode``: tokens/s of cached generation for a GPT-2-shaped decoder, against Hugging Face
transformers' ``GPT2LMHeadModel`` of the same shape and weights (eager and sdpa attention, its default cache)
and against attnkit without a cache, side by side in one process; plus ms/token against context length with
the sliding-window cache.

Reported: tokens/s (end to end: prefill + decode, greedy, no early stop), the ratio to the best transformers
setting, and the fraction of the memory-bandwidth bound: a decode step must read every weight once, so it
cannot take less than ``weight bytes / bandwidth`` (bandwidth measured in the same run, a STREAM-style copy);
also the fraction of the FLOP bound (2 FLOPs per weight per token against ``F.linear``'s measured peak).

Shape legend: B batch, P prompt length, N new tokens, E width, V vocab.
"""


from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from attnkit._progress import progress
from attnkit._timing import round_robin
from attnkit.bench.common import RESULTS_DIR, matmul_peak_gflops, write_results
from attnkit.bench.decode_loops import BareCompiledGreedy, CompiledGreedy, bare_torch_greedy
from attnkit.errors import AttnkitValueError
from attnkit.models.builders import build_lm
from attnkit.models.generation import generate, stream_generate
from attnkit.models.lm import TransformerLM

SUMMARY = "tokens/s of cached decoding vs Hugging Face transformers and no cache"


def gpt2_decoder(vocab: int = 8192, dim: int = 512, layers: int = 4, heads: int = 8, max_positions: int = 1024,
                 positions: str = "learned", window: int | None = None) -> TransformerLM:
    """GPT-2 (pre-norm LayerNorm, biases, tanh-GELU MLP, learned positions, tied head) as a builder call.

    ``positions="rope"`` replaces the learned table (for contexts beyond ``max_positions``); ``window`` makes
    every layer a sliding window of that many keys.
    """
    return build_lm("nano", vocab_size=vocab, embed_dim=dim, num_layers=layers, num_heads=heads, max_seq_len=max_positions,
                    positions=positions, window=window, bias=True, mlp="gelu", tie_embeddings=True).eval()


def gpt2_from_hf(hf) -> TransformerLM:
    """The weights of a transformers ``GPT2LMHeadModel`` in attnkit's GPT-2 (the integrations' converter: Conv1D
    weights transposed, learned positions, tied head), in eval mode."""
    from attnkit.integrations.hf.convert import from_hf

    return from_hf(hf)


def hf_gpt2(vocab: int, dim: int, layers: int, heads: int, attn_implementation: str, max_positions: int = 1024):
    """A randomly initialised transformers GPT2LMHeadModel of this shape (eval mode)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=vocab, n_embd=dim, n_layer=layers, n_head=heads, n_positions=max_positions,
                        bos_token_id=None, eos_token_id=None, attn_implementation=attn_implementation)
    return GPT2LMHeadModel(config).eval()


def copy_bandwidth_gbs(mib: int = 256, repeats: int = 5) -> float:
    """STREAM-style copy bandwidth: (bytes read + bytes written) / time, medians."""
    src = torch.randn(mib * 2**20 // 4)
    dst = torch.empty_like(src)
    t = round_robin({"copy": lambda: dst.copy_(src)}, repeats)["copy"]
    return 2 * src.numel() * 4 / t / 1e9


def read_bandwidth_gbs(mib: int = 256, repeats: int = 5) -> float:
    """Read-only bandwidth: bytes read by a sum over a large tensor / time, medians."""
    src = torch.randn(mib * 2**20 // 4)
    t = round_robin({"read": lambda: src.sum()}, repeats)["read"]
    return src.numel() * 4 / t / 1e9


def weight_matvec_ms(model: TransformerLM, batch: int, repeats: int = 5) -> float:
    """ms per decode step of the model's weight matrix-vector products alone (every Linear and the tied head
    on ``batch`` rows, back to back): the floor any decoder of this shape pays on this machine."""
    linears = [m for m in model.modules() if isinstance(m, nn.Linear) and m is not model.head]  # head: below
    dtype = model.embed.weight.dtype
    xs = {m.in_features: torch.randn(batch, 1, m.in_features, dtype=dtype) for m in linears}  # (B, 1, in)
    head_x = torch.randn(batch, 1, model.embed.weight.shape[1], dtype=dtype)  # (B, 1, E)

    def chain():
        for m in linears:
            m(xs[m.in_features])
        F.linear(head_x, model.embed.weight)

    with torch.inference_mode():
        return 1e3 * round_robin({"chain": chain}, repeats * 10)["chain"]


def weight_bytes(model: TransformerLM) -> int:
    """Bytes a decode step must read: every parameter once (the tied head/embedding once), except the
    position table, of which it reads one row."""
    skip = set() if model.pos_embed is None else {id(p) for p in model.pos_embed.parameters()}
    return sum(p.numel() * p.element_size() for p in model.parameters() if id(p) not in skip)


def _hf_generate(model, prompt, new_tokens):
    with torch.inference_mode():
        return model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
                              min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)


def _nocache_generate(model, prompt, new_tokens):
    """Greedy decoding that recomputes the full forward for every new token (no cache)."""
    tokens = prompt
    with torch.inference_mode():
        for _ in range(new_tokens):
            nxt = model(tokens)[:, -1].argmax(-1, keepdim=True)  # (B, 1)
            tokens = torch.cat([tokens, nxt], dim=1)
    return tokens


def lm_vs_bare(batch: int = 1, prompt_len: int = 32, new_tokens: int = 64, repeats: int = 5, vocab: int = 8192,
               dim: int = 512, layers: int = 4, heads: int = 8, compiled: bool = True) -> dict:
    """attnkit's own ``TransformerLM`` decode against a bare torch loop of the same model (same weights, same
    greedy tokens), side by side in random order: eager ``generate`` (dynamic and static cache) against
    :func:`bare_torch_greedy`, and :class:`CompiledGreedy` against :class:`BareCompiledGreedy`."""
    torch.manual_seed(0)
    model = gpt2_decoder(vocab, dim, layers, heads)
    prompt = torch.randint(0, vocab, (batch, prompt_len))  # (B, P)
    want = bare_torch_greedy(model, prompt, new_tokens).tolist()
    fns = {"bare_loop": lambda: bare_torch_greedy(model, prompt, new_tokens)}
    for kind in ("dynamic", "static"):
        fns[f"attnkit_{kind}"] = lambda kind=kind: generate(model, prompt.tolist(), max_new_tokens=new_tokens,
                                                            cache=kind)
    if compiled:
        fns["attnkit_static_compiled"] = CompiledGreedy(model, batch, prompt_len + new_tokens)
        fns["bare_loop_compiled"] = BareCompiledGreedy(model, batch, prompt_len + new_tokens)
    same = {}
    for name, fn in fns.items():
        got = fn(prompt, new_tokens) if isinstance(fn, (CompiledGreedy, BareCompiledGreedy)) else fn()
        same[name] = (got if isinstance(got, list) else got.tolist()) == want
    calls = {name: (lambda fn=fn: fn(prompt, new_tokens)) if isinstance(fn, (CompiledGreedy, BareCompiledGreedy))
             else fn for name, fn in fns.items()}
    t = round_robin(calls, repeats, warmup=1)
    rows = {name: {"ms_per_token": 1e3 * s / new_tokens, "same_tokens_as_bare_loop": same[name]}
            for name, s in t.items()}
    ratios = {"TransformerLM eager (dynamic) vs bare loop": t["bare_loop"] / t["attnkit_dynamic"],
              "TransformerLM eager (static) vs bare loop": t["bare_loop"] / t["attnkit_static"]}
    if compiled:
        ratios["compiled vs bare loop compiled"] = t["bare_loop_compiled"] / t["attnkit_static_compiled"]
    return {"config": {"batch": batch, "prompt": prompt_len, "new_tokens": new_tokens, "repeats": repeats,
                       "vocab": vocab, "dim": dim, "layers": layers, "heads": heads, "dtype": "float32"},
            "contenders": rows, "speed_ratios": ratios}


def bench_case(hf_models, ours, batch, prompt_len, new_tokens, nocache_tokens, repeats, vocab, compiled=True):
    prompt = torch.randint(0, vocab, (batch, prompt_len))
    prompts = prompt.tolist()
    fns = {f"hf_{name}": (lambda m=m: _hf_generate(m, prompt, new_tokens)) for name, m in hf_models.items()}
    for kind in ("dynamic", "static"):
        fns[f"attnkit_{kind}"] = lambda kind=kind: generate(ours, prompts, max_new_tokens=new_tokens, cache=kind)
    fns["torch_bare_loop"] = lambda: bare_torch_greedy(ours, prompt, new_tokens)
    # the same greedy tokens from both libraries (same weights): a check that the race is fair
    want = _hf_generate(hf_models["sdpa"], prompt, 8)[:, prompt_len:].tolist()
    same = generate(ours, prompts, max_new_tokens=8) == want and bare_torch_greedy(ours, prompt, 8).tolist() == want
    if compiled:
        run_compiled = CompiledGreedy(ours, batch, prompt_len + new_tokens)
        start = time.perf_counter()
        same = same and run_compiled(prompt, 8).tolist() == want
        compile_s = time.perf_counter() - start
        fns["attnkit_static_compiled"] = lambda: run_compiled(prompt, new_tokens)
    t = round_robin(fns, repeats, warmup=1)
    t_nc = round_robin({"attnkit_nocache": lambda: _nocache_generate(ours, prompt, nocache_tokens)}, 1, warmup=0)
    rows = {name: {"seconds": s, "tokens_per_s": batch * new_tokens / s, "ms_per_step": 1e3 * s / new_tokens}
            for name, s in t.items()}
    rows["attnkit_nocache"] = {"seconds": t_nc["attnkit_nocache"], "new_tokens": nocache_tokens,
                               "tokens_per_s": batch * nocache_tokens / t_nc["attnkit_nocache"],
                               "ms_per_step": 1e3 * t_nc["attnkit_nocache"] / nocache_tokens}
    if compiled:
        rows["attnkit_static_compiled"]["compile_seconds"] = compile_s
    return rows, same


def sliding_curve(dim, layers, heads, vocab, window, contexts, repeats=1):
    """ms per decoded token against context length: sliding-window cache vs dynamic cache (full causal)."""
    contexts = [c for c in contexts if c > 33]  # the prompt is 32 tokens
    max_ctx = max(contexts)
    out = {}
    for name, kwargs, kind in (("sliding", {"window": window}, "sliding"), ("dynamic_full_causal", {}, "dynamic")):
        torch.manual_seed(0)
        model = gpt2_decoder(vocab, dim, layers, heads, positions="rope", **kwargs)
        prompt = [torch.randint(0, vocab, (32,)).tolist()]
        best = None
        for _ in range(repeats):
            stamps = []
            for _row, _tok in stream_generate(model, prompt, max_new_tokens=max_ctx - 32, cache=kind):
                stamps.append(time.perf_counter())
            steps = torch.tensor(stamps, dtype=torch.float64).diff() * 1e3  # (max_ctx - 33,) ms; step i at context 33 + i
            best = steps if best is None else torch.minimum(best, steps)
        # median over the (up to) 64 steps ending at context c
        out[name] = {str(c): float(best[max(0, c - 33 - 63):c - 32].median()) for c in contexts}
    return out


def plot(curve: dict, path, window: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, points in curve.items():
        xs = [int(c) for c in points]
        ax.plot(xs, [1e3 / points[c] for c in points], marker="o", label=name.replace("_", " "))
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("tokens / s (batch 1)")
    ax.set_xscale("log", base=2)
    ax.set_title(f"decode speed: sliding-window cache (W={window}) vs dynamic")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--prompts", type=int, nargs="+", default=[32, 512])
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--nocache-tokens", type=int, default=32, help="new tokens for the (slow) no-cache contender")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--contexts", type=int, nargs="+", default=[64, 128, 256, 512, 1024, 2048, 4096])
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile'd static-cache contender")
    parser.add_argument("--out", default=str(RESULTS_DIR))
    parser.add_argument("--parts", default="hf,lm_vs_bare",
                        help="comma-separated: hf (vs transformers, and the sliding-window curve), lm_vs_bare "
                             "(TransformerLM vs a bare torch loop, eager and compiled; written to decode_lm_vs_bare.json)")


def run(args) -> int:
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    unknown = parts - {"hf", "lm_vs_bare"}
    if unknown or not parts:
        raise AttnkitValueError(f"--parts {args.parts!r}: choose from hf, lm_vs_bare (comma-separated), "
                                f"got unknown {sorted(unknown)}.")
    if "lm_vs_bare" in parts:
        _run_lm_vs_bare(args)
    if "hf" in parts:
        _run_hf(args)
    return 0


def _run_lm_vs_bare(args) -> None:
    """The ``lm_vs_bare`` part: TransformerLM against the bare torch loop, printed and written."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None  # the machine is shared: say how busy
    record = lm_vs_bare(batch=1, prompt_len=32, new_tokens=64, repeats=args.repeats, vocab=args.vocab,
                        dim=args.dim, layers=args.layers, heads=args.heads, compiled=not args.no_compile)
    for name, r in record["contenders"].items():
        print(f"  {name:26s} {r['ms_per_token']:6.2f} ms/token  same tokens: {r['same_tokens_as_bare_loop']}")
    for name, ratio in record["speed_ratios"].items():
        print(f"  {name}: x{ratio:.2f}")
    record["load_1min_at_start"] = load
    record["notes"] = ("Medians of round-robin runs in random order, one process; speed_ratios = bare-loop time / "
                       "attnkit time (>= 1.0: attnkit at least as fast). Greedy, B=1, prompt 32, 64 new tokens; "
                       "compile time excluded (one warm-up call). attnkit's decode steps pass no positions (the "
                       "caches continue their own); every prefill computes the last prompt token's logits only.")
    print(f"wrote {write_results('decode_lm_vs_bare', record, args.out)}")


def _bounds(ours: TransformerLM) -> dict:
    """What bounds a decode step on this machine, measured now: copy and read bandwidth against the weight bytes
    (ms per step), and the FLOP bound's ingredients."""
    bandwidth, read_bw, wbytes = copy_bandwidth_gbs(), read_bandwidth_gbs(), weight_bytes(ours)
    out = {"copy_bandwidth_gbs": bandwidth, "weight_bytes": wbytes,
           "bandwidth_bound_ms_per_step": 1e3 * wbytes / (bandwidth * 1e9),
           "read_bandwidth_gbs": read_bw, "read_bandwidth_bound_ms_per_step": 1e3 * wbytes / (read_bw * 1e9),
           "linear_peak_gflops": matmul_peak_gflops()["linear"],  # GFLOP/s of F.linear (oneDNN), measured now
           "weight_flops_per_token": 2 * wbytes / 4}  # one multiply-add per fp32 weight
    print(f"copy bandwidth {bandwidth:.1f} GB/s; weights {wbytes / 1e6:.1f} MB -> bound "
          f"{out['bandwidth_bound_ms_per_step']:.2f} ms per step; linear peak {out['linear_peak_gflops']:.0f} GFLOP/s; "
          f"read bandwidth {read_bw:.1f} GB/s -> bound {out['read_bandwidth_bound_ms_per_step']:.2f} ms")
    return out


def _hf_case(args, hf_models, ours, bounds: dict, batch: int, prompt_len: int) -> dict:
    """One (batch, prompt) case of the ``hf`` part: every contender's rows with their ratios to the best
    transformers setting and to the bounds, printed."""
    rows, same = bench_case(hf_models, ours, batch, prompt_len, args.new_tokens, args.nocache_tokens,
                            args.repeats, args.vocab, compiled=not args.no_compile)
    best_hf = max(rows["hf_eager"]["tokens_per_s"], rows["hf_sdpa"]["tokens_per_s"])
    floor_ms = weight_matvec_ms(ours, batch)
    for r in rows.values():
        r["vs_best_hf"] = r["tokens_per_s"] / best_hf
        r["fraction_of_bandwidth_bound"] = bounds["bandwidth_bound_ms_per_step"] / r["ms_per_step"]
        r["fraction_of_read_bandwidth_bound"] = bounds["read_bandwidth_bound_ms_per_step"] / r["ms_per_step"]
        r["fraction_of_matvec_floor"] = floor_ms / r["ms_per_step"]
        r["fraction_of_flop_bound"] = (batch * bounds["weight_flops_per_token"] / (r["ms_per_step"] * 1e-3)
                                       / (bounds["linear_peak_gflops"] * 1e9))
    print(f"B={batch} P={prompt_len} (same tokens as HF: {same}; weight matvecs alone {floor_ms:.2f} ms/step)")
    for name, r in rows.items():
        print(f"  {name:24s} {r['tokens_per_s']:8.1f} tok/s  {r['ms_per_step']:6.2f} ms/step  "
              f"x{r['vs_best_hf']:.2f} vs best HF  {100 * r['fraction_of_bandwidth_bound']:5.1f}% of bound")
    return {"batch": batch, "prompt": prompt_len, "same_greedy_tokens_as_hf": same,
            "weight_matvec_floor_ms_per_step": floor_ms, "contenders": rows}


def _run_hf(args) -> None:
    """The ``hf`` part: every (batch, prompt) case against transformers, then the sliding-window curve; written
    to decode.json with its plot."""
    torch.manual_seed(0)
    shape = (args.vocab, args.dim, args.layers, args.heads)
    hf_models = {impl: hf_gpt2(*shape, impl) for impl in ("eager", "sdpa")}
    hf_models["eager"].load_state_dict(hf_models["sdpa"].state_dict())
    ours = gpt2_from_hf(hf_models["sdpa"])
    bounds = _bounds(ours)
    cases = [_hf_case(args, hf_models, ours, bounds, batch, prompt_len)
             for batch in progress(args.batches, desc="bench decode", unit="batch size") for prompt_len in args.prompts]
    curve = sliding_curve(args.dim, args.layers, args.heads, args.vocab, args.window, args.contexts)
    for name, points in curve.items():
        print(f"  {name:20s} " + "  ".join(f"{c}: {ms:.2f} ms" for c, ms in points.items()))
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    plot(curve, out_dir / "decode_sliding.png", args.window)
    path = write_results("decode", {
        "config": {"vocab": args.vocab, "dim": args.dim, "layers": args.layers, "heads": args.heads,
                   "new_tokens": args.new_tokens, "nocache_tokens": args.nocache_tokens, "repeats": args.repeats,
                   "dtype": "float32", "sampling": "greedy, no stop tokens"},
        **bounds,
        "cases": cases, "sliding_window": {"window": args.window, "ms_per_token_vs_context": curve,
                                           "plot": str(out_dir / "decode_sliding.png")},
        "notes": "Medians of round-robin runs on a shared 2-core machine (started when the 1-minute load was "
                 "< 1.3; other engineers' jobs may have run during it); read ratios. tokens/s counts B x new tokens "
                 "over prefill + decode. The no-cache contender generates only nocache_tokens tokens (one run). "
                 "The copy bandwidth is STREAM-style (read + write bytes); weight reads in a matrix-vector chain run "
                 "faster than it, so fraction_of_bandwidth_bound can exceed 1; fraction_of_read_bandwidth_bound uses "
                 "the read-only bandwidth. weight_matvec_floor_ms_per_step times the model's Linear/head "
                 "matrix-vector products alone, back to back (part of the 67 MB may stay in cache); "
                 "fraction_of_matvec_floor = that floor / ms per step. attnkit_static_compiled: prefill eager, "
                 "decode step torch.compile'd (inductor, one graph), compile time excluded (compile_seconds). "
                 "torch_bare_loop: the same model as one loop of bare functional torch calls on its weights (no "
                 "modules, no checks): what any library built from PyTorch ops can at best reach on this machine.",
    }, out_dir)
    print(f"wrote {path}")

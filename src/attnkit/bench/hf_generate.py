"""Greedy ``generate`` tokens/s of Hugging Face models with ``attn_implementation="attnkit"`` against transformers'
own implementation (``attnkit bench hf --parts generate``).

One tiny-but-not-trivial config per family (:data:`FAMILIES`: LLaMA, Mistral, Qwen2, GPT-2, Gemma-2), the same
weights once per implementation, each with its own config. Per family and cache kind (``dynamic``; ``static``
run eagerly; ``static_compiled``: transformers' own ``CompileConfig(fullgraph=True, dynamic=False)`` over a static
cache), every contender's tokens must equal the baseline's on the same cache (transformers' choice: ``sdpa``,
``eager`` for Gemma-2, whose softcap sdpa refuses), and attnkit's calls are counted (a contender that does not run
the implementation it is named for is refused). Medians of round-robin runs; read the ratios.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnkit._hooks import add_observer, remove_observer
from attnkit._timing import round_robin
from attnkit.errors import AttnkitError, AttnkitValueError

VOCAB = 1024


@dataclass(frozen=True)
class TinyModel:
    """How to build one family's tiny model at the bench's sizes, and transformers' own implementation for it
    (not :class:`attnkit.integrations.hf.families.Family`, the converters' name mapping)."""

    model: str  # the transformers class
    config: Callable  # (tf, args) -> the transformers config
    baseline: str = "sdpa"


def _decoder(args) -> dict:
    return {"vocab_size": VOCAB, "hidden_size": args.gen_dim, "intermediate_size": 2 * args.gen_dim,
            "num_hidden_layers": args.gen_layers, "num_attention_heads": args.heads,
            "num_key_value_heads": args.kv_heads, "max_position_embeddings": 512}


FAMILIES: dict[str, TinyModel] = {
    "llama": TinyModel("LlamaForCausalLM", lambda tf, a: tf.LlamaConfig(**_decoder(a))),
    "mistral": TinyModel("MistralForCausalLM", lambda tf, a: tf.MistralConfig(**_decoder(a),
                                                                              sliding_window=a.gen_window)),
    "qwen2": TinyModel("Qwen2ForCausalLM", lambda tf, a: tf.Qwen2Config(  # the upper half of the layers slide
        **_decoder(a), use_sliding_window=True, sliding_window=a.gen_window, max_window_layers=a.gen_layers // 2)),
    "gpt2": TinyModel("GPT2LMHeadModel", lambda tf, a: tf.GPT2Config(
        vocab_size=VOCAB, n_embd=a.gen_dim, n_layer=a.gen_layers, n_head=a.heads, n_positions=512, bos_token_id=1,
        eos_token_id=2)),
    "gemma2": TinyModel("Gemma2ForCausalLM", lambda tf, a: tf.Gemma2Config(  # alternating window/full, softcap
        **_decoder(a), head_dim=a.gen_dim // a.heads, sliding_window=a.gen_window, attn_logit_softcapping=50.0,
        final_logit_softcapping=30.0, query_pre_attn_scalar=a.gen_dim // a.heads), baseline="eager"),
}


class CountCalls:
    """Counts the ``ak.attention`` calls made while active (proof of which implementation a model ran)."""

    def __enter__(self):
        self.calls = 0
        add_observer(self._observe)
        return self

    def __exit__(self, *exc):
        remove_observer(self._observe)

    def _observe(self, call, result):
        self.calls += 1


def parse_families(text: str, flag: str = "--families") -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in FAMILIES]
    if unknown or not names:
        raise AttnkitValueError(f"{flag} {text!r}: choose from {', '.join(FAMILIES)} (comma-separated), got "
                                f"unknown {unknown}.")
    return names


def _models(family: str, args) -> dict:
    """``{implementation: model}``: the family's model once per implementation, same weights, fp32, eval."""
    import transformers as tf

    import attnkit.integrations.hf  # noqa: F401  (registers "attnkit")

    tf.logging.set_verbosity_error()
    spec = FAMILIES[family]
    cls = getattr(tf, spec.model)
    torch.manual_seed(0)
    config = spec.config(tf, args)
    base = cls(config).to(args.device).eval()
    impls = dict.fromkeys(("attnkit", spec.baseline) + (() if args.no_eager or family != "llama" else ("eager",)))
    models = {}
    for impl in impls:
        # Each model its own config: set_attn_implementation writes into the config, and a shared one would make
        # every contender run the last implementation set.
        m = cls(copy.deepcopy(config)).to(args.device).eval()
        m.load_state_dict(base.state_dict())
        m.set_attn_implementation(impl)
        models[impl] = m
    return models


def _kinds(family: str, args) -> dict[str, dict]:
    """``{cache kind: generate's extra arguments}`` for ``family``: compiled only for ``--compile-families``."""
    import transformers as tf

    kinds = {"dynamic": {}, "static": {"cache_implementation": "static"}}
    if not args.no_compile and family in parse_families(args.compile_families, "--compile-families"):
        compile_config = tf.CompileConfig(fullgraph=True, dynamic=False)
        compile_config._compile_all_devices = True  # transformers compiles on CUDA only unless told
        kinds["static_compiled"] = {"cache_implementation": "static", "compile_config": compile_config}
    return kinds


def family_speed(family: str, args) -> dict:
    """One family's rows: ``{impl}_{kind}`` -> seconds, tokens/s, ratio to the baseline on the same cache."""
    spec = FAMILIES[family]
    new_tokens = args.gen_new_tokens if family == "llama" else args.gen_short_tokens
    models = _models(family, args)
    ids = torch.randint(3, VOCAB, (1, args.gen_prompt), device=args.device)
    fns, tokens = {}, {}
    for kind, extra in _kinds(family, args).items():
        for impl, m in models.items():
            def run_one(m=m, extra=extra):
                with torch.inference_mode():
                    return m.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                      max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0,
                                      eos_token_id=None, **extra)
            fns[f"{impl}_{kind}"] = run_one
            tokens[f"{impl}_{kind}"] = run_one()  # also compiles, outside the timed rounds
    calls = {}
    for impl in models:
        with CountCalls() as counter:
            fns[f"{impl}_dynamic"]()
        calls[impl] = counter.calls
    if not calls["attnkit"] or any(n for impl, n in calls.items() if impl != "attnkit"):
        raise AttnkitError(f"{family}: contenders do not run the implementations they are named for: attnkit calls "
                           f"per generate {calls} (want > 0 for 'attnkit', 0 for the others)")
    differ = [name for name in fns if not torch.equal(tokens[name], tokens[f"{spec.baseline}_{name.split('_', 1)[1]}"])]
    if differ:
        raise AttnkitError(f"{family}: greedy tokens of {differ} differ from {spec.baseline}'s on the same cache; a "
                           "speed comparison of different outputs means nothing.")
    times = round_robin(fns, args.repeats, warmup=1, device=args.device)
    rows = {}
    for name, seconds in times.items():
        impl, kind = name.split("_", 1)
        rows[name] = {"impl": impl, "cache": kind, "seconds": seconds, "tokens_per_s": new_tokens / seconds,
                      "vs_baseline": times[f"{spec.baseline}_{kind}"] / seconds}
    return {"model": f"{spec.model}, random weights", "baseline": spec.baseline, "new_tokens": new_tokens,
            "attnkit_calls_per_generate": calls["attnkit"], "same_tokens": True, "contenders": rows}


def generate_speed(args) -> dict:
    """Every family of ``--families`` in turn (LLaMA at ``--gen-new-tokens``, the others at
    ``--gen-short-tokens``), on ``--gen-threads`` threads."""
    families = parse_families(args.families)
    if not args.no_compile:
        parse_families(args.compile_families, "--compile-families")  # (refused before any model is timed)
    threads = torch.get_num_threads()
    torch.set_num_threads(args.gen_threads)
    try:
        results = {family: family_speed(family, args) for family in families}
    finally:
        torch.set_num_threads(threads)
    return {"config": {"layers": args.gen_layers, "hidden": args.gen_dim, "heads": args.heads,
                       "kv_heads": args.kv_heads, "intermediate": 2 * args.gen_dim, "window": args.gen_window,
                       "vocab": VOCAB, "batch": 1, "prompt": args.gen_prompt, "threads": args.gen_threads,
                       "dtype": "float32", "decoding": "greedy, no stop token",
                       "caches": "dynamic; static run eagerly; static_compiled = transformers' CompileConfig("
                                 "fullgraph=True, dynamic=False)"},
            "families": results}

"""``attnkit bench hf --parts sliding``: sliding-window and hybrid models through ``attn_implementation="attnkit"``.

Tiny-but-real configs built from transformers' own config classes (random weights; hidden 256, 8/2 heads, a few
layers): Mistral (window 128 on every layer), Gemma-3 (5 local layers of window 128 : 1 global), gpt-oss
(attention sinks, alternating sliding 128 / full layers, a small mixture of experts), Llama-4-style chunked
layers (chunks of 128, 3 chunked : 1 global NoPE layer, experts). Each family runs with ``"attnkit"``,
transformers' ``"sdpa"`` (gpt-oss: transformers runs it with ``"eager"``: its sinks have no SDPA form) and
``"eager"``, forward and forward + backward of the LM loss, at each length, medians of round-robin runs
(contenders in a fresh order each round), same weights and batch; the fairness check is the largest logit
difference to eager (issue 32 asks <= 1e-5).

Shape legend: B batch, L sequence length.
"""

from __future__ import annotations

import copy

import torch

from attnkit.bench.common import round_robin
from attnkit.bench.hf_generate import CountCalls
from attnkit.errors import AttnkitError

FAMILIES = ("mistral", "gemma3", "gpt_oss", "llama4_chunked")
WINDOW = 128


def _config(tf, family: str, L: int, layers: int):
    common = {"vocab_size": 1024, "hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 8,
              "num_key_value_heads": 2, "head_dim": 32, "max_position_embeddings": max(L, 256), "attention_dropout": 0.0,
              "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
    if family == "mistral":
        return tf.MistralConfig(**common, num_hidden_layers=layers, sliding_window=WINDOW), tf.MistralForCausalLM
    if family == "gemma3":
        kinds = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(max(layers, 6))]
        return tf.Gemma3TextConfig(**common, num_hidden_layers=len(kinds), sliding_window=WINDOW, layer_types=kinds,
                                   query_pre_attn_scalar=32), tf.Gemma3ForCausalLM
    if family == "gpt_oss":
        kinds = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
        return tf.GptOssConfig(**{**common, "intermediate_size": 256}, num_hidden_layers=layers, sliding_window=WINDOW,
                               layer_types=kinds, num_local_experts=4, num_experts_per_tok=2), tf.GptOssForCausalLM
    if family == "llama4_chunked":
        n = max(layers, 4)
        return tf.Llama4TextConfig(**common, num_hidden_layers=n, intermediate_size_mlp=512, num_local_experts=2,
                                   num_experts_per_tok=1, interleave_moe_layer_step=2, attention_chunk_size=WINDOW,
                                   no_rope_layers=[0 if (i + 1) % 4 == 0 else 1 for i in range(n)]), \
            tf.Llama4ForCausalLM
    raise ValueError(family)


def _models(tf, family: str, L: int, layers: int) -> tuple[dict, object]:
    config, cls = _config(tf, family, L, layers)
    torch.manual_seed(0)
    base = cls(config).eval()
    if family == "gpt_oss":
        with torch.no_grad():
            for layer in base.model.layers:
                layer.self_attn.sinks.normal_(0.0, 2.0)  # sinks that take real mass (they start at 0)
    models = {}
    for impl in ("attnkit", "sdpa", "eager"):
        if impl == "sdpa" and family == "gpt_oss":
            continue  # transformers gives gpt-oss no SDPA path (its sinks): eager is what it runs
        m = cls(copy.deepcopy(config)).eval()  # its own config: set_attn_implementation writes there
        m.load_state_dict(base.state_dict())
        m.set_attn_implementation(impl)
        models[impl] = m
    return models, config


def family_rows(family: str, lengths: list[int], layers: int, repeats: int, batch: int = 1) -> dict:
    """Forward and forward+backward times per implementation and length, with the logit check against eager."""
    import transformers as tf

    import attnkit.integrations.hf  # noqa: F401  (registers "attnkit")

    tf.logging.set_verbosity_error()
    out = {}
    for L in lengths:
        models, config = _models(tf, family, L, layers)
        ids = torch.randint(3, config.vocab_size, (batch, L), generator=torch.Generator().manual_seed(L))
        calls = {}
        with torch.no_grad():
            for impl, m in models.items():
                with CountCalls() as counter:
                    logits = m(input_ids=ids, use_cache=False).logits
                calls[impl] = counter.calls
                if impl == "eager":
                    want = logits
                elif impl == "attnkit":
                    got = logits
            diff = float((got - want).abs().max())
        n_layers = config.num_hidden_layers
        if calls["attnkit"] != n_layers or any(n for impl, n in calls.items() if impl != "attnkit"):
            raise AttnkitError(f"{family}: contenders do not run the implementations they are named for: attnkit "
                               f"calls per forward {calls} (want {n_layers} for 'attnkit', 0 for the others)")

        def forward(m, ids=ids):
            with torch.no_grad():
                return m(input_ids=ids, use_cache=False).logits

        def train_step(m, ids=ids):
            m.zero_grad(set_to_none=True)
            m(input_ids=ids, labels=ids, use_cache=False).loss.backward()

        fwd = round_robin({impl: (lambda m=m: forward(m)) for impl, m in models.items()}, repeats, warmup=1)
        bwd = round_robin({impl: (lambda m=m: train_step(m)) for impl, m in models.items()}, repeats, warmup=1)
        base = "sdpa" if "sdpa" in models else "eager"
        out[str(L)] = {
            "max_logit_diff_vs_eager": diff,
            "forward": {impl: {"seconds": s, "vs_sdpa": fwd["sdpa"] / s if "sdpa" in fwd else None,
                               "vs_eager": fwd["eager"] / s} for impl, s in fwd.items()},
            "forward_backward": {impl: {"seconds": s, "vs_sdpa": bwd["sdpa"] / s if "sdpa" in bwd else None,
                                        "vs_eager": bwd["eager"] / s} for impl, s in bwd.items()},
            "baseline": base,
        }
        del models
    return {"layers": n_layers, "window": WINDOW, "lengths": out}

"""Tiny random models of 29 transformers families, built from transformers' own config classes (no network).

The correct subjects of the diagnostics (docs/conventions.md: a diagnostic is checked both ways): each family
keeps what makes it itself at a few kilobytes of weights: its attention layout (GQA, MLA head sizes, sinks,
linear-attention layers), its per-layer kinds (sliding, chunked, global, NoPE), its intended departures from
``1/sqrt(d)`` (``query_pre_attn_scalar``, ``attention_multiplier``, softcapping) at the values real checkpoints use
relative to their head size, and its mixture of experts.

>>> from attnkit.integrations.hf import zoo
>>> model = zoo.build("qwen3")                 # doctest: +SKIP
>>> zoo.names()[:3]
['llama', 'mistral', 'mixtral']

Shape legend: E hidden size, H heads, Hkv key/value heads, D head dim, V vocab size.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from attnkit.errors import AttnkitValueError

VOCAB = 96  # token ids 0, 1, 2 are pad / bos / eos
WINDOW = 4  # sliding windows and chunks shorter than the doctor's probes (8 tokens), so they really cut

_IDS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
#: a Llama-style decoder: E 32, H 4, Hkv 2 (GQA), 2 layers
_DECODER = {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64, **_IDS}
_ENCODER = {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
            "num_attention_heads": 4, "max_position_embeddings": 64}
_MOE = {"num_experts_per_tok": 2, "moe_intermediate_size": 16}


@dataclass(frozen=True)
class Family:
    """One family: its transformers config class, its settings, and whether it is an encoder (masked LM)."""

    name: str
    config: str  # the transformers config class
    settings: dict = field(default_factory=dict)
    encoder: bool = False
    #: what this tiny config exercises (departures, layer kinds), for the tables that list the zoo
    note: str = ""


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("llama", "LlamaConfig", _DECODER),
    Family("mistral", "MistralConfig", {**_DECODER, "sliding_window": WINDOW}, note="sliding window"),
    Family("mixtral", "MixtralConfig", {**_DECODER, "num_local_experts": 4, "num_experts_per_tok": 2,
                                        "sliding_window": WINDOW}, note="mixture of experts"),
    Family("qwen2", "Qwen2Config", {**_DECODER, "num_hidden_layers": 3, "use_sliding_window": True,
                                    "sliding_window": WINDOW, "max_window_layers": 1}, note="sliding layers"),
    Family("qwen2_moe", "Qwen2MoeConfig", {**_DECODER, **_MOE, "num_experts": 4,
                                           "shared_expert_intermediate_size": 24}, note="mixture of experts"),
    Family("qwen3", "Qwen3Config", {**_DECODER, "head_dim": 8}, note="QK-norm"),
    Family("qwen3_moe", "Qwen3MoeConfig", {**_DECODER, **_MOE, "head_dim": 8, "num_experts": 4},
           note="mixture of experts"),
    Family("qwen3_next", "Qwen3NextConfig", {
        **_DECODER, **_MOE, "num_hidden_layers": 4, "head_dim": 8, "num_experts": 4,
        "shared_expert_intermediate_size": 16, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
        "linear_key_head_dim": 8, "linear_value_head_dim": 8,
        "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"]},
        note="linear-attention layers, experts"),
    Family("gemma", "GemmaConfig", {**_DECODER, "head_dim": 8}),
    # Gemma 2 27B: query_pre_attn_scalar 144 = E / H with head_dim 128; here E / H = 8 with head_dim 16
    Family("gemma2", "Gemma2Config", {**_DECODER, "head_dim": 16, "query_pre_attn_scalar": 8,
                                      "sliding_window": WINDOW, "attn_logit_softcapping": 50.0,
                                      "final_logit_softcapping": 30.0},
           note="query_pre_attn_scalar, softcapping, sliding layers"),
    Family("gemma3", "Gemma3TextConfig", {**_DECODER, "num_hidden_layers": 3, "head_dim": 8,
                                          "query_pre_attn_scalar": 16, "sliding_window": WINDOW,
                                          "layer_types": ["sliding_attention", "sliding_attention", "full_attention"]},
           note="query_pre_attn_scalar, sliding layers, two RoPE bases"),
    Family("gpt_oss", "GptOssConfig", {**_DECODER, "head_dim": 8, "num_local_experts": 4, "num_experts_per_tok": 2,
                                       "sliding_window": WINDOW, "intermediate_size": 32},
           note="attention sinks, sliding layers, experts"),
    Family("llama4", "Llama4TextConfig", {
        **_DECODER, "num_hidden_layers": 4, "head_dim": 8, "intermediate_size_mlp": 48, "num_local_experts": 4,
        "num_experts_per_tok": 1, "interleave_moe_layer_step": 2, "attention_chunk_size": WINDOW,
        "no_rope_layers": [1, 1, 1, 0], "floor_scale": 2, "attn_scale": 0.1},
        note="chunked layers, a NoPE layer with attention temperature, experts"),
    Family("deepseek_v3", "DeepseekV3Config", {
        **_DECODER, "num_key_value_heads": 4, "q_lora_rank": 16, "kv_lora_rank": 8, "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 4, "v_head_dim": 6, "moe_intermediate_size": 16, "n_routed_experts": 4,
        "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1, "first_k_dense_replace": 1, "n_shared_experts": 1,
        # DeepSeek-V3's own: YaRN factor 40 from 4096 positions, mscale_all_dim 1 (folded into the softmax scale)
        "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                            "original_max_position_embeddings": 16, "mscale": 1.0, "mscale_all_dim": 1.0,
                            "beta_fast": 32.0, "beta_slow": 1.0}},
        note="MLA (q/k head 12, v head 6) with YaRN's mscale in the scale, experts"),
    Family("smollm3", "SmolLM3Config", {**_DECODER, "num_hidden_layers": 4, "no_rope_layers": [1, 1, 1, 0]},
           note="a NoPE layer"),
    Family("olmo2", "Olmo2Config", _DECODER, note="QK-norm over heads"),
    Family("phi3", "Phi3Config", _DECODER),
    Family("starcoder2", "Starcoder2Config", {**_DECODER, "sliding_window": WINDOW}, note="sliding window"),
    Family("cohere", "CohereConfig", _DECODER, note="parallel block, logit scale"),
    Family("gpt_neox", "GPTNeoXConfig", {**_DECODER, "num_key_value_heads": None}, note="partial rotary"),
    Family("gptj", "GPTJConfig", {"vocab_size": VOCAB, "n_embd": 32, "n_layer": 2, "n_head": 4, "rotary_dim": 4,
                                  "n_positions": 64, **_IDS}, note="interleaved partial rotary"),
    Family("gpt2", "GPT2Config", {"vocab_size": VOCAB, "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64,
                                  **_IDS}, note="learned positions"),
    Family("falcon", "FalconConfig", {"vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 2,
                                      "num_attention_heads": 4, "ffn_hidden_size": 48, **_IDS},
           note="multi-query, parallel block"),
    # Granite 3.0 2B: attention_multiplier 1/64 = 1 / head_dim; here head_dim 8
    Family("granite", "GraniteConfig", {**_DECODER, "attention_multiplier": 0.125, "embedding_multiplier": 12.0,
                                        "residual_multiplier": 0.22, "logits_scaling": 8.0},
           note="attention_multiplier"),
    Family("ernie4_5", "Ernie4_5Config", {**_DECODER, "head_dim": 8}),
    Family("glm4", "Glm4Config", {**_DECODER, "head_dim": 8}, note="partial rotary, sandwich norms"),
    Family("bert", "BertConfig", {**_ENCODER, "pad_token_id": 0}, encoder=True),
    Family("roberta", "RobertaConfig", {**_ENCODER, "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2},
           encoder=True, note="positions derived from padding"),
    Family("modernbert", "ModernBertConfig", {**_ENCODER, "num_hidden_layers": 3, "global_attn_every_n_layers": 3,
                                              "local_attention": WINDOW, "pad_token_id": 0, "bos_token_id": 1,
                                              "eos_token_id": 2, "cls_token_id": 1, "sep_token_id": 2},
           encoder=True, note="local (two-sided window) and global layers"),
)}


def names() -> list[str]:
    """Every family of the zoo, in its order."""
    return list(FAMILIES)


def config(name: str):
    """The transformers config of family ``name``."""
    from attnkit.integrations.hf._deps import transformers

    family = _family(name)
    return getattr(transformers(), family.config)(**family.settings)


def build(name: str, *, seed: int = 0, attn_implementation: str | None = None):
    """A fresh model of family ``name`` with random weights drawn from ``seed`` (the caller's RNG untouched), in eval
    mode and float32: ``AutoModelForCausalLM`` for decoders, ``AutoModelForMaskedLM`` for encoders, with the
    attention implementation transformers picks for the family (SDPA where the family supports it, else eager)
    unless ``attn_implementation`` names one."""
    from attnkit.integrations.hf._deps import transformers

    tf = transformers()
    family = _family(name)
    auto = tf.AutoModelForMaskedLM if family.encoder else tf.AutoModelForCausalLM
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = auto.from_config(config(name), **({} if attn_implementation is None else
                                                  {"attn_implementation": attn_implementation}))
    return model.eval()


def _family(name: str) -> Family:
    if name not in FAMILIES:
        raise AttnkitValueError(f"family={name!r} is not in the zoo; choose from {names()}.")
    return FAMILIES[name]


__all__ = ["FAMILIES", "Family", "VOCAB", "WINDOW", "build", "config", "names"]

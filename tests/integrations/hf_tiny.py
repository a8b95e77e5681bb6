"""Tiny Hugging Face configs (random weights, no network) for the integration tests: one per model family."""

from __future__ import annotations

import pytest

tf = pytest.importorskip("transformers")

import attnkit.integrations.hf  # noqa: E402,F401  (registers attn_implementation="attnkit")

tf.logging.set_verbosity_error()

VOCAB = 96
WINDOW = 5  # shorter than the test sequences, so the sliding window really cuts

_DECODER = {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128,
            "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}

FAMILIES = {
    "llama": lambda **kw: tf.LlamaForCausalLM(tf.LlamaConfig(**{**_DECODER, **kw})),
    "llama-rope-scaled": lambda **kw: tf.LlamaForCausalLM(tf.LlamaConfig(**{
        **_DECODER, "max_position_embeddings": 128,
        "rope_parameters": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 4.0, "low_freq_factor": 1.0,
                            "high_freq_factor": 4.0, "original_max_position_embeddings": 8}, **kw})),
    "mistral": lambda **kw: tf.MistralForCausalLM(tf.MistralConfig(**{**_DECODER, "sliding_window": WINDOW, **kw})),
    "qwen2": lambda **kw: tf.Qwen2ForCausalLM(tf.Qwen2Config(**{
        **_DECODER, "num_hidden_layers": 3, "use_sliding_window": True, "sliding_window": WINDOW,
        "max_window_layers": 1, **kw})),
    "gemma2": lambda **kw: tf.Gemma2ForCausalLM(tf.Gemma2Config(**{
        **_DECODER, "head_dim": 8, "sliding_window": WINDOW, "attn_logit_softcapping": 5.0,
        "final_logit_softcapping": 30.0, "query_pre_attn_scalar": 8, **kw})),
    "gpt2": lambda **kw: tf.GPT2LMHeadModel(tf.GPT2Config(**{
        "vocab_size": VOCAB, "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 128, "bos_token_id": 1,
        "eos_token_id": 2, **kw})),
    "bert": lambda **kw: tf.BertModel(tf.BertConfig(**{
        "vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
        "intermediate_size": 48, "max_position_embeddings": 128, "pad_token_id": 0, **kw}), add_pooling_layer=False),
}
DECODERS = [name for name in FAMILIES if name != "bert"]


def build(family: str, attn: str = "eager", **overrides):
    """A fresh tiny model of ``family`` in eval mode, fp32, with attention implementation ``attn``."""
    model = FAMILIES[family](**overrides).eval()
    model.set_attn_implementation(attn)
    return model


def baseline(family: str) -> str:
    """The implementation transformers itself uses for the family (Gemma 2's softcap has no SDPA form)."""
    return "eager" if family == "gemma2" else "sdpa"

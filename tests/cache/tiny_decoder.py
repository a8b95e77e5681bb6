"""The tests' small decoder: a builder call (a ``TransformerLM`` of the ``nano`` preset with overrides), with every
position scheme, MHA/GQA/MQA and optional sliding windows; it implements the decoder-model protocol of
``attnkit.models.generation``.

Shape legend: B batch, L new tokens, E dim, V vocab.
"""

from __future__ import annotations

import torch

from attnkit.models.builders import build_lm
from attnkit.models.lm import TransformerLM


def tiny_decoder(vocab=53, dim=32, layers=2, heads=4, kv_heads=4, positions="rope", window=None) -> TransformerLM:
    """``positions`` in {"none", "rope", "alibi", "sinusoidal", "learned"}; ``window`` = sliding window."""
    model = build_lm("nano", vocab_size=vocab, embed_dim=dim, num_layers=layers, num_heads=heads, num_kv_heads=kv_heads,
                     positions=positions, window=window, bias=True, mlp="gelu_exact", mlp_ratio=2.0,
                     tie_embeddings=False, max_seq_len=256)
    if positions == "learned":
        with torch.no_grad():
            model.pos_embed.embedding.weight.normal_(std=0.5)  # positions that matter, so misplaced ones show
    return model


TinyDecoder = tiny_decoder  # the name the cache and generation tests import

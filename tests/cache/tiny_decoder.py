"""A small decoder stack implementing the decoder-model protocol of ``attnkit.models.generation``, built
from attnkit modules, with every position scheme, MHA/GQA/MQA and optional sliding windows.

Shape legend: B batch, L new tokens, E dim, V vocab.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import attnkit as ak
from attnkit.cache import make_cache
from attnkit.models.generation import padding_by_position


class Block(nn.Module):
    def __init__(self, dim, heads, kv_heads, positions):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = ak.nn.MultiHeadAttention(dim, heads, num_kv_heads=kv_heads,
                                             positions=positions if positions in ("rope", "alibi") else None)
        self.up, self.down = nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)

    def forward(self, x, mask, positions, cache):
        x = x + self.attn(self.norm1(x), mask, positions=positions, cache=cache)
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class TinyDecoder(nn.Module):
    """``positions`` in {"none", "rope", "alibi", "sinusoidal", "learned"}; ``window`` = sliding window."""

    def __init__(self, vocab=53, dim=32, layers=2, heads=4, kv_heads=4, positions="rope", window=None):
        super().__init__()
        self.window, self.heads, self.kv_heads, self.head_dim = window, heads, kv_heads, dim // heads
        self.embed = nn.Embedding(vocab, dim)
        self.pos_embed = {"sinusoidal": ak.positions.Sinusoidal(dim),
                          "learned": ak.positions.Learned(256, dim, init_std=0.5)}.get(positions)
        self.blocks = nn.ModuleList([Block(dim, heads, kv_heads, positions) for _ in range(layers)])
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab)

    def forward(self, tokens, *, positions=None, cache=None, key_is_real=None):
        B, L = tokens.shape
        positions = torch.arange(L)[None] if positions is None else positions  # (B|1, L)
        x = self.embed(tokens)  # (B, L, E)
        if self.pos_embed is not None:
            x = x + self.pos_embed(positions.clamp(min=0))  # left pads sit at negative positions
        mask = ak.masks.sliding_window(self.window) if self.window else ak.masks.causal()
        if key_is_real is not None:
            mask = mask & padding_by_position(key_is_real, positions)
        for i, block in enumerate(self.blocks):
            x = block(x, mask, positions, None if cache is None else cache[i])
        return self.head(self.norm(x))  # (B, L, V)

    def new_cache(self, batch_size, *, kind="dynamic", max_length=None):
        w = self.embed.weight
        return [make_cache(kind, batch_size, self.kv_heads, self.head_dim, max_length=max_length, window=self.window,
                           dtype=w.dtype, device=w.device) for _ in self.blocks]

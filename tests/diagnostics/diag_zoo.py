"""Correct and deliberately broken subjects for the doctor's tests (each bug as people actually write it).

Shape legend: B batch, H heads, L length, E embed_dim, D head_dim, V vocab size.
"""

from __future__ import annotations

import math

import torch
from torch import nn

import attnkit as ak

# ------------------------------------------------------------------ bare attention functions f(q, k, v, mask)

def good_attention(q, k, v, mask):
    """The tutorial's attention, done right: scale, mask before a safe softmax."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, Lq, Lk)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    row_max = scores.amax(-1, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    p = torch.exp(scores.float() - row_max.float())
    total = p.sum(-1, keepdim=True)
    return (p / torch.where(total > 0, total, torch.ones_like(total))).to(v.dtype) @ v


def missing_scale(q, k, v, mask):
    scores = q @ k.transpose(-2, -1)  # forgot / sqrt(d_k)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return good_attention_from_scores(scores, v)


def good_attention_from_scores(scores, v):
    row_max = scores.amax(-1, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    p = torch.exp(scores - row_max)
    total = p.sum(-1, keepdim=True)
    return (p / torch.where(total > 0, total, torch.ones_like(total))) @ v


def mask_after_softmax(q, k, v, mask):
    p = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).softmax(-1)
    if mask is not None:
        p = p * mask  # masked after the softmax: rows no longer sum to 1
    return p @ v


def causal_off_by_one(q, k, v, mask):
    """Builds its own causal mask when given one, with the diagonal off by one (sees the next token)."""
    if mask is not None:
        L = q.shape[-2]
        mask = torch.ones(L, L, dtype=torch.bool).tril(1)
    return good_attention(q, k, v, mask)


def only_square_masks(q, k, v, mask):
    """Applies (Lq, Lk) masks and silently drops (B, 1, 1, Lk) padding masks."""
    return good_attention(q, k, v, mask if mask is not None and mask.dim() == 2 else None)


def minus_1e9(q, k, v, mask):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, -1e9)  # overflows float16
    return scores.softmax(-1) @ v


def nan_rows(q, k, v, mask):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(-1) @ v  # a fully masked row is softmax(all -inf) = NaN


def head_seq_view_bug(q, k, v, mask):
    """Treats (B, H, L, D) memory as if it were (B, L, H, D): heads and tokens get mixed."""
    B, H, L, D = q.shape
    q, k, v = (t.reshape(B, L, H, D).transpose(1, 2) for t in (q, k, v))  # wrong: no transpose came first
    out = good_attention(q, k, v, mask)
    return out.transpose(1, 2).reshape(B, H, L, D)


# ------------------------------------------------------------------ modules m(x, mask)

class ViewBugAttention(nn.Module):
    """Self-attention whose head split is ``view(B, H, L, D)`` without the transpose."""

    def __init__(self, embed_dim: int = 32, num_heads: int = 4):
        super().__init__()
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim)
        self.out = nn.Linear(embed_dim, embed_dim)

    def forward(self, x, mask=None):
        B, L, E = x.shape
        H, D = self.num_heads, E // self.num_heads
        q, k, v = self.qkv(x).split(E, dim=-1)
        q, k, v = (t.reshape(B, H, L, D) for t in (q, k, v))  # the bug: (B, L, H*D) viewed as (B, H, L, D)
        out = ak.attention(q, k, v, mask)  # (B, H, L, D)
        return self.out(out.transpose(1, 2).reshape(B, L, E))  # (B, L, E)


# ------------------------------------------------------------------ a tiny decoder (the decoder-model protocol)

class TinyCache:
    """Keys/values ``(B, H, Lk, D)`` and their absolute positions ``(B|1, Lk)``."""

    def __init__(self):
        self.k = self.v = self.positions = None

    def update(self, k, v, positions):
        if self.k is None:
            self.k, self.v, self.positions = k, v, positions
        else:
            self.k, self.v = torch.cat([self.k, k], 2), torch.cat([self.v, v], 2)
            self.positions = torch.cat([self.positions, positions], 1)
        return self.k, self.v, self.positions

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[2]


class TinyDecoder(nn.Module):
    """Learned positions, pre-norm attention + MLP blocks through ``ak.attention``, and a cache.

    ``bug``: None, "causal-off-by-one", "padding-leak", "cache-drift", "missing-scale".
    """

    def __init__(self, vocab: int = 61, dim: int = 32, heads: int = 4, layers: int = 2, bug: str | None = None):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        nn.init.normal_(self.embed.weight, std=0.02)
        self.pos = nn.Embedding(64, dim)
        nn.init.normal_(self.pos.weight, std=0.02)
        self.heads, self.bug = heads, bug
        self.norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(layers))
        self.qkv = nn.ModuleList(nn.Linear(dim, 3 * dim) for _ in range(layers))
        self.proj = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))
        self.head = nn.Linear(dim, vocab)

    def new_cache(self, batch_size: int, **_):
        return [TinyCache() for _ in self.qkv]

    def forward(self, tokens, *, positions=None, cache=None, key_is_real=None):
        B, L = tokens.shape
        start = cache[0].length if cache is not None else 0
        if positions is None or (self.bug == "cache-drift" and cache is not None):
            positions = torch.arange(start, start + L)[None]  # (1, L)
            if self.bug == "cache-drift":
                positions = torch.arange(L)[None]  # forgets the cached tokens: positions restart every call
        x = self.embed(tokens) + self.pos(positions)  # (B, L, E)
        if self.bug == "causal-off-by-one":
            mask = ak.masks.custom(lambda b, h, qp, kp: kp <= qp + 1, "off_by_one")
        else:
            mask = ak.masks.causal()
        if key_is_real is not None and self.bug != "padding-leak":
            mask = mask & ak.masks.padding(key_is_real)
        for i, (norm, qkv, proj) in enumerate(zip(self.norms, self.qkv, self.proj)):
            E = x.shape[-1]
            q, k, v = qkv(norm(x)).split(E, dim=-1)
            q, k, v = (t.view(B, L, self.heads, E // self.heads).transpose(1, 2) for t in (q, k, v))  # (B, H, L, D)
            kv_pos = positions
            if cache is not None:
                k, v, kv_pos = cache[i].update(k, v, positions.expand(B, -1))
            out = ak.attention(q, k, v, mask, q_positions=positions.expand(B, -1), kv_positions=kv_pos.expand(B, -1),
                               scale=1.0 if self.bug == "missing-scale" else None)
            x = x + proj(out.transpose(1, 2).reshape(B, L, E))  # (B, L, E)
        return self.head(x)  # (B, L, V)

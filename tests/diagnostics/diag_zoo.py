"""Correct and deliberately broken subjects for the doctor's tests (each bug as people actually write it).

Shape legend: B batch, H heads, L length, E embed_dim, D head_dim, V vocab size.
"""

from __future__ import annotations

import math

import torch
from torch import nn

import attnkit as ak
from attnkit.models.builders import lm_config
from attnkit.models.lm import TransformerLM

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


class TinyDecoder(TransformerLM):
    """A builder call (the ``nano`` preset: learned positions, pre-norm blocks through ``ak.attention``, a cache)
    with one part swapped per bug, the way people actually write them.

    ``bug``: None, "causal-off-by-one" (the layers' mask pattern sees the next token), "padding-leak" (the
    padding mask is dropped), "cache-drift" (positions restart at every cached call), "missing-scale"
    (attention's scale is 1 instead of 1/sqrt(D)).
    """

    def __init__(self, vocab: int = 61, dim: int = 32, heads: int = 4, layers: int = 2, bug: str | None = None):
        super().__init__(lm_config("nano", vocab_size=vocab, embed_dim=dim, num_heads=heads, num_layers=layers,
                                   positions="learned", max_seq_len=64, bias=True, tie_embeddings=False))
        self.bug = bug
        for block in self.blocks:
            if bug == "causal-off-by-one":
                block.mask = ak.masks.custom(lambda b, h, qp, kp: kp <= qp + 1, "off_by_one")
            if bug == "missing-scale":
                block.attn.scale = 1.0  # forgot / sqrt(d_k)

    def mask(self, *, key_is_real=None, **kwargs):
        return super().mask(key_is_real=None if self.bug == "padding-leak" else key_is_real, **kwargs)

    def new_cache(self, batch_size: int, **kwargs):
        if self.bug == "cache-drift":
            return [TinyCache() for _ in self.blocks]  # a plain cache that doesn't check positions continue
        return super().new_cache(batch_size, **kwargs)

    def forward(self, tokens, *, positions=None, cache=None, key_is_real=None, **kwargs):
        if self.bug == "cache-drift" and cache is not None:
            positions = torch.arange(tokens.shape[1])[None]  # forgets the cached tokens: positions restart
        return super().forward(tokens, positions=positions, cache=cache, key_is_real=key_is_real, **kwargs)


# ------------------------------------------------------------------ a Hugging Face model with an attention of its own

def hf_with_attention(model, name: str, fn):
    """``model`` (a transformers model) switched to an attention implementation ``name`` that runs
    ``fn(q, k, v, allowed)`` (q, k, v ``(B, H, L, D)`` with the KV heads repeated, q already scaled; ``allowed`` a bool
    mask, True = may attend, or None when transformers builds none), registered with transformers' interfaces."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    def attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
        G = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(G, 1), value.repeat_interleave(G, 1)  # (B, H, L, D)
        allowed = None if attention_mask is None else attention_mask if attention_mask.dtype == torch.bool \
            else attention_mask == 0  # a float mask: 0 = may attend
        out = fn(query * scaling, key, value, allowed)  # (B, H, L, D)
        return out.transpose(1, 2).contiguous(), None

    AttentionInterface.register(name, attention)
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])  # a bool mask, True = may attend
    model.set_attn_implementation(name)
    return model

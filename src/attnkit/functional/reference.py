"""The executable specification of attention: plain, readable, covering every option. The oracle of the tests.

    scores = (q @ k^T) * scale                       # (B, H, Lq, Lk); GQA: head h reads KV head h // G
    scores = softcap * tanh(scores / softcap)        # optional
    scores = scores + bias                           # ALiBi (from positions) or a float tensor
    scores = where(mask, scores, -inf)               # boolean masks, True = may attend
    p      = safe_softmax(scores)                    # fully masked rows -> all zeros, finite gradients
    p      = dropout(p)                              # attention dropout: after softmax, before V
    out    = p @ v                                   # (B, H, Lq, Dv)

Matmuls run in the inputs' dtype; for float16/bfloat16 the softmax runs in float32 (as every fused kernel
does). Run it in float64 to get the golden answer.

Shape legend: B batch, H query heads, Hkv key/value heads, G = H // Hkv, Lq/Lk lengths, D/Dv head dims.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnkit._bias import StructuredBias
from attnkit._validation import AttentionCall, build_call
from attnkit.masks import materialize


def safe_softmax(scores: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim where rows that are all ``-inf`` give zeros (and zero gradients)."""
    row_max = scores.amax(dim=-1, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max)).detach()
    p = torch.exp(scores - row_max)  # exp(-inf) = 0 for masked entries
    total = p.sum(dim=-1, keepdim=True)
    return p / torch.where(total > 0, total, torch.ones_like(total))


def expand_kv(t: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Repeat KV heads for GQA: ``(B, Hkv, Lk, D) -> (B, H, Lk, D)``; query head h reads KV head h // G."""
    group = num_heads // t.shape[1]
    return t if group == 1 else t.repeat_interleave(group, dim=1)  # (B, H, Lk, D)


def scores_of(call: AttentionCall) -> torch.Tensor:
    """Pre-softmax scores ``(B, H, Lq, Lk)`` in float32 (float64 for float64 inputs), masked entries -inf."""
    k = expand_kv(call.k, call.num_heads)  # (B, H, Lk, D)
    scores = call.q @ k.transpose(-2, -1)  # (B, H, Lq, Lk) in the inputs' dtype
    if scores.dtype in (torch.float16, torch.bfloat16):
        scores = scores.float()
    scores = scores * call.scale
    if call.softcap is not None:
        scores = call.softcap * torch.tanh(scores / call.softcap)
    q_pos, kv_pos = call.positions()
    if isinstance(call.bias, StructuredBias):
        scores = scores + call.bias.materialize(q_pos, kv_pos).to(scores.dtype)
    elif call.bias is not None:
        scores = scores + call.bias.to(scores.dtype)
    allowed = materialize(call.mask, q_pos, kv_pos)  # bool, broadcastable to (B, H, Lq, Lk)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    return scores


def reference_from_call(call: AttentionCall):
    """Run a validated call; returns ``out`` or ``(out, weights)``."""
    probs = safe_softmax(scores_of(call))  # (B, H, Lq, Lk)
    dropped = F.dropout(probs, p=call.dropout_p) if call.dropout_p > 0 else probs
    out = dropped.to(call.v.dtype) @ expand_kv(call.v, call.num_heads)  # (B, H, Lq, Dv)
    if call.return_weights:
        return out, probs.to(call.q.dtype)
    return out


def reference_attention(q, k, v, mask=None, *, bias=None, scale=None, softcap=None, dropout_p=0.0,
                        q_positions=None, kv_positions=None, return_weights=False):
    """Plain attention with every option of :func:`attnkit.attention`; the oracle of the test suite.

    ``weights`` (when ``return_weights=True``) are the softmax probabilities before dropout.
    """
    call = build_call(q, k, v, mask, bias=bias, scale=scale, softcap=softcap, dropout_p=dropout_p,
                      q_positions=q_positions, kv_positions=kv_positions, return_weights=return_weights)
    return reference_from_call(call)

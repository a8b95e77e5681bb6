"""The ``eager`` backend: the formula as a handful of PyTorch ops, for short calls no fused kernel serves.

A logit softcap (Gemma 2) has no SDPA form, and the block-skipping path (the tiled kernel) is built for long
calls: a decode step or a short prompt with a softcap pays its per-piece bookkeeping for nothing, and the
``math`` reference path is written to be read, not to be fast. This backend is what transformers' eager
attention does, with attnkit's conventions kept:

    scores = q k^T * scale            GQA: keys repeated per query head (the reference's products)
    scores = softcap * tanh(scores / softcap); + bias; masked entries -inf   (float32 for half inputs)
    p      = dropout(softmax(scores)) rows with no visible key opened, their output set to 0 after
    out    = p @ v                    (float32 accumulation for half inputs), NaN queries propagated

It materialises the ``(B, H, Lq, Lk)`` scores, so ``auto`` ranks it only for calls with a softcap of at most
``EAGER_MAX_ENTRIES`` query x key entries per head; it serves any mask, a float or structured bias and dropout,
and sinks, but not weights.

Shape legend: B batch, H query heads, Hkv key/value heads, G = H // Hkv, Lq/Lk lengths, D/Dv head dims.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnkit._bias import StructuredBias
from attnkit._validation import AttentionCall
from attnkit.backends.base import Rank
from attnkit.backends.cost import dense_work
from attnkit.functional.reference import expand_kv, propagate_nan_queries

#: the most query x key entries per head for which ``auto`` picks this backend (a softcap call): measured on a
#: 2-core Xeon, torch 2.13, fp32, H=8, Hkv=4, D=32, causal: 0.13-0.2x the time of ``blocksparse`` at Lq=1 (40-2048
#: keys) and at 16 x 16, 0.55x at 128 x 128, but 0.85-1.2x at 256 x 256 and 1.7x at 512 x 512 (``ak.attention``
#: with ``backend=`` each, side by side; Gemma-2's ``generate`` in ``attnkit bench hf --parts generate`` uses it)
EAGER_MAX_ENTRIES = 1 << 14


class EagerBackend:
    name = "eager"
    ranks_by_signature = True  # supports/rank read the call's signature only
    traceable = True
    serves_sinks = True  # a sink column joins the softmax, as in the reference

    def available(self) -> list[str]:
        return []

    def supports(self, call: AttentionCall) -> list[str]:
        reasons = []
        if call.return_weights:
            reasons.append("eager does not return attention weights (use backend='math')")
        return reasons

    def rank(self, call: AttentionCall) -> Rank:
        if call.softcap is None:
            return Rank(-5, "no softcap: a fused SDPA kernel serves this call better")
        if call.q_len * call.kv_len > EAGER_MAX_ENTRIES:
            return Rank(-5, f"a softcap on a long call (Lq x Lk = {call.q_len * call.kv_len} > {EAGER_MAX_ENTRIES}): "
                            "blocksparse's tiled kernel never holds the scores")
        return Rank(8, "a softcap, which no fused kernel has, on a short call: q k^T, softcap, mask, softmax, @ v "
                       "as a few PyTorch ops")

    def work(self, call: AttentionCall) -> dict[str, float] | None:
        """What it computes (``backends.cost``): the (B, H, Lq, Lk) scores, materialised, and a bias."""
        return dense_work(call, scores=True, bias=call.bias is not None)

    def plan(self, call: AttentionCall) -> str:
        return "materialises the (B, H, Lq, Lk) scores in float32"

    def __call__(self, call: AttentionCall) -> torch.Tensor:
        q, k, v = call.q, call.k, call.v
        H, Lq, Lk = call.num_heads, call.q_len, call.kv_len
        half = q.dtype in (torch.float16, torch.bfloat16)
        if half:  # scores and products accumulate in float32, as the reference and every fused kernel do
            q, k, v = q.float(), k.float(), v.float()
        # keys repeated per query head, one (Lq, D) x (D, Lk) product each, as the reference computes it: folding
        # the G heads into G*Lq rows of one product (or a broadcast matmul) changes how the BLAS sums a decode
        # step's dot products (1-2 queries: up to 2.4x the reference's float32 error on a sharp softmax, issue 33
        # item 4); the copy is small on the short calls this backend serves
        k, v = expand_kv(k, H), expand_kv(v, H)  # (B, H, Lk, D|Dv)
        scores = q @ k.transpose(-2, -1)  # (B, H, Lq, Lk), before the scale
        if call.softcap is not None:  # softcap * tanh(scores * scale / softcap), the scale folded in
            scores = call.softcap * torch.tanh(scores * (call.scale / call.softcap))
        else:
            scores = scores * call.scale
        if isinstance(call.bias, StructuredBias):
            scores = scores + call.bias.materialize(*call.positions()).to(scores.dtype)
        elif call.bias is not None:
            scores = scores + call.bias.to(scores.dtype)
        empty = None
        if call.prepared is not None and call.prepared.sdpa_flag(Lq, Lk) != "none":  # ("none": every key visible)
            blocked, empty = call.prepared.memo("eager blocked", lambda: _blocked(call.prepared), shared=True)
            scores = scores.masked_fill(blocked, float("-inf"))
        if isinstance(call.bias, torch.Tensor):  # a float bias may be -inf at every key the mask leaves a row
            scores, empty = _open_bias_empty_rows(scores, empty)
        if call.sinks is None:
            probs = torch.softmax(scores, dim=-1)  # (B, H, Lq, Lk)
        else:  # one sink column per head takes probability mass and is dropped
            sink = call.sinks.to(scores.dtype).view(1, H, 1, 1).expand(*scores.shape[:3], 1)  # (B, H, Lq, 1)
            probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]  # (B, H, Lq, Lk)
        if call.dropout_p > 0:  # attention dropout: after softmax, before V
            probs = F.dropout(probs, p=call.dropout_p)
        out = probs @ v  # (B, H, Lq, Dv)
        if empty is not None:  # rows that see no key are 0
            out = out.masked_fill(empty, 0.0)
        return propagate_nan_queries(out.to(call.q.dtype) if half else out, call.q)


def _blocked(prepared) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(~allowed, empty rows)`` of a prepared mask, rows with no visible key opened (see ``dense_opened``)."""
    allowed, empty = prepared.dense_opened()  # (B|1, H|1, Lq, Lk), (B|1, H|1, Lq, 1) or None
    return ~allowed, empty


def _open_bias_empty_rows(scores: torch.Tensor, empty: torch.Tensor | None):
    """``scores (B, H, Lq, Lk)`` with the rows that are ``-inf`` at every key (a float bias, e.g. an HF 4-D mask
    built with -inf) set to 0, so that softmax gives no NaN there, and ``empty`` widened by those rows
    ``(B, H, Lq, 1)``: their output is set to 0 and they pass no gradient (the safe softmax of the reference)."""
    dead = torch.isneginf(scores.detach()).all(dim=-1, keepdim=True)  # (B, H, Lq, 1)
    if not bool(dead.any()):
        return scores, empty
    scores = scores.masked_fill(dead, 0.0)
    return scores, dead if empty is None else empty | dead

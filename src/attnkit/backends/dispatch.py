"""The front door: ``attnkit.attention`` validates, routes to a backend and runs it.

Shape legend: B batch, H query heads, Hkv key/value heads (H % Hkv == 0), Lq/Lk lengths, D head dim.
"""

from __future__ import annotations

from attnkit._hooks import EDITORS, OBSERVERS
from attnkit._validation import build_call
from attnkit.backends.lane import plain_call
from attnkit.backends.registry import Explanation, explain_call, select
from attnkit.functional.reference import empty_result


def attention(q, k, v, mask=None, *, bias=None, scale=None, softcap=None, dropout_p=0.0,
              q_positions=None, kv_positions=None, backend="auto", return_weights=False, sinks=None):
    """Scaled dot-product attention ``softmax(q k^T * scale + bias, masked) v`` on the fastest capable backend.

    Args:
        q: ``(B, H, Lq, D)``; k, v: ``(B, Hkv, Lk, D)`` with ``H % Hkv == 0`` (GQA: head h reads h // (H/Hkv)).
        mask: an ``ak.masks`` mask, a bool tensor broadcastable to ``(B, H, Lq, Lk)`` (True = may attend), or None.
        bias: float tensor broadcastable to ``(B, H, Lq, Lk)`` or a structured bias (``ak.positions.ALiBi``).
        scale: score scale, default ``1 / sqrt(D)``.
        softcap: if set, scores become ``softcap * tanh(scores / softcap)`` before bias and masks.
        dropout_p: attention dropout on the probabilities (after softmax, before ``@ v``).
        q_positions, kv_positions: absolute int64 positions ``(L,)`` or ``(B, L)``; default
            ``kv = arange(Lk)``, ``q = arange(Lk - Lq, Lk)`` (bottom-right: queries are the newest tokens).
        backend: "auto" (fastest capable) or a name from ``ak.backends.available()``.
        return_weights: also return the probabilities ``(B, H, Lq, Lk)`` (before dropout).
        sinks: attention sinks, one learned logit per query head ``(H,)``: a column that takes probability mass
            in the softmax and is dropped (gpt-oss), so rows sum to less than 1. Served by ``sdpa`` and
            ``blocksparse`` (CPU), ``eager`` and ``math``.

    Returns:
        ``(B, H, Lq, Dv)``, or ``(out, weights)``. Rows with no visible key give 0; NaN inputs propagate to the
        rows that read them. An empty call (B, H, Lq or Lk = 0) gives zeros of the right shape on every backend.
    """
    lane = None
    if bias is None and softcap is None and sinks is None and q_positions is None and kv_positions is None and \
            return_weights is False and backend == "auto" and type(dropout_p) is float and dropout_p == 0.0:
        lane = plain_call(q, k, v, mask, scale)  # (None: not plain after all, take the full path)
    if lane is not None:
        call, run = lane  # checked and routed once per lane key
    else:
        call = build_call(q, k, v, mask, bias=bias, scale=scale, softcap=softcap, dropout_p=dropout_p,
                          q_positions=q_positions, kv_positions=kv_positions, return_weights=return_weights,
                          sinks=sinks)
        chosen = select(call, backend)  # (a forced backend still refuses what it can't serve)
        run = empty_result if call.is_empty else chosen  # nothing to compute: no kernel runs
    result = run(call)
    if EDITORS:  # head ablation / patching (diagnostics.ablation) edit the per-head output; free when none
        out = result[0] if isinstance(result, tuple) else result  # (B, H, Lq, Dv)
        for edit in list(EDITORS):
            out = edit(call, out)
        result = (out, result[1]) if isinstance(result, tuple) else out
    if OBSERVERS:  # diagnostics capture; free when nobody listens
        for observe in list(OBSERVERS):
            observe(call, result)
    return result


def explain(q, k, v, mask=None, *, bias=None, scale=None, softcap=None, dropout_p=0.0,
            q_positions=None, kv_positions=None, backend="auto", return_weights=False, sinks=None) -> Explanation:
    """Which backend :func:`attention` would use for these arguments, how, and why each other one can't."""
    call = build_call(q, k, v, mask, bias=bias, scale=scale, softcap=softcap, dropout_p=dropout_p,
                      q_positions=q_positions, kv_positions=kv_positions, return_weights=return_weights, sinks=sinks)
    return explain_call(call, backend)

"""Attention sinks (gpt-oss) on a kernel that returns its log-sum-exp.

A sink is one extra logit per head in every row's softmax whose column is dropped: it changes only the softmax's
denominator. With ``lse`` a row's log-sum-exp over its visible keys and ``out`` the plain attention output,

    total = logaddexp(lse, sink)                     # the denominator with the sink column
    out'  = out * exp(lse - total)                   # = out * sigmoid(lse - sink): rows sum to less than 1

The backward is the kernel's own, given ``out'`` and ``total`` in place of ``out`` and ``lse``: it recomputes
the probabilities as ``exp(s - total)`` (the sink's share taken out) and ``rowsum(dO * out')``, which is exactly
the gradient of the softmax with the sink column (whose value is 0). The sink's gradient is
``-sum over rows of exp(sink - total) * rowsum(dO * out')``. Rows with no visible key stay 0: the callers open
them (every key visible) and zero them after, so they pass no gradient to anything, the sink included.

Served on the CPU by SDPA's fused flash kernel (``aten._scaled_dot_product_flash_attention_for_cpu`` and its
backward), which returns ``lse``; the public SDPA does not. Without dropout and without a gradient to the mask.

Shape legend: B batch (stacked pieces included), H query heads, Hkv key/value heads, Lq/Lk lengths, D/Dv head dims.
"""

from __future__ import annotations

import torch

from attnkit._validation import AttentionCall
from attnkit.functional.reference import expand_kv


def _kernels():
    ops = torch.ops.aten
    if not (hasattr(ops, "_scaled_dot_product_flash_attention_for_cpu")
            and hasattr(ops, "_scaled_dot_product_flash_attention_for_cpu_backward")):
        return None
    return ops._scaled_dot_product_flash_attention_for_cpu, ops._scaled_dot_product_flash_attention_for_cpu_backward


def sink_reasons(call: AttentionCall, name: str) -> list[str]:
    """Why backend ``name`` can't serve the call's sinks through the flash kernel (empty when it can, or no sinks)."""
    if call.sinks is None:
        return []
    reasons = []
    if call.q.device.type != "cpu" or _kernels() is None:
        reasons.append(f"{name} serves attention sinks through the CPU flash kernel's log-sum-exp "
                       f"(device {call.q.device.type}; use backend='math' or 'eager')")
    if call.dropout_p > 0:
        reasons.append(f"{name} has no dropout with attention sinks (use dropout_p=0, or backend='math')")
    if call.bias_needs_grad:
        reasons.append(f"{name} gives no gradient to a bias beside attention sinks (use backend='math')")
    return reasons


def attention_with_sinks(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor,
                         attn_mask: torch.Tensor | None, is_causal: bool, scale: float) -> torch.Tensor:
    """``q (B, H, Lq, D)``, ``k, v (B, H|Hkv, Lk, D|Dv)`` (GQA expanded here), ``sinks (H,)``, ``attn_mask`` bool
    (True = may attend) or float (added), broadcastable to ``(B, H, Lq, Lk)``: ``(B, H, Lq, Dv)`` with the sinks'
    share taken out of every row (see the module docstring). Rows of ``attn_mask`` must not be all False/-inf."""
    H = q.shape[1]
    k, v = expand_kv(k, H), expand_kv(v, H)  # (B, H, Lk, D|Dv): the kernel has no GQA
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:  # the kernel takes an additive mask
            kind = torch.float64 if q.dtype == torch.float64 else torch.float32
            attn_mask = torch.zeros(attn_mask.shape, dtype=kind, device=q.device).masked_fill_(~attn_mask, float("-inf"))
        attn_mask = attn_mask.expand(q.shape[0], H, q.shape[2], k.shape[2])  # (B, H, Lq, Lk) view
    return _Sinks.apply(q, k, v, sinks, attn_mask, bool(is_causal), float(scale))


class _Sinks(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sinks, attn_mask, is_causal, scale):
        forward, _ = _kernels()
        out, lse = forward(q, k, v, 0.0, is_causal, attn_mask=attn_mask, scale=scale)  # (B, H, Lq, Dv), (B, H, Lq)
        sink = sinks.detach().to(lse.dtype).view(1, -1, 1)  # (1, H, 1)
        total = torch.logaddexp(lse, sink)  # (B, H, Lq): the softmax's denominator with the sink column
        out = (out.to(lse.dtype) * torch.exp(lse - total).unsqueeze(-1)).to(q.dtype)  # (B, H, Lq, Dv)
        ctx.save_for_backward(q, k, v, out, total, sink, attn_mask)
        ctx.is_causal, ctx.scale, ctx.sink_dtype = is_causal, scale, sinks.dtype
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, out, total, sink, attn_mask = ctx.saved_tensors
        _, backward = _kernels()
        grad = grad.contiguous()
        dq, dk, dv = backward(grad, q, k, v, out, total, 0.0, ctx.is_causal, attn_mask=attn_mask, scale=ctx.scale)
        rowsum = (grad.to(total.dtype) * out.to(total.dtype)).sum(-1)  # (B, H, Lq) = rowsum(dO * out')
        d_sinks = -(torch.exp(sink - total) * rowsum).sum(dim=(0, 2))  # (H,)
        return dq, dk, dv, d_sinks.to(ctx.sink_dtype), None, None, None

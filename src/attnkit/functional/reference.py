"""The executable specification of attention: plain, readable, covering every option. The oracle of the tests.

    scores = (q @ k^T) * scale                       # (B, H, Lq, Lk); GQA: head h reads KV head h // G
    scores = softcap * tanh(scores / softcap)        # optional
    scores = scores + bias                           # ALiBi (from positions) or a float tensor
    scores = where(mask, scores, -inf)               # boolean masks, True = may attend
    p      = safe_softmax(scores)                    # fully masked rows -> all zeros, finite gradients
    p      = dropout(p)                              # attention dropout: after softmax, before V
    out    = p @ v                                   # (B, H, Lq, Dv)

For float16/bfloat16 inputs ``q k^T`` is accumulated in float32 (products of two halves are exact there) and
the scale, bias and softmax stay in float32, as every fused kernel does: large logits can't overflow float16
before the scale. ``p @ v`` takes ``p`` rounded to the inputs' dtype and accumulates in float32 too (a half
matmul on some CPUs, Intel's AMX among them, spreads one row's NaN into its neighbours; rows must stay independent),
then rounds the output to the inputs' dtype. Run it in float64 to get the golden answer.

NaN inputs propagate: a row whose query holds a NaN (or inf) is NaN, and so is a row that may attend a key
or value holding one. Otherwise rows that see no key are 0, even where a masked key or value holds NaN. Calls
with no query, no key or an empty batch give zeros of the right shape (:func:`empty_result`).

Shape legend: B batch, H query heads, Hkv key/value heads, G = H // Hkv, Lq/Lk lengths, D/Dv head dims.
"""

from __future__ import annotations

import contextlib
import math

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
    q, k = call.q, expand_kv(call.k, call.num_heads)  # (B, H, Lq, D), (B, H, Lk, D)
    if q.dtype in (torch.float16, torch.bfloat16):  # accumulate in float32: fp16 q k^T overflows before the scale
        q, k = q.float(), k.float()
    scores = ieee_matmul(q, k.transpose(-2, -1)) * call.scale  # (B, H, Lq, Lk)
    if call.softcap is not None:
        scores = call.softcap * torch.tanh(scores / call.softcap)
    q_pos, kv_pos = call.positions()
    if isinstance(call.bias, StructuredBias):
        scores = scores + call.bias.materialize(q_pos, kv_pos).to(scores.dtype)
    elif call.bias is not None:
        scores = scores + call.bias.to(scores.dtype)
    # the prepared mask knows the call's batch (a custom fn may read per-row data its own batch of 1 hides)
    allowed = materialize(call.mask if call.prepared is None else call.prepared, q_pos, kv_pos)  # (B|1, H|1, Lq, Lk)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    return scores


def reference_from_call(call: AttentionCall):
    """Run a validated call; returns ``out`` or ``(out, weights)``."""
    if call.is_empty:
        return empty_result(call)
    scores = scores_of(call)  # (B, H, Lq, Lk)
    if call.sinks is None:
        probs = safe_softmax(scores)
    else:  # one extra column per head that takes probability mass and is dropped (attention sinks)
        B, H, Lq, _ = scores.shape
        sink = call.sinks.to(scores.dtype).view(1, H, 1, 1).expand(B, H, Lq, 1)  # (B, H, Lq, 1)
        probs = safe_softmax(torch.cat([scores, sink], dim=-1))[..., :-1]  # (B, H, Lq, Lk): rows sum below 1
    dropped = F.dropout(probs, p=call.dropout_p) if call.dropout_p > 0 else probs
    out = probs_times_values(dropped, expand_kv(call.v, call.num_heads))  # (B, H, Lq, Dv)
    # rows that see no key are 0, even where a value they can't see holds NaN (0 * NaN); a bad query is NaN
    out = propagate_nan_queries(out.masked_fill(torch.isneginf(scores).all(dim=-1, keepdim=True), 0.0), call.q)
    if call.return_weights:
        return out, probs.to(call.q.dtype)
    return out


def probs_times_values(p: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``p (B, H, Lq, Lk) @ v (B, H, Lk, Dv)`` in v's dtype, with ``p`` rounded to it first. Half-precision
    products accumulate in float32 so that each output row depends on its own row of ``p`` only."""
    p = p.to(v.dtype)
    if v.dtype not in (torch.float16, torch.bfloat16):
        return ieee_matmul(p, v)  # (B, H, Lq, Dv)
    return ieee_matmul(p.float(), v.float()).to(v.dtype)  # (B, H, Lq, Dv)


def propagate_nan_queries(out: torch.Tensor, q: torch.Tensor, eager_cpu: bool | None = None) -> torch.Tensor:
    """``out (B, H, Lq, Dv)`` with NaN in the rows whose query ``q (B, H, Lq, D)`` holds a NaN or an inf.

    Every backend ends with it: fused kernels' online softmax turns such a row into zeros (SDPA's CPU kernel
    without a mask tensor, flex), and a zero row would hide the bad input. It applies to rows that see no key
    too, so that the rule doesn't depend on which kernel knows where the empty rows are. ``eager_cpu``: whether q is
    on the CPU and nothing compiles, when the caller knows it (a backend's runner, fixed per lane key)."""
    if eager_cpu is None:
        eager_cpu = q.is_cpu and not torch.compiler.is_compiling()
    if eager_cpu and \
            math.isfinite((q.detach() if q.requires_grad else q).sum().item()):
        # eager CPU fast path: one reduction read back as a Python float, no copy (a sum is NaN/inf whenever an
        # entry is; a finite q whose sum overflows only takes the exact row check below; an empty q sums to 0):
        # ~2 us at (1, 8, 16, 64). Elsewhere the exact check below runs without a host sync (a CUDA step never waits)
        return out
    bad = ~torch.isfinite(q).all(dim=-1, keepdim=True)  # (B, H, Lq, 1)
    return out.masked_fill(bad, float("nan"))


def ieee_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a (..., n, m) @ b (..., m, p)`` (same batch dims), in IEEE float32 for float32 inputs forward and backward,
    whatever the process's float32 matmul precision.

    The reference is the yardstick of the 2x rule, so its float32 result must be one function of its inputs. A
    process whose float32 matmul precision was lowered (``torch.set_float32_matmul_precision("medium")``/``"high"``,
    as training scripts and libraries do, or the per-backend ``fp32_precision``) sends float32 products to oneDNN's
    reduced-precision kernels on CPU (bf16 where the CPU has it; other bytes where it has not) or to TF32 on CUDA
    (issue 33 item 1). When the setting is IEEE already this is ``a @ b`` (one attribute read)."""
    if a.dtype != torch.float32 or _matmul_setting(a.device) is None:
        return a @ b
    return _IEEEMatmul.apply(a, b)


def _matmul_setting(device: torch.device):
    """The per-backend matmul settings of ``device`` when its float32 precision is not IEEE, else None."""
    settings = {"cpu": getattr(torch.backends.mkldnn, "matmul", None),
                "cuda": getattr(torch.backends.cuda, "matmul", None)}.get(device.type)
    precision = getattr(settings, "fp32_precision", "ieee")
    if precision == "none":  # inherit the global setting
        precision = getattr(torch.backends, "fp32_precision", "ieee")
    return None if precision in ("ieee", "none") else settings


@contextlib.contextmanager
def _ieee(device: torch.device):
    settings = _matmul_setting(device)
    if settings is None:
        yield
        return
    previous, settings.fp32_precision = settings.fp32_precision, "ieee"
    try:
        yield
    finally:
        settings.fp32_precision = previous


class _IEEEMatmul(torch.autograd.Function):
    """``a @ b`` with the device's float32 matmul precision set to IEEE around the product and its gradients'."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        with _ieee(a.device):
            return a @ b

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        grad_a = ieee_matmul(grad, b.transpose(-2, -1)) if ctx.needs_input_grad[0] else None  # (..., n, m)
        grad_b = ieee_matmul(a.transpose(-2, -1), grad) if ctx.needs_input_grad[1] else None  # (..., m, p)
        return grad_a, grad_b


def empty_result(call: AttentionCall):
    """The result of a call with no batch row, head, query or key: ``(B, H, Lq, Dv)`` zeros (empty unless only
    Lk = 0), and the ``(B, H, Lq, Lk)`` weights when asked; built from q, k, v so backward gives zero gradients."""
    k, v = (expand_kv(t, call.num_heads) for t in (call.k, call.v))  # (B, H, Lk, D|Dv)
    probs = (call.q @ k.transpose(-2, -1)) * 0  # (B, H, Lq, Lk): no entry (one of the dims is 0)
    out = probs @ v  # (B, H, Lq, Dv): a product over Lk = 0 keys is 0
    return (out, probs) if call.return_weights else out


def reference_attention(q, k, v, mask=None, *, bias=None, scale=None, softcap=None, dropout_p=0.0,
                        q_positions=None, kv_positions=None, return_weights=False, sinks=None):
    """Plain attention with every option of :func:`attnkit.attention`; the oracle of the test suite.

    ``weights`` (when ``return_weights=True``) are the softmax probabilities before dropout.
    """
    call = build_call(q, k, v, mask, bias=bias, scale=scale, softcap=softcap, dropout_p=dropout_p,
                      q_positions=q_positions, kv_positions=kv_positions, return_weights=return_weights,
                      sinks=sinks)
    return reference_from_call(call)

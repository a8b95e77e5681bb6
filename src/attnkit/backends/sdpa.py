"""The ``sdpa`` backend: ``torch.nn.functional.scaled_dot_product_attention``.

It passes ``is_causal=True`` only when that is exactly right (pure causal mask, Lq == Lk, default
positions): SDPA's flag is top-left aligned and skips masked blocks. Otherwise the mask is materialised as a
dense boolean (or, with a bias, float) tensor, which SDPA can't use to skip work: the call's prepared mask
builds it once (a model that prepares its mask once per forward builds it once, not once per layer; there is
no memo across calls, except a small pure causal one's: :meth:`PreparedMask.memo`). GQA uses ``enable_gqa``,
except in half-precision decode-sized calls (at most ``FOLD_MAX_QUERIES`` queries, no bias or dropout, a mask
that is the same for every head), which run *folded*: the G query heads that read one KV head become G x Lq rows
of it, one MHA-shaped kernel over the Hkv heads; no key is repeated and every row sees exactly the keys it saw.
float32 never folds: the folded kernel sums a decode step's dot products in another order, up to 2.5x the float32
reference's error on a sharp softmax (the 2x rule broken, gradients 3x; issue 33 item 4), where ``enable_gqa``
stays within it.

Shape legend: B batch, H query heads, Hkv key/value heads, Lq/Lk lengths, D head dim.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnkit._bias import StructuredBias
from attnkit._validation import AttentionCall
from attnkit.backends.base import Rank, skippable_structure
from attnkit.backends.cost import dense_work
from attnkit.backends.sinks import attention_with_sinks, sink_reasons
from attnkit.functional.reference import propagate_nan_queries
from attnkit.masks import is_plain_causal

#: half-precision GQA calls with at most this many queries run folded (see the module docstring). Measured in
#: isolation on a 2-core Xeon, torch 2.13, one query, 8/2 heads: bf16 1.0x at 512 and 0.9x once at 4096 (noisy);
#: 1.3-1.8x with 4 queries (``bench dispatch``). (fp32 was 1.1x (512 keys) to 1.5-2.2x (4096) the speed of
#: ``enable_gqa``, but loses precision: it no longer folds)
FOLD_MAX_QUERIES = 16

#: ... except one query per head in half precision on CPU with fewer query heads per KV head than this: SDPA's CPU
#: kernel serves Lq = 1 in bf16 on a path of its own (ctx 512, 8/2 heads: 32 us, against 86 us for Lq = 2) that a
#: folded call, G rows per KV head, leaves. Measured (2-core Xeon, torch 2.13, D = 64, ctx 40 / 512 / 2048-4096,
#: B 1 and 8): fold / unfolded speed 0.6-0.7x at G = 2, 0.7-1.07x at G = 4, 1.5-1.85x at G = 8 from ctx 512, and
#: 1.3-2.7x whenever Lq >= 2 (bf16) or in float32. (``attnkit bench dispatch`` shows the decode cells.)
FOLD_MIN_GROUP_HALF_SINGLE_QUERY = 8


class SDPABackend:
    name = "sdpa"
    ranks_by_signature = True  # supports/rank read the call's signature and prepared mask only
    traceable = True
    serves_sinks = True  # on the CPU, through the flash kernel's log-sum-exp (backends.sinks)

    def available(self) -> list[str]:
        return [] if hasattr(F, "scaled_dot_product_attention") else ["torch lacks scaled_dot_product_attention"]

    def supports(self, call: AttentionCall) -> list[str]:
        reasons = []
        if call.return_weights:
            reasons.append("SDPA does not return attention weights (use return_weights=False, or backend='math')")
        if call.softcap is not None:
            reasons.append("SDPA has no logit softcap")
        return reasons + sink_reasons(call, "sdpa")

    def _mode(self, call: AttentionCall) -> str:
        """'none', 'causal' (is_causal flag), or 'dense' (materialised mask)."""
        if call.prepared is None:
            return "none"
        flag = call.prepared.sdpa_flag(call.q_len, call.kv_len)  # "none": a causal decode step sees every key
        if flag == "none" or (flag == "causal" and call.bias is None):
            return flag  # (with a bias the mask joins it: SDPA refuses is_causal plus a mask needing grad)
        return "dense"

    def rank(self, call: AttentionCall) -> Rank:
        structure = skippable_structure(call)
        if structure is None:
            return Rank(30, "no mask, a causal mask SDPA can flag, or a dense tensor: one fused SDPA kernel")
        return Rank(10, f"{structure}: SDPA needs it as a dense tensor and skips no block")

    def work(self, call: AttentionCall) -> dict[str, float]:
        """What it computes, for the router's predicted time (``backends.cost``): every Lq x Lk entry (half under
        the causal flag), the dense mask read per entry, a bias materialised."""
        mode = self._mode(call)
        return dense_work(call, causal=mode == "causal", mask=mode == "dense", bias=call.bias is not None)

    def plan(self, call: AttentionCall) -> str:
        mode = self._mode(call)
        parts = {
            "none": "no mask: fused kernel over all keys",
            "causal": "is_causal=True: fused kernel skips blocks above the diagonal",
            "dense": "dense mask tensor (Lq x Lk): fused kernel, but no block is skipped",
        }[mode]
        if mode == "dense" and is_plain_causal(call.prepared.spec):
            parts += " (causal with explicit positions or Lq != Lk can't use SDPA's top-left is_causal)"
        if call.bias is not None:
            parts += "; bias materialised as a (B, H, Lq, Lk) float tensor"
        if call.num_kv_heads != call.num_heads and _foldable(call, mode == "causal", _mask_heads(call)):
            parts += "; GQA folded: the query heads of one KV head run as rows of it (no repeated keys)"
        if call.dropout_p > 0 and call.q.device.type == "cpu":
            parts += "; dropout_p > 0 makes SDPA fall back to its math path on CPU"
        return parts

    def __call__(self, call: AttentionCall) -> torch.Tensor:
        return self.runner(call)(call)

    def runner(self, call: AttentionCall):
        """The kernel call for ``call`` as a function of a call. What it decides (the mask's form, whether GQA
        folds) reads only what a plain call's lane key fixes (``backends.lane``), so it serves every call of it."""
        mode = self._mode(call)
        is_causal, dense, gqa = mode == "causal", mode == "dense", call.num_kv_heads != call.num_heads
        fold = gqa and call.sinks is None and _foldable(call, is_causal, _mask_heads(call))
        eager_cpu = call.q.is_cpu and not torch.compiler.is_compiling()  # (device in the key; lanes never compile)

        def run(c: AttentionCall) -> torch.Tensor:
            attn_mask, empty_rows = c.prepared.dense_opened() if dense else (None, None)  # built once per mask
            if c.bias is not None:
                bias = c.bias.materialize(*c.positions()) if isinstance(c.bias, StructuredBias) else c.bias
                bias = bias.to(_bias_dtype(c.q))
                attn_mask = bias if attn_mask is None else bias.masked_fill(~attn_mask, float("-inf"))
            if c.sinks is not None:  # the flash kernel's log-sum-exp takes the sinks' share out (backends.sinks)
                out = attention_with_sinks(c.q, c.k, c.v, c.sinks, attn_mask, is_causal, c.scale)  # (B, H, Lq, Dv)
            elif fold:
                out = _folded(c, attn_mask)  # (B, H, Lq, Dv)
            else:
                out = F.scaled_dot_product_attention(
                    c.q, c.k, c.v, attn_mask=attn_mask, dropout_p=c.dropout_p, is_causal=is_causal, scale=c.scale,
                    enable_gqa=gqa)  # (B, H, Lq, Dv)
            if empty_rows is not None:
                out = out.masked_fill(empty_rows, 0.0)
            return propagate_nan_queries(out, c.q, eager_cpu)  # without a mask tensor the CPU kernel gives 0 for a NaN query

        return run


def _bias_dtype(q: torch.Tensor) -> torch.dtype:
    """The dtype a float bias enters the kernel in: float32 (or float64) on CPU, whose kernel adds a float32 mask
    to its float32 scores (a bias cast to bf16/fp16 loses ~1/256 of its magnitude: 7-190x the error of a
    half-precision reference with a bias of magnitude 10-1000); q's dtype on other devices (CUDA's fused kernels
    expect the mask in q's dtype; not measured here)."""
    return torch.promote_types(q.dtype, torch.float32) if q.device.type == "cpu" else q.dtype


def _mask_heads(call: AttentionCall) -> int:
    """How many heads the call's mask tells apart (1 without a mask, or unless a per-head tensor)."""
    return 1 if call.prepared is None else call.prepared.heads


def _foldable(call: AttentionCall, is_causal: bool, mask_heads: int) -> bool:
    """A half-precision decode-sized GQA call whose rows may be regrouped: no is_causal flag (top-left rows would move), no bias
    (per head), no dropout (its random stream would follow the new layout), a mask the same for every head; and
    where folding pays (not one half-precision query per head on CPU with G < 8: see the constants above)."""
    q = call.q
    if not (q.dtype in (torch.bfloat16, torch.float16) and call.q_len <= FOLD_MAX_QUERIES and not is_causal
            and call.bias is None and call.dropout_p == 0 and mask_heads == 1):
        return False  # (float32 and float64: precision, see the module docstring)
    return not (call.q_len == 1 and q.dtype in (torch.bfloat16, torch.float16) and q.device.type == "cpu"
                and q.shape[1] // call.k.shape[1] < FOLD_MIN_GROUP_HALF_SINGLE_QUERY)  # its own fast path wins


def _folded(call: AttentionCall, attn_mask: torch.Tensor | None) -> torch.Tensor:
    """GQA as MHA over the Hkv heads: query head h = j * G + g reads KV head j, so its rows become rows
    ``g * Lq + i`` of head j. q (B, H, Lq, D) -> (B, Hkv, G*Lq, D); a mask (b, 1, Lq, Lk) -> (b, 1, G*Lq, Lk);
    the output (B, Hkv, G*Lq, Dv) -> (B, H, Lq, Dv). Exact: every row sees the same keys with the same scale."""
    B, H, Lq, D = call.q.shape
    Hkv = call.num_kv_heads
    G = H // Hkv
    q = call.q.reshape(B, Hkv, G * Lq, D)  # (B, Hkv, G*Lq, D): a view when q is contiguous
    if attn_mask is not None and Lq > 1 and attn_mask.shape[-2] == Lq:  # one row per query: repeat for each g
        attn_mask = call.prepared.memo(("sdpa folded", G), lambda: _fold_mask(attn_mask, G), shared=True)
    out = F.scaled_dot_product_attention(q, call.k, call.v, attn_mask=attn_mask, scale=call.scale)
    return out.reshape(B, H, Lq, out.shape[-1])  # (B, Hkv, G*Lq, Dv) -> (B, H, Lq, Dv)


def _fold_mask(mask: torch.Tensor, G: int) -> torch.Tensor:
    """``mask (b, 1, Lq, Lk)`` -> ``(b, 1, G*Lq, Lk)``: the rows of every folded query head (see :func:`_folded`)."""
    b, _, Lq, Lk = mask.shape
    return mask.unsqueeze(2).expand(b, 1, G, Lq, Lk).reshape(b, 1, G * Lq, Lk)  # (b, 1, G*Lq, Lk)


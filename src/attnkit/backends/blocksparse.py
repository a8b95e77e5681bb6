"""The ``blocksparse`` backend: compute only the key ranges each piece of queries can reach.

No custom kernel: :mod:`attnkit.backends.block_plan` cuts the queries into pieces with the keys their mask
can reach; pieces of equal shape are stacked along the batch dim and run through
``F.scaled_dot_product_attention`` with the small per-piece mask (or ``is_causal=True`` where the piece is
exactly causal). Autograd gives the backward; cost and memory grow with the reachable entries, not with
Lq x Lk. A structured bias (ALiBi) is evaluated per piece from positions, never as an Lq x Lk tensor.
Rows with no visible key give 0 with finite gradients.

Shape legend: B batch, R batch rows of a plan, H query heads, Hkv key/value heads, T stacked pieces,
lq/lk a piece's query/key counts, D/Dv head dims.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from attnkit._bias import StructuredBias
from attnkit._validation import AttentionCall
from attnkit.backends.block_plan import Piece, Plan, make_plan
from attnkit.masks import Dense, MaskContext, MaskSpec
from attnkit.masks.blocks import evaluate_on
from attnkit.masks.dense import context_for


class BlockSparseBackend:
    name = "blocksparse"

    def available(self) -> list[str]:
        return [] if hasattr(F, "scaled_dot_product_attention") else ["torch lacks scaled_dot_product_attention"]

    def supports(self, call: AttentionCall) -> list[str]:
        reasons = []
        if call.return_weights:
            reasons.append("blocksparse does not return attention weights (use backend='math')")
        if call.softcap is not None:
            reasons.append("blocksparse runs SDPA per piece, which has no logit softcap")
        return reasons

    def plan(self, call: AttentionCall) -> str:
        plans = make_plans(call)
        return "skips unreachable key blocks: " + plans[0].describe() + (
            f" (per batch row, {len(plans)} plans)" if len(plans) > 1 else "")

    def __call__(self, call: AttentionCall) -> torch.Tensor:
        mask, ctx = _mask_and_context(call)
        plans = make_plans(call, mask, ctx)
        outs = [run_plan(call, plan, mask, ctx) for plan in plans]  # (R, H, Lq, Dv) each
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)  # (B, H, Lq, Dv)


def _mask_and_context(call: AttentionCall) -> tuple[MaskSpec | None, MaskContext]:
    mask = Dense(call.mask) if isinstance(call.mask, torch.Tensor) else call.mask
    q_pos, kv_pos = call.positions()
    ctx = context_for(mask if mask is not None else Dense(torch.ones(1, 1, dtype=torch.bool)), q_pos, kv_pos,
                      batch=call.batch)
    return mask, ctx


def make_plans(call: AttentionCall, mask: MaskSpec | None = None, ctx: MaskContext | None = None) -> list[Plan]:
    """One plan for the whole batch, or one per row when the mask data or positions differ across rows."""
    if ctx is None:
        mask, ctx = _mask_and_context(call)
    allow_causal = call.bias is None
    per_row = call.batch > 1 and ((mask is not None and mask.batch > 1) or not _rows_share_positions(call))
    dev = call.q.device
    if not per_row:
        return [make_plan(mask, ctx, torch.arange(call.batch, device=dev), allow_causal=allow_causal)]
    return [make_plan(mask, ctx, torch.tensor([b], device=dev), allow_causal=allow_causal) for b in range(call.batch)]


def _rows_share_positions(call: AttentionCall) -> bool:
    return all(p is None or p.shape[0] == 1 for p in (call.q_positions, call.kv_positions))


def run_plan(call: AttentionCall, plan: Plan, mask: MaskSpec | None, ctx: MaskContext) -> torch.Tensor:
    """Execute a plan for its batch rows: ``(R, H, Lq, Dv)``."""
    rows = plan.rows
    whole = rows.numel() == call.batch
    q, k, v = (t if whole else t[rows] for t in (call.q, call.k, call.v))  # (R, H|Hkv, L, D)
    if plan.q_perm is not None:
        q = q[:, :, plan.q_perm]  # (R, H, Lq, D) in plan order
        k, v = k[:, :, plan.kv_perm], v[:, :, plan.kv_perm]  # (R, Hkv, Lk, D)
    q_map = plan.q_perm if plan.q_perm is not None else torch.arange(plan.q_len, device=q.device)
    kv_map = plan.kv_perm if plan.kv_perm is not None else torch.arange(plan.kv_len, device=q.device)
    R, H, Dv = q.shape[0], q.shape[1], v.shape[-1]
    outputs: list[torch.Tensor | None] = [None] * len(plan.pieces)
    for (_lq, _lk, mode), ids in plan.groups().items():
        pieces = [plan.pieces[i] for i in ids]
        out = _run_group(call, pieces, mode, q, k, v, mask, ctx, rows, q_map, kv_map)  # (T, R, H, lq, Dv)
        for t, i in enumerate(ids):
            outputs[i] = out[t]
    for i, p in enumerate(plan.pieces):
        if outputs[i] is None:  # no reachable key: zeros
            outputs[i] = q.new_zeros(R, H, p.lq, Dv)
    out = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=2)  # (R, H, Lq, Dv) in plan order
    if plan.q_perm is not None:
        out = out[:, :, torch.argsort(plan.q_perm)]  # (R, H, Lq, Dv) in index order
    return out


def _index(pieces: list[Piece], device) -> tuple[torch.Tensor, torch.Tensor]:
    """Plan-order query ``(T, lq)`` and key ``(T, lk)`` indices of equal-shaped pieces."""
    q_idx = torch.stack([torch.arange(p.q_lo, p.q_hi, device=device) for p in pieces])  # (T, lq)
    kv_idx = torch.stack([torch.cat([torch.arange(lo, hi, device=device) for lo, hi in p.kv])
                          for p in pieces])  # (T, lk)
    return q_idx, kv_idx


def _take(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Rows ``idx (T, l)`` of ``x (R, H, L, D)`` stacked into the batch: ``(T * R, H, l, D)``."""
    return x[:, :, idx].movedim(2, 0).flatten(0, 1)  # (R, H, T, l, D) -> (T, R, H, l, D) -> (T*R, H, l, D)


def _run_group(call, pieces, mode, q, k, v, mask, ctx, rows, q_map, kv_map) -> torch.Tensor:
    """Run equal-shaped pieces as one kernel call: ``(T, R, H, lq, Dv)``."""
    T, R, H = len(pieces), q.shape[0], q.shape[1]
    p0 = pieces[0]
    if T == 1 and len(p0.kv) == 1:  # views, no copies
        qs = q[:, :, p0.q_lo:p0.q_hi]  # (R, H, lq, D)
        ks, vs = (x[:, :, p0.kv[0][0]:p0.kv[0][1]] for x in (k, v))  # (R, Hkv, lk, D)
    else:
        q_idx, kv_idx = _index(pieces, q.device)
        qs, ks, vs = _take(q, q_idx), _take(k, kv_idx), _take(v, kv_idx)  # (T*R, H|Hkv, l, D)
    needs_mask = mode != "causal" and (mode == "mask" or call.bias is not None)

    def attend(qs, ks, vs):
        attn_mask, empty = None, None
        if needs_mask:
            attn_mask, empty = _piece_mask(call, pieces, mode, mask, ctx, rows, q_map, kv_map, q.dtype)
            attn_mask = attn_mask.expand(T, R, *attn_mask.shape[2:]).flatten(0, 1)  # (T*R, H|1, lq, lk)
            empty = None if empty is None else empty.expand(T, R, *empty.shape[2:]).flatten(0, 1)  # (T*R, H|1, lq, 1)
        out = F.scaled_dot_product_attention(
            qs, ks, vs, attn_mask=attn_mask, dropout_p=call.dropout_p, is_causal=mode == "causal",
            scale=call.scale, enable_gqa=call.num_kv_heads != call.num_heads,
        )  # (T*R, H, lq, Dv)
        return out if empty is None else out.masked_fill(empty, 0.0)

    if needs_mask and call.bias is not None and call.needs_grad:
        # a float bias per piece would be kept for backward: O(reachable entries) floats in total. Recompute
        # it in the backward pass instead (the RNG state is replayed, so dropout masks match).
        out = checkpoint(attend, qs, ks, vs, use_reentrant=False)
    else:
        out = attend(qs, ks, vs)
    return out.view(T, R, H, *out.shape[2:])  # (T, R, H, lq, Dv)


def _piece_mask(call, pieces, mode, mask, ctx, rows, q_map, kv_map, dtype):
    """The kernel's mask for stacked pieces: bool, or float with the bias; ``(T, R|1, H|1, lq, lk)`` and the
    empty-row mask ``(T, R|1, H|1, lq, 1)`` (None when no row can be empty)."""
    q_idx, kv_idx = _index(pieces, rows.device)
    q_idx, kv_idx = q_map[q_idx], kv_map[kv_idx]  # (T, lq), (T, lk) call indices
    allowed = evaluate_on(mask, ctx, rows, q_idx, kv_idx, heads=mask.heads) if mode == "mask" else None
    empty = None
    if allowed is not None:
        empty = ~allowed.any(dim=-1, keepdim=True)  # (T, R|1, H|1, lq, 1)
        allowed = allowed | empty  # empty rows see every key, their output is zeroed afterwards
    if call.bias is None:
        return allowed, empty
    if isinstance(call.bias, StructuredBias):
        h = torch.arange(call.num_heads, device=rows.device).view(1, 1, -1, 1, 1)  # (1, 1, H, 1, 1)
        q_pos = ctx.q_positions[rows][:, q_idx].movedim(1, 0)[:, :, None, :, None]  # (T, R, 1, lq, 1)
        kv_pos = ctx.kv_positions[rows][:, kv_idx].movedim(1, 0)[:, :, None, None, :]  # (T, R, 1, 1, lk)
        bias = call.bias.score(h, q_pos, kv_pos)  # (T, R, H, lq, lk)
    else:
        full = call.bias if call.bias.dim() == 4 else call.bias.reshape(
            (1,) * (4 - call.bias.dim()) + tuple(call.bias.shape))  # (B|1, H|1, Lq|1, Lk|1)
        full = full if full.shape[0] == 1 else full[rows]
        full = full.expand(-1, -1, call.q_len, call.kv_len)  # (R|1, H|1, Lq, Lk) view
        bias = full[:, :, q_idx[:, :, None], kv_idx[:, None, :]].movedim(2, 0)  # (T, R|1, H|1, lq, lk)
    bias = bias.to(dtype)
    if allowed is not None:
        bias = bias.masked_fill(~allowed, float("-inf"))
    return bias, empty

"""blocksparse's stacked piece groups on SDPA's fused kernel: each group of equal-shaped pieces one call.

Evenly spaced pieces (a sliding window's band of blocks) take their queries as a view and their key bands as
``unfold`` views, no gathered copies; other groups gather their rows once (``index_select``). A masked group's
additive kernel mask is built once per prepared mask (its memo) and kept as one ``(1, 1, lq, lk)`` mask, which
the kernel broadcasts, when every piece's mask is the same. Sinks go through :mod:`attnkit.backends.sinks`.

Shape legend: R batch rows of a plan, H query heads, Hkv key/value heads, T stacked pieces, lq/lk a piece's
query/key counts, D/Dv head dims.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnkit._validation import AttentionCall
from attnkit.backends.block_plan import Piece, Plan
from attnkit.backends.sinks import attention_with_sinks
from attnkit.masks import PreparedMask
from attnkit.masks.blocks import evaluate_on


def run_groups(call: AttentionCall, plan: Plan, q, k, v, q_map, kv_map) -> torch.Tensor:
    """Equal-shaped pieces stacked into SDPA calls: ``(R, H, Lq, Dv)`` in plan order."""
    rows = plan.rows
    R, H, Dv = q.shape[0], q.shape[1], v.shape[-1]
    outputs: list[torch.Tensor | None] = [None] * len(plan.pieces)
    for (_lq, _lk, mode), ids in plan.groups().items():
        pieces = [plan.pieces[i] for i in ids]
        out = _run_group(call, pieces, mode, q, k, v, rows, q_map, kv_map)  # (T, R, H, lq, Dv)
        for i, piece_out in zip(ids, out.unbind(0)):  # unbind: one backward op (per-piece indexing was O(T^2))
            outputs[i] = piece_out
    for i, p in enumerate(plan.pieces):
        if outputs[i] is None:  # no reachable key: zeros
            outputs[i] = q.new_zeros(R, H, p.lq, Dv)
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=2)  # (R, H, Lq, Dv) in plan order


def _run_group(call, pieces, mode, q, k, v, rows, q_map, kv_map) -> torch.Tensor:
    """Run equal-shaped pieces as one kernel call: ``(T, R, H, lq, Dv)``. Queries and key bands are views
    where the pieces are evenly spaced runs (a sliding window's band of blocks: no copies), else gathered once;
    a masked group's kernel mask is built once per prepared mask (:func:`_group_mask`)."""
    T, R, H = len(pieces), q.shape[0], q.shape[1]
    p0 = pieces[0]
    if T == 1 and len(p0.kv) == 1:  # views, no copies
        qs = q[:, :, p0.q_lo:p0.q_hi]  # (R, H, lq, D)
        ks, vs = (x[:, :, p0.kv[0][0]:p0.kv[0][1]] for x in (k, v))  # (R, Hkv, lk, D)
    else:
        q_step, kv_step = _spacing(pieces)
        q_idx = kv_idx = None
        if R == 1 and q_step == p0.lq:  # the pieces tile one run of queries: a view
            qs = q[:, :, p0.q_lo:p0.q_lo + T * p0.lq].unflatten(2, (T, p0.lq)).movedim(2, 0).flatten(0, 1)
        else:
            q_idx, kv_idx = piece_index(pieces, q.device)
            qs = _take(q, q_idx)  # (T*R, H, lq, D)
        if R == 1 and kv_step is not None:  # overlapping bands of keys: unfold views
            ks, vs = (_bands(x, p0.kv[0][0], p0.lk, kv_step, T) for x in (k, v))  # (T, Hkv, lk, D)
        else:
            kv_idx = piece_index(pieces, q.device)[1] if kv_idx is None else kv_idx
            ks, vs = _take(k, kv_idx), _take(v, kv_idx)  # (T*R, Hkv, lk, D)
    attn_mask = empty = None
    if mode == "mask":
        attn_mask, empty = _group_mask(call, pieces, rows, q_map, kv_map, q.dtype)  # (T|1, R|1, H|1, lq, lk|1)
        attn_mask, empty = (_batch_dims(x, T, R) for x in (attn_mask, empty))  # (T*R|1, H|1, lq, lk|1)
    if call.sinks is not None:  # a piece holds whole rows: its log-sum-exp is the row's (backends.sinks)
        out = attention_with_sinks(qs, ks, vs, call.sinks, attn_mask, mode == "causal", call.scale)  # (T*R, H, lq, Dv)
    else:
        out = F.scaled_dot_product_attention(
            qs, ks, vs, attn_mask=attn_mask, dropout_p=call.dropout_p, is_causal=mode == "causal",
            scale=call.scale, enable_gqa=call.num_kv_heads != call.num_heads,
        )  # (T*R, H, lq, Dv)
    if empty is not None:
        out = out.masked_fill(empty, 0.0)
    return out.view(T, R, H, *out.shape[2:])  # (T, R, H, lq, Dv)


def _spacing(pieces: list[Piece]) -> tuple[int | None, int | None]:
    """The query step and (for single key ranges) key step between consecutive equal-shaped pieces, None where
    it is not constant."""
    if len(pieces) < 2:
        return None, None
    q_step = pieces[1].q_lo - pieces[0].q_lo
    if any(b.q_lo - a.q_lo != q_step for a, b in zip(pieces, pieces[1:])):
        q_step = None
    kv_step = None
    if all(len(p.kv) == 1 for p in pieces):
        kv_step = pieces[1].kv[0][0] - pieces[0].kv[0][0]
        if kv_step <= 0 or any(b.kv[0][0] - a.kv[0][0] != kv_step for a, b in zip(pieces, pieces[1:])):
            kv_step = None
    return q_step, kv_step


def _bands(x: torch.Tensor, lo: int, lk: int, step: int, count: int) -> torch.Tensor:
    """``count`` key bands ``[lo + t * step, lo + t * step + lk)`` of ``x (1, Hkv, L, D)`` as one view
    ``(count, Hkv, lk, D)`` (``unfold``: its backward sums the overlaps in one kernel)."""
    span = x[0, :, lo:lo + (count - 1) * step + lk]  # (Hkv, l, D)
    return span.unfold(1, lk, step).permute(1, 0, 3, 2)  # (Hkv, count, D, lk) -> (count, Hkv, lk, D)


def _batch_dims(x: torch.Tensor | None, T: int, R: int) -> torch.Tensor | None:
    """``(T|1, R|1, ...)`` -> the kernel's batch ``(T*R|1, ...)`` (a broadcast stays size 1: no copy)."""
    if x is None:
        return None
    if x.shape[0] == 1 and (x.shape[1] == 1 or T == 1):
        return x[0]  # (R|1, ...)
    return x.expand(T, R, *x.shape[2:]).flatten(0, 1)


def piece_index(pieces: list[Piece], device) -> tuple[torch.Tensor, torch.Tensor]:
    """Plan-order query ``(T, lq)`` and key ``(T, lk)`` indices of equal-shaped pieces."""
    q_idx = torch.stack([torch.arange(p.q_lo, p.q_hi, device=device) for p in pieces])  # (T, lq)
    kv_idx = torch.stack([torch.cat([torch.arange(lo, hi, device=device) for lo, hi in p.kv])
                          for p in pieces])  # (T, lk)
    return q_idx, kv_idx


def _take(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Rows ``idx (T, l)`` of ``x (R, H, L, D)`` stacked into the batch: ``(T * R, H, l, D)``.

    ``index_select`` on the flat index: its backward is one ``index_add_`` (advanced indexing's is a much
    slower accumulating ``index_put_``)."""
    R, H, _, D = x.shape
    rows = x.index_select(2, idx.flatten()).view(R, H, *idx.shape, D)  # (R, H, T, l, D)
    return rows.movedim(2, 0).flatten(0, 1)  # (T, R, H, l, D) -> (T*R, H, l, D)


def _group_mask(call, pieces, rows, q_map, kv_map, dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The additive kernel mask of stacked pieces, 0 where allowed and ``-inf`` elsewhere, ``(T|1, R|1, H|1,
    lq, lk)`` in ``dtype``, and their empty rows ``(T|1, R|1, H|1, lq, 1)`` (None when there are none), kept in
    the prepared mask's memo: every layer and call with that mask reuses them. Pieces whose masks are all the
    same (a window's band of blocks) keep one, ``T = 1``, which the kernel broadcasts."""
    key = ("blocksparse_mask", dtype, tuple(rows.tolist()), tuple(pieces))
    return call.prepared.memo(key, lambda: _build_group_mask(pieces, call.prepared, rows, q_map, kv_map, dtype))


def _build_group_mask(pieces, prepared: PreparedMask, rows, q_map, kv_map, dtype):
    allowed, empty = _piece_mask(pieces, prepared, rows, q_map, kv_map)  # (T, R|1, H|1, lq, lk), (..., lq, 1)
    if allowed.shape[0] > 1 and bool((allowed == allowed[:1]).all()):
        allowed, empty = allowed[:1], empty[:1]
    additive = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, float("-inf"))
    return additive, (empty if bool(empty.any()) else None)


def _piece_mask(pieces, prepared: PreparedMask, rows, q_map, kv_map):
    """The bool kernel mask of stacked pieces ``(T, R|1, H|1, lq, lk)`` and their empty rows
    ``(T, R|1, H|1, lq, 1)`` (which see every key; their output is zeroed afterwards), from the prepared
    mask's bound function (bound once per call, not per piece group)."""
    q_idx, kv_idx = piece_index(pieces, rows.device)
    allowed = evaluate_on(prepared.fn, rows, q_map[q_idx], kv_map[kv_idx], prepared.heads)
    empty = ~allowed.any(dim=-1, keepdim=True)  # (T, R|1, H|1, lq, 1)
    return allowed | empty, empty

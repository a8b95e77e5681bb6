"""The ``blocksparse`` backend: compute only the key ranges each piece of queries can reach.

:mod:`attnkit.backends.block_plan` cuts the queries into pieces with the keys their mask can reach. Without
a bias, pieces of equal shape are stacked along the batch dim and run through
``F.scaled_dot_product_attention`` with the small per-piece mask (or ``is_causal=True`` where the piece is
exactly causal); autograd gives the backward. With a bias (ALiBi, a float tensor) or a logit softcap the
pieces run through the tiled kernel of :mod:`attnkit.backends.tiled` (softcap with its backward), their
additive term read from an offset table (:mod:`attnkit.backends.relative`) or evaluated per piece from
positions, never as an Lq x Lk tensor. For inference the offset-table pieces run on SDPA with their table slice
as the float mask, and under a causal mask on the CPU most ALiBi heads run as causal calls of SDPA's fused
kernel with a ``(1, h, 1, Lk)`` row of key terms (:func:`~attnkit.backends.relative.key_row`).
Cost and memory grow with the reachable entries, not with Lq x Lk. Rows with no visible key give 0 with
finite gradients.

Packed causal documents (``causal() & document(ids)``, each document one run with increasing positions, no
bias or softcap) skip the tiles altogether: :mod:`attnkit.backends.varlen` runs the documents as separate
causal sequences, batched by length, through SDPA's fused causal kernel (forward and backward), at any length.

Shape legend: B batch, R batch rows of a plan, H query heads, Hkv key/value heads, T stacked pieces,
lq/lk a piece's query/key counts, D/Dv head dims.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from attnkit._bias import StructuredBias
from attnkit._validation import AttentionCall
from attnkit.backends.base import Rank, is_long, skippable_structure
from attnkit.backends.block_groups import piece_index, run_groups
from attnkit.backends.block_plan import Piece, Plan, make_plan
from attnkit.backends.cost import blocksparse_work
from attnkit.backends.relative import (
    BLOCK,
    HALF_KEY_ROW_SPAN,
    KEY_ROW_SEGMENTS,
    HeadGroup,
    KeyRowRule,
    describe,
    relative_groups,
    segment_rows,
)
from attnkit.backends.sinks import sink_reasons
from attnkit.backends.tiled import tiled_attention
from attnkit.backends.varlen import document_runs, run_documents
from attnkit.functional.reference import expand_kv, propagate_nan_queries
from attnkit.masks import MaskContext, MaskSpec
from attnkit.masks.blocks import evaluate_on
from attnkit.masks.dense import context_for

#: from this many keys (and ``SPARSE_MIN_QUERIES`` queries) a structured mask is worth skipping blocks for:
#: below, one SDPA call with a dense mask was as fast or faster in our runs
SPARSE_MIN_KEYS = 4096
#: from this many keys a structured bias (ALiBi) goes to the tiled kernel: SDPA with the dense bias was 2.0x
#: slower forward and 2.3x forward+backward at 2048 (its far-key exponentials turn subnormal)
BIAS_MIN_KEYS = 2048
SPARSE_MIN_QUERIES = 128
#: queries per piece merged whatever the extra work (the planner's ``min_piece``): none. Pieces grow only while
#: the extra (masked) work stays within ``block_plan.MERGE_SLACK``: stacked into one SDPA call, the smallest
#: pieces computing the fewest entries ran fastest (causal & sliding_window(256) at N = 16384, B=1, H=8,
#: Hkv=2, D=64, one thread, forward: tiles of 64 queries x 320 keys 155 ms, merged to 256 x 512 (the old
#: minimum of 256 queries) 228 ms, 512 x 768 348 ms; see benchmarks/results/sparse.json)
MIN_PIECE = 0
#: from this many keys a relative bias (ALiBi) under an offset-only mask (none, causal, windows) with default
#: positions runs as SDPA pieces against an offset table (inference): ALiBi causal forward at 0.41-0.85x
#: SDPA's is_causal without the bias from 256 to 4096 keys, where SDPA with the dense bias gave 0.21-0.31x
#: up to 1024 (2-core Xeon with AMX, CPU time)
RELATIVE_MIN_KEYS = 256
#: inference runs ALiBi causal heads as key rows (SDPA's causal flag) from this many queries on: below, the fused
#: CPU kernel's causal flag skipped nothing (its query blocks are small there: N = 512, H = 4, float32, causal
#: 2.47 ms vs the full square 2.43 ms; at 1024, 7.24 vs 9.45), so the offset table's pieces, which compute the
#: triangle, were faster (ALiBi causal at N = 512: 0.88x SDPA causal without bias, key rows 0.75x; 768: even)
KEY_ROW_MIN_QUERIES = 768


class BlockSparseBackend:
    name = "blocksparse"
    ranks_by_signature = True  # supports/rank read the call's signature and prepared mask (its memo) only
    serves_sinks = True  # on its SDPA pieces (each holds whole rows), through the flash kernel's log-sum-exp
    traceable = False  # data-dependent plans (block covers, bool(...) checks) break torch.compile graphs

    def rank(self, call: AttentionCall) -> Rank:
        structure = skippable_structure(call)
        min_keys = BIAS_MIN_KEYS if isinstance(call.bias, StructuredBias) else SPARSE_MIN_KEYS
        if _offset_pieces_on_sdpa(call):
            min_keys = RELATIVE_MIN_KEYS
        if structure is None:
            return Rank(5, "nothing to skip: SDPA's own form is as good")
        runs = document_runs(call)
        if runs is not None:
            return Rank(25, f"{structure}: {runs.count} documents run as separate causal sequences on SDPA's fused "
                            f"kernel (forward and backward), {100 * runs.density():.0f}% of the Lq x Lk entries")
        if not is_long(call, min_keys, SPARSE_MIN_QUERIES):
            return Rank(5, f"{structure} on a short call (Lq={call.q_len}, Lk={call.kv_len} < {SPARSE_MIN_QUERIES}/"
                           f"{min_keys}): skips blocks, ranked below SDPA (the predicted time decides)")
        where = " (flex on CPU: no backward, or compiling not allowed)" if call.q.device.type == "cpu" else ""
        return Rank(20, f"{structure} on {call.kv_len} keys: blocksparse computes only reachable key blocks{where}")

    def available(self) -> list[str]:
        return [] if hasattr(F, "scaled_dot_product_attention") else ["torch lacks scaled_dot_product_attention"]

    def supports(self, call: AttentionCall) -> list[str]:
        reasons = []
        if call.return_weights:
            reasons.append("blocksparse does not return attention weights (use backend='math')")
        if call.bias_needs_grad:
            reasons.append("blocksparse gives no gradient to the bias (use backend='sdpa' or 'math' to train a bias)")
        if call.sinks is not None and not _allow_causal(call):
            reasons.append("blocksparse serves attention sinks on its SDPA pieces, not with a bias or softcap (its tiled "
                           "kernel has none; use backend='eager' or 'math')")
        return reasons + sink_reasons(call, "blocksparse")

    work = staticmethod(blocksparse_work)  # what it computes, for auto's predicted time (backends.cost)

    def plan(self, call: AttentionCall) -> str:
        runs = document_runs(call)
        if runs is not None:
            return runs.describe()
        mask, _ = _mask_and_context(call)
        sdpa = _relative_on_sdpa(call)
        groups = relative_groups(call, mask, sdpa=sdpa, key_rows=_key_row_rule(call))
        if groups is not None:
            return describe(groups, call, sdpa)
        plans = make_plans(call)
        return "skips unreachable key blocks: " + plans[0].describe() + (
            f" (per batch row, {len(plans)} plans)" if len(plans) > 1 else "")

    def __call__(self, call: AttentionCall) -> torch.Tensor:
        runs = document_runs(call)
        if runs is not None:  # packed causal documents: each one a causal sequence of its own
            return propagate_nan_queries(run_documents(call, runs), call.q)
        mask, ctx = _mask_and_context(call)
        groups = relative_groups(call, mask, sdpa=_relative_on_sdpa(call), key_rows=_key_row_rule(call))
        if groups is not None:  # offset-only mask and bias: table slices, no per-piece evaluation
            out = _run_relative(call, groups)
        else:
            plans = make_plans(call, mask, ctx)
            outs = [run_plan(call, plan, ctx) for plan in plans]  # (R, H, Lq, Dv) each
            out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)  # (B, H, Lq, Dv)
        return propagate_nan_queries(out, call.q)  # SDPA's unmasked pieces give 0 for a NaN query


def _run_relative(call: AttentionCall, groups: list[HeadGroup]) -> torch.Tensor:
    """Each head group as key-row calls, or its pieces on SDPA's fused kernel with their table slice as the
    float mask, or (training, softcap, or half precision off the CPU) as one tiled call: ``(B, H, Lq, Dv)``."""
    k, v = (expand_kv(t, call.num_heads) for t in (call.k, call.v))  # (B, H, Lk, D|Dv)
    on_sdpa = _relative_on_sdpa(call)
    outs = [_sdpa_key_row(call, g, k, v) if g.key_row
            else torch.cat([_sdpa_piece(call, g, p, k, v) for p in g.pieces], dim=2) if on_sdpa
            else tiled_attention(call.q[:, g.heads], k[:, g.heads], v[:, g.heads], g.pieces, g.terms, scale=call.scale,
                                 dropout_p=call.dropout_p, softcap=call.softcap)
            for g in groups]  # (B, h, Lq, Dv) each
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)  # (B, H, Lq, Dv)
    if not on_sdpa:  # the tiled kernel gives empty rows 0 itself; key rows have none (causal, Lq = Lk)
        return out
    empty = groups[0].table.empty_rows()  # (Lq,) queries that see no key, or None
    return out if empty is None else out.masked_fill(empty.to(out.device)[:, None], 0.0)


def _offset_pieces_on_sdpa(call: AttentionCall) -> bool:
    """Whether the call takes the offset table's SDPA pieces, told without reading tensors: a relative bias,
    an offset-only mask (or none) and default positions (:func:`relative_groups` confirms when it runs)."""
    bias, prepared = call.bias, call.prepared
    if not (isinstance(bias, StructuredBias) and bias.relative and _relative_on_sdpa(call)):
        return False
    if prepared is None:
        return call.default_positions
    return not prepared.is_tensor and prepared.default_positions and prepared.spec.offsets() is not None


def _relative_on_sdpa(call: AttentionCall) -> bool:
    """Offset-table pieces run on SDPA for prefill-sized calls (at least one piece of :data:`BLOCK` queries):
    no softcap, float32 queries, or half precision on the CPU (its kernel takes a float32 mask with them).
    The rest stays on the tiled kernel: float64 (SDPA's float64 path sums less exactly), a few query rows
    (a single row's scores are more exact there, issue 21 item 12) and calls that need gradients (SDPA's
    backward with a float mask took 2-3x the tiled kernel's on CPU: 0.32x vs 0.63x SDPA causal at N = 2048)."""
    half = call.q.dtype in (torch.float16, torch.bfloat16)
    dtype_ok = call.q.dtype == torch.float32 or (half and call.q.device.type == "cpu")
    return call.softcap is None and dtype_ok and call.q_len >= BLOCK and not _trains(call)


def _key_row_rule(call: AttentionCall) -> KeyRowRule | None:
    """How heads may run as causal calls with their key row (:func:`~attnkit.backends.relative.key_row`), None
    for not at all: on the CPU, whose fused kernel takes a float mask beside its causal flag and has a
    backward, in float32 (or half precision) from :data:`BLOCK` queries on, without dropout or softcap.

    - With autograd one segment (the segments' merge reads the kernel's log-sum-exp, which its backward does
      not differentiate): forward+backward then costs what SDPA's causal kernel does (measured 38.8 vs 38.4 ms
      at N = 2048, H = 2, where the tiled kernel took 66.4 ms).
    - Half precision inference: one segment spanning up to HALF_KEY_ROW_SPAN, so usually every head in one
      call; with AMX tiles no limit on the fall per kernel block (steep heads' subnormal weights cost nothing
      measurable there: slope 1/4 ran 1.17x the causal kernel's time in bfloat16, 1.04x in float16, at N = 512,
      where the offset table's pieces took 1.5x).
    - float32 inference: up to KEY_ROW_SEGMENTS, from :data:`KEY_ROW_MIN_QUERIES` queries on (below, the offset
      table's pieces are faster)."""
    half = call.q.dtype in (torch.float16, torch.bfloat16)
    if not (call.q.device.type == "cpu" and call.dropout_p == 0 and call.softcap is None and call.q_len >= BLOCK
            and (half or call.q.dtype == torch.float32)
            and hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu")):
        return None
    if torch.is_grad_enabled() and any(t.requires_grad for t in (call.q, call.k, call.v)):
        return KeyRowRule(1)
    if half:
        return KeyRowRule(1, HALF_KEY_ROW_SPAN, None) if _amx() else KeyRowRule(1, HALF_KEY_ROW_SPAN)
    return KeyRowRule(KEY_ROW_SEGMENTS) if call.q_len >= KEY_ROW_MIN_QUERIES else None


@functools.cache
def _amx() -> bool:
    """Whether this CPU has AMX tiles (asked on first use, never at import)."""
    return bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)())


def _sdpa_key_row(call: AttentionCall, group: HeadGroup, k, v) -> torch.Tensor:
    """A key-row head group on SDPA's fused CPU kernel, ``(B, h, Lq, Dv)``: per query segment ``[a, b)``, one
    call on the diagonal block with the causal flag (the kernel skips key blocks above the diagonal) and one
    on the keys before it, merged by their log-sum-exp; the ``(1, h, 1, lk)`` key row, less the segment's
    middle value (so its entries stay small), is the float mask. The public SDPA refuses a mask beside
    ``is_causal``; the kernel itself takes both."""
    kernel = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    q, k, v = call.q[:, group.heads], k[:, group.heads], v[:, group.heads]  # (B, h, L, D|Dv)
    outs = []
    for a, b, seg in segment_rows(call, group.heads, group.key_row):  # seg (h, Lk) centred on [a, b)'s block
        out, lse = kernel(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], 0.0, True,
                          attn_mask=seg[None, :, None, a:b], scale=call.scale)  # (B, h, lq, Dv), (B, h, lq)
        if a > 0:  # the keys before the block: every query of the segment sees them all
            before, lse_before = kernel(q[:, :, a:b], k[:, :, :a], v[:, :, :a], 0.0, False,
                                        attn_mask=seg[None, :, None, :a], scale=call.scale)
            total = torch.logaddexp(lse, lse_before)  # (B, h, lq)
            out = out * (lse - total).exp_()[..., None] + before * (lse_before - total).exp_()[..., None]
        outs.append(out)
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)  # (B, h, Lq, Dv)


def _trains(call: AttentionCall) -> bool:
    """Whether autograd will ask for gradients of q, k or v."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in (call.q, call.k, call.v))


def _sdpa_piece(call: AttentionCall, group: HeadGroup, piece: Piece, k, v) -> torch.Tensor:
    """One piece of queries of a head group against its key range: ``(B, h, lq, Dv)``, its bias and mask the
    ``(1, h, lq, lk)`` table slice (SDPA adds it to the scores; no Lq x Lk tensor, no block above reach)."""
    q = call.q[:, group.heads, piece.q_lo:piece.q_hi]  # (B, h, lq, D)
    if piece.mode == "empty":
        return q.new_zeros(*q.shape[:3], v.shape[-1])
    (lo, hi), = piece.kv
    terms = group.terms(piece, slice(None), slice(None))  # (1, h, lq, lk)
    return F.scaled_dot_product_attention(q, k[:, group.heads, lo:hi], v[:, group.heads, lo:hi], attn_mask=terms,
                                          dropout_p=call.dropout_p, scale=call.scale)  # (B, h, lq, Dv)


def _mask_and_context(call: AttentionCall) -> tuple[MaskSpec | None, MaskContext]:
    """The call's mask spec and the context it is bound to (the prepared mask's; positions for no mask)."""
    if call.prepared is not None:
        return call.prepared.spec, call.prepared.ctx
    return None, context_for(MaskSpec(), *call.positions(), batch=call.batch)


def make_plans(call: AttentionCall, mask: MaskSpec | None = None, ctx: MaskContext | None = None) -> list[Plan]:
    """One plan for the whole batch, or one per row when the mask data or positions differ across rows; kept
    in the prepared mask's memo (every layer of a forward shares the plans)."""
    if ctx is None:
        mask, ctx = _mask_and_context(call)
    if call.prepared is None:
        return _make_plans(call, mask, ctx)
    return call.prepared.memo(("blocksparse", _allow_causal(call), call.batch), lambda: _make_plans(call, mask, ctx))


def _allow_causal(call: AttentionCall) -> bool:
    """SDPA pieces (and their causal flag) serve calls without a bias or softcap; the rest run tiled."""
    return call.bias is None and call.softcap is None


def _make_plans(call: AttentionCall, mask: MaskSpec | None, ctx: MaskContext) -> list[Plan]:
    allow_causal = _allow_causal(call)
    per_row = call.batch > 1 and ((mask is not None and mask.batch > 1) or not _rows_share_positions(call))
    dev, fn = call.q.device, None if call.prepared is None else call.prepared.fn  # bound once per prepared mask
    if not per_row:
        return [make_plan(mask, ctx, torch.arange(call.batch, device=dev), allow_causal=allow_causal, fn=fn,
                          min_piece=MIN_PIECE)]
    return [make_plan(mask, ctx, torch.tensor([b], device=dev), allow_causal=allow_causal, fn=fn,
                      min_piece=MIN_PIECE) for b in range(call.batch)]


def _rows_share_positions(call: AttentionCall) -> bool:
    return all(p is None or p.shape[0] == 1 for p in (call.q_positions, call.kv_positions))


def run_plan(call: AttentionCall, plan: Plan, ctx: MaskContext) -> torch.Tensor:
    """Execute a plan for its batch rows: ``(R, H, Lq, Dv)``. Masked pieces evaluate the prepared mask's bound
    function (``call.prepared.fn``) on their indices."""
    rows = plan.rows
    whole = rows.numel() == call.batch
    q, k, v = (t if whole else t[rows] for t in (call.q, call.k, call.v))  # (R, H|Hkv, L, D)
    if plan.q_perm is not None:
        q = q[:, :, plan.q_perm]  # (R, H, Lq, D) in plan order
        k, v = k[:, :, plan.kv_perm], v[:, :, plan.kv_perm]  # (R, Hkv, Lk, D)
    q_map = plan.q_perm if plan.q_perm is not None else torch.arange(plan.q_len, device=q.device)
    kv_map = plan.kv_perm if plan.kv_perm is not None else torch.arange(plan.kv_len, device=q.device)
    if not _allow_causal(call):
        k, v = (expand_kv(t, call.num_heads) for t in (k, v))  # (R, H, Lk, D|Dv)
        out = tiled_attention(q, k, v, plan.pieces, lambda piece, rs, hs: _piece_terms(
            call, piece, rows[rs], hs, ctx, q_map, kv_map), scale=call.scale, dropout_p=call.dropout_p,
            softcap=call.softcap)
    else:
        out = run_groups(call, plan, q, k, v, q_map, kv_map)  # (R, H, Lq, Dv) in plan order
    if plan.q_perm is not None:
        out = out[:, :, torch.argsort(plan.q_perm)]  # (R, H, Lq, Dv) in index order
    return out


def _piece_terms(call, piece, rows, heads, ctx, q_map, kv_map) -> torch.Tensor:
    """The additive term of one piece for batch rows ``rows (r,)`` and heads ``heads`` (a slice): the bias
    (0 without one), ``-inf`` where the mask forbids; ``(r|1, h|1, lq, lk)`` float32 (float64 for float64
    inputs)."""
    q_idx, kv_idx = piece_index([piece], rows.device)
    q_idx, kv_idx = q_map[q_idx[0]], kv_map[kv_idx[0]]  # (lq,), (lk,) call indices
    if call.bias is None:  # softcap without a bias: only the mask's -inf
        bias = torch.zeros(1, 1, q_idx.numel(), kv_idx.numel(), device=rows.device)  # (1, 1, lq, lk)
    elif isinstance(call.bias, StructuredBias):
        h = torch.arange(call.num_heads, device=rows.device)[heads].view(1, -1, 1, 1)  # (1, h, 1, 1)
        q_pos = ctx.q_positions[rows][:, q_idx][:, None, :, None]  # (r, 1, lq, 1)
        kv_pos = ctx.kv_positions[rows][:, kv_idx][:, None, None, :]  # (r, 1, 1, lk)
        bias = call.bias.score(h, q_pos, kv_pos, b=rows.view(-1, 1, 1, 1))  # (r, h, lq, lk)
    else:
        full = call.bias if call.bias.dim() == 4 else call.bias.reshape(
            (1,) * (4 - call.bias.dim()) + tuple(call.bias.shape))  # (B|1, H|1, Lq|1, Lk|1)
        full = full if full.shape[0] == 1 else full[rows]
        full = full if full.shape[1] == 1 else full[:, heads]
        full = full.expand(-1, -1, call.q_len, call.kv_len)  # (r|1, h|1, Lq, Lk) view
        bias = full[:, :, q_idx[:, None], kv_idx[None, :]]  # (r|1, h|1, lq, lk)
    bias = bias.to(torch.float64 if call.q.dtype == torch.float64 else torch.float32)
    if piece.mode == "mask":
        prepared = call.prepared
        allowed = evaluate_on(prepared.fn, rows, q_idx[None], kv_idx[None], prepared.heads)[0]  # (r|1, H|1, lq, lk)
        allowed = allowed if allowed.shape[1] == 1 else allowed[:, heads]
        bias = bias.masked_fill(~allowed, float("-inf"))
    top = bias.amax(dim=-1, keepdim=True)  # (r|1, h|1, lq, 1): a row's constant offset, which softmax ignores
    return bias - top.masked_fill(~torch.isfinite(top), 0.0)  # removed, so it can't eat the scores' precision

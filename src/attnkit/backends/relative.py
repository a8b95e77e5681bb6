"""Masks and biases that depend only on the key-query offset: one small table serves every piece.

With consecutive positions (the default), a mask that allows an interval of offsets ``d = kv_pos - q_pos``
(causal: ``d <= 0``; sliding window W: ``1 - W <= d <= 0``; see :meth:`MaskSpec.offsets`) and a relative
bias (ALiBi: ``-m_h |d|``), the additive term of queries ``[a, b)`` against keys ``[lo, hi)`` is a slice of
one Toeplitz table ``T[h, r, x] = term(h, d = x - r + d0)`` of shape ``(h, BLOCK, X)`` per group of heads. The
tiled kernel then reads slices instead of evaluating the bias and the mask per piece. A group's table holds
``h x BLOCK x (span + BLOCK)`` entries, where ``span`` is the number of offsets its heads can see (at most
Lq + Lk): it does not grow with Lq x Lk.

Keys the kernel's cutoff would zero anyway are skipped: a query's scores differ by at most
``2 * scale * max|q| * max|k|`` from its score at offset 0 (always visible here), so where a decaying bias
(ALiBi) has fallen below ``-(CUTOFF + that)``, the weight is exactly 0 either way. ALiBi heads with steep
slopes thus reach only a few hundred keys back; heads are grouped by how far they reach.

Shape legend: B batch, H heads, Lq/Lk lengths, lq/lk a piece's query/key counts, X table columns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from attnkit._bias import StructuredBias
from attnkit._validation import AttentionCall
from attnkit.backends.block_plan import Piece
from attnkit.backends.tiled import CUTOFF, Terms
from attnkit.masks import MaskSpec

BLOCK = 128  # queries per piece (measured best of 32..256 for the tiled kernel at N = 4096)

Interval = tuple[int | None, int | None]


@dataclass
class HeadGroup:
    """Heads ``heads`` (a slice) run as one tiled call with these pieces and terms."""

    heads: slice
    pieces: list[Piece]
    terms: Terms


def relative_groups(call: AttentionCall, mask: MaskSpec | None) -> list[HeadGroup] | None:
    """The head groups of an offset-only call, or None when the call isn't one (bias not relative, mask not
    an offset interval, positions not consecutive or not shared by the batch rows)."""
    if not (isinstance(call.bias, StructuredBias) and call.bias.relative):
        return None
    interval = (None, None) if mask is None else mask.offsets()
    if interval is None:
        return None
    q_pos, kv_pos = call.positions()
    q0, k0 = _consecutive_start(q_pos), _consecutive_start(kv_pos)
    if q0 is None or k0 is None:
        return None
    base = k0 - q0  # d = base + j - i for query index i and key index j
    per_head = _head_intervals(call, interval, base)  # one interval per head
    groups, h0 = [], 0
    for h in range(1, call.num_heads + 1):
        if h == call.num_heads or per_head[h] != per_head[h0]:
            heads = slice(h0, h)
            pieces = _pieces(per_head[h0], base, call.q_len, call.kv_len)
            groups.append(HeadGroup(heads, pieces, OffsetTable(call, interval, per_head[h0], base, heads).terms))
            h0 = h
    return groups


def describe(groups: list[HeadGroup], call: AttentionCall) -> str:
    work = sum((g.heads.stop - g.heads.start) * p.lq * p.lk for g in groups for p in g.pieces)
    work /= max(1, call.num_heads * call.q_len * call.kv_len)
    pruned = f", {len(groups)} head groups by how far their bias reaches" if len(groups) > 1 else ""
    return (f"tiled kernel, {len(groups[0].pieces)} query pieces against the keys their offsets allow, bias "
            f"from an offset table{pruned}; computes {100 * work:.1f}% of the Lq x Lk entries")


def _head_intervals(call: AttentionCall, interval: Interval, base: int) -> list[Interval]:
    """The mask's interval per head, narrowed to the bias's reach where every query sees offset 0."""
    d_lo, d_hi = interval
    sees_zero = (d_lo is None or d_lo <= 0) and (d_hi is None or d_hi >= 0) and base <= 0 \
        and call.q_len - 1 - base < call.kv_len  # key j = i - base exists for every query i
    if not sees_zero:
        return [interval] * call.num_heads
    with torch.no_grad():
        dtype = torch.promote_types(call.q.dtype, torch.float32)  # norms without a float32 copy of q and k
        q_norm = torch.linalg.vector_norm(call.q.detach(), dim=-1, dtype=dtype).amax(dim=(0, 2))  # (H,)
        k_norm = torch.linalg.vector_norm(call.k.detach(), dim=-1, dtype=dtype).amax(dim=(0, 2))  # (Hkv,)
        k_norm = k_norm.repeat_interleave(call.num_heads // call.num_kv_heads)  # (H,)
        margin = CUTOFF + 2 * call.scale * q_norm * k_norm  # (H,) most a score can rise above offset 0's
        reach = call.bias.reach(margin)
    if reach is None:
        return [interval] * call.num_heads
    out = []
    for r in reach.tolist():
        if not math.isfinite(r):
            out.append(interval)
            continue
        r = math.ceil(r)  # beyond r keys the weight is exactly 0 after the cutoff
        out.append((-r if d_lo is None else max(d_lo, -r), r if d_hi is None else min(d_hi, r)))
    return out


def _pieces(interval: Interval, base: int, Lq: int, Lk: int) -> list[Piece]:
    d_lo, d_hi = interval
    pieces = []
    for a in range(0, Lq, BLOCK):
        b = min(a + BLOCK, Lq)
        lo = 0 if d_lo is None else max(0, a - base + d_lo)  # the first row's lowest allowed key
        hi = Lk if d_hi is None else min(Lk, b - 1 - base + d_hi + 1)  # the last row's highest, exclusive
        pieces.append(Piece(a, b, ((lo, hi),), "mask") if hi > lo else Piece(a, b, (), "empty"))
    return pieces


class OffsetTable:
    """The table of heads ``heads``: ``T (h, BLOCK, X)``, ``T[h, r, x] = bias(h, d)`` where the mask allows
    offset ``d = x - r + d0`` (``interval``), else ``-inf``. Its columns cover the offsets ``reach`` (the heads'
    pruned interval) lets the pieces read. Built on first use (``ak.explain`` plans without it).
    """

    def __init__(self, call: AttentionCall, interval: Interval, reach: Interval, base: int, heads: slice):
        self.call, self.interval, self.base, self.heads = call, interval, base, heads
        d_lo, d_hi = reach
        first, last = base - (call.q_len - 1), base + call.kv_len - 1  # offsets of the corner entries
        # BLOCK spare columns on the left: a piece cut into runs of rows (tiled.split_rows) starts its later
        # runs up to BLOCK - 1 rows lower in the table, against the same first key
        self.d0 = (first if d_lo is None else max(d_lo, first)) - BLOCK
        self.width = max(0, (last if d_hi is None else min(d_hi, last)) - self.d0 + 1) + BLOCK
        self._table: torch.Tensor | None = None

    def terms(self, piece: Piece, rows: slice, heads: slice) -> torch.Tensor:
        """The term of ``piece`` for ``heads`` (of this group; batch rows share it): ``(1, h, lq, lk)`` view."""
        x0 = self.base + piece.kv[0][0] - piece.q_lo - self.d0
        assert x0 >= 0 and x0 + piece.lk <= self.width, "piece outside the offset table"
        return self.table[None, heads, :piece.lq, x0:x0 + piece.lk]

    @property
    def table(self) -> torch.Tensor:
        if self._table is None:
            call, dev = self.call, self.call.q.device
            dtype = torch.float64 if call.q.dtype == torch.float64 else torch.float32
            rows = torch.arange(min(BLOCK, call.q_len), device=dev)
            d = torch.arange(self.width, device=dev)[None, :] - rows[:, None] + self.d0  # (BLOCK, X)
            h = torch.arange(self.heads.start, self.heads.stop, device=dev)[:, None, None]  # (h, 1, 1)
            table = call.bias.score(h, torch.zeros((), dtype=torch.int64, device=dev), d[None])  # (h, BLOCK, X)
            d_lo, d_hi = self.interval
            allowed = torch.ones_like(d, dtype=torch.bool)
            if d_lo is not None:
                allowed &= d >= d_lo
            if d_hi is not None:
                allowed &= d <= d_hi
            table = table.to(dtype)
            table = table - table.amax(dim=(1, 2), keepdim=True)  # a head's constant offset can't eat the scores' precision
            self._table = table.masked_fill(~allowed, float("-inf"))
        return self._table


def _consecutive_start(pos: torch.Tensor) -> int | None:
    """``p0`` when every batch row of ``pos (B|1, L)`` is ``p0 + arange(L)``, else None."""
    start = pos[:1, :1]  # (1, 1)
    expected = start + torch.arange(pos.shape[-1], device=pos.device)[None, :]  # (1, L)
    return int(start) if bool((pos == expected).all()) else None

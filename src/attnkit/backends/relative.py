"""Masks and biases that depend only on the key-query offset: one small table serves every piece.

With consecutive positions (the default), a mask that allows an interval of offsets ``d = kv_pos - q_pos``
(causal: ``d <= 0``; sliding window W: ``1 - W <= d <= 0``; see :meth:`MaskSpec.offsets`) and a relative
bias (ALiBi: ``-m_h |d|``), the additive term of queries ``[a, b)`` against keys ``[lo, hi)`` is a slice of
one Toeplitz table ``T[h, r, x] = term(h, d = x - r + d0)`` of shape ``(h, BLOCK, X)`` per group of heads. The
tiled kernel then reads slices instead of evaluating the bias and the mask per piece. A group's table holds
``h x BLOCK x (span + BLOCK)`` entries, where ``span`` is the number of offsets its heads can see (at most
Lq + Lk): it does not grow with Lq x Lk.

Under a causal mask with Lq = Lk, a bias linear in the offset (ALiBi: ``-m_h (i - j) = m_h j - m_h i``) is a
row of key terms ``m_h j`` up to the per-row constant, which softmax ignores: heads whose row spans at most
:data:`KEY_ROW_SPAN` run as one call of SDPA's fused CPU kernel with its causal flag (which skips the key blocks
above the diagonal) and that ``(1, h, 1, Lk)`` row as the float mask, no pieces (see ``key_row``).

Keys the kernel's cutoff would zero anyway are skipped: a query's scores differ by at most
``2 * scale * max|q| * max|k|`` from its score at offset 0 (always visible here), so where a decaying bias
(ALiBi) has fallen below ``-(CUTOFF + that)``, the weight is exactly 0 either way (on SDPA, which cuts
nothing: below ``-(REACH_CUTOFF + that)``, a weight far below float32's resolution). ALiBi heads with steep
slopes thus reach only a few hundred keys back; heads are grouped by how far they reach.

Shape legend: B batch, H heads, Lq/Lk lengths, lq/lk a piece's query/key counts, X table columns.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch

from attnkit._bias import StructuredBias
from attnkit._validation import AttentionCall
from attnkit.backends.block_plan import Piece
from attnkit.backends.tiled import CUTOFF
from attnkit.masks import MaskSpec

BLOCK = 128  # queries per piece (measured best of 32..256 for the tiled kernel at N = 4096)
#: reaches are rounded up to a multiple of this (layers share tables; a coarser step lets more weights below
#: e^-87 reach the kernel, where float32 turns subnormal and x86 cores slow down ~100x per operation)
REACH_STEP = 32
#: on SDPA (float32 and half precision), keys whose bias has fallen this far below offset 0's (beyond what the
#: scores can add back) are skipped: each weighs < e^-30 (1e-13) of offset 0's key, a tail below 1e-9 of the
#: row's mass even over 10^4 keys, far under float32's rounding; closer than the tiled kernel's CUTOFF (60, which
#: it uses: float64 would see the difference) so that SDPA's kernels, which cut nothing, see fewer weights in
#: float32's subnormal range (< e^-87): slope 1/4 at N = 1024 ran 1.9x the causal kernel's time per head with
#: 60, 0.9x with 30
REACH_CUTOFF = 30.0
#: what the scores can add (``2 * scale * max|q| * max|k|``) is rounded up to a multiple of this before the reach
#: is looked up (layers share it; at most MARGIN_STEP / slope more keys)
MARGIN_STEP = 2.0
#: a kernel call's fixed cost in score entries: heads join a group (computing keys beyond their reach, as -inf)
#: when that costs less than calls of their own (measured on ALiBi causal at N = 512-4096: 65536 beat 8192 by
#: 4-9% and one group for all heads by up to 27%)
CALL_ENTRIES = 65536
#: the largest offset table kept in a prepared mask's memo (H x BLOCK x ~(Lq + Lk) floats); larger ones are
#: built per call (their cost is still O(Lq + Lk) per head, small beside the attention itself)
TABLE_MEMO_BYTES = 64 << 20
#: the most a key row (``m_h j`` over a call's keys, centred) may span in one call: its float32 scores then hold
#: values as large as the table's (measured against the float64 oracle: spans of 16 and 32 kept the error near
#: the float32 reference's, 64 exceeded the oracle rule at N = 300, D = 16, 256 gave ~8x the reference's error)
KEY_ROW_SPAN = 32.0
#: a longer row is cut into up to this many query segments (a causal call on each diagonal block plus one on the
#: keys before it, merged by their log-sum-exp), each with a row of at most KEY_ROW_SPAN. Steeper heads stay on
#: the offset table: their bias would push weights into float32's subnormal range (below e^-87), where x86
#: matrix products slow down (measured: slope 1/4 ran at 0.41-0.50x the causal kernel at N = 1024-4096)
KEY_ROW_SEGMENTS = 4
#: in half precision (inference) a key row may span this much in one call: float32's rounding of the row then
#: moves a weight by at most 2048 * 2^-24 (1.2e-4 relative), an eighth of float16's resolution
HALF_KEY_ROW_SPAN = 4096.0
#: keys per block of SDPA's fused CPU kernel: a head's bias may fall at most 2 * KEY_ROW_SPAN across one block,
#: so that weights stay out of the subnormal range inside it (slope 1/4 at N = 512, a fall of 128, ran 1.6x the
#: causal kernel's time per head)
KERNEL_KEY_BLOCK = 512

Interval = tuple[int | None, int | None]
T = TypeVar("T")


@dataclass
class HeadGroup:
    """Heads ``heads`` (a slice) run as one call with these pieces; their terms are slices of ``table``."""

    heads: slice
    pieces: list[Piece]
    table: OffsetTable
    #: > 0: the heads run as causal calls with their :func:`key_row` as the float mask (SDPA on the CPU), the
    #: queries cut into this many segments
    key_row: int = 0

    def terms(self, piece: Piece, rows: slice, heads: slice) -> torch.Tensor:
        """:data:`~attnkit.backends.tiled.Terms` of the group: ``(1, h, lq, lk)``, ``heads`` within the group."""
        start, stop, _ = heads.indices(self.heads.stop - self.heads.start)
        return self.table.terms(piece, slice(self.heads.start + start, self.heads.start + stop))


@dataclass(frozen=True)
class KeyRowRule:
    """Which heads may run as causal calls with their key row (:func:`key_row`): those whose row spans at most
    ``span`` in each of at most ``segments`` query segments and falls at most ``block_fall`` across one kernel
    block of :data:`KERNEL_KEY_BLOCK` keys (None: no limit, where weights in the subnormal range cost nothing
    measurable)."""

    segments: int
    span: float = KEY_ROW_SPAN
    block_fall: float | None = 2 * KEY_ROW_SPAN


def relative_groups(call: AttentionCall, mask: MaskSpec | None, sdpa: bool = False,
                    key_rows: KeyRowRule | None = None) -> list[HeadGroup] | None:
    """The head groups of an offset-only call, or None when the call isn't one (bias not relative, mask not
    an offset interval, positions not consecutive or not shared by the batch rows). ``sdpa``: the pieces run
    on SDPA (keys beyond :data:`REACH_CUTOFF` skipped, not the tiled kernel's CUTOFF); ``key_rows``: the caller
    can run heads as causal calls with a key row (:func:`key_row`) under this rule; heads that qualify get
    groups of their own marked with their segment count."""
    if not (isinstance(call.bias, StructuredBias) and call.bias.relative):
        return None
    interval = (None, None) if mask is None else mask.offsets()
    if interval is None:
        return None
    # the prepared mask fixes the positions: every layer of a forward reads the starts once found
    q0, k0 = _starts(call) if call.prepared is None else call.prepared.memo("consecutive_starts", lambda: _starts(call))
    if q0 is None or k0 is None:
        return None
    base = k0 - q0  # d = base + j - i for query index i and key index j
    rows = (0,) * call.num_heads if key_rows is None else _bias_memo(
        call, ("key_row_heads", interval, base, key_rows), lambda: _key_row_heads(call, interval, base, key_rows))
    per_head = _head_intervals(call, interval, base, REACH_CUTOFF if sdpa else CUTOFF, rows)  # one per head
    table = OffsetTable(call, interval, per_head, base)  # every group reads its heads' slices of one table
    layout = _layout(call, base, per_head, rows) if call.prepared is None else call.prepared.memo(
        ("relative_layout", base, tuple(per_head), rows),
        lambda: _layout(call, base, per_head, rows))  # the prepared mask fixes Lq, Lk
    return [HeadGroup(heads, pieces, table, rows[heads.start]) for heads, pieces in layout]


def _layout(call: AttentionCall, base: int, per_head: list[Interval],
            rows: tuple[int, ...]) -> list[tuple[slice, list[Piece]]]:
    """Heads grouped (consecutive) with the pieces each group runs: a head joins the group before it when
    both run alike (``rows``: as key-row calls in as many segments, or not) and computing the group's wider
    key ranges costs no more than calls of its own; consecutive key-row heads with as many segments join."""
    groups: list[tuple[int, int, Interval]] = []  # (first head, end head, the interval their pieces cover)
    for h, iv in enumerate(per_head):
        if groups and rows[groups[-1][0]] == rows[h]:
            h0, _, wide = groups[-1]
            merged = _cost(call, base, h + 1 - h0, _union(wide, iv))
            if rows[h] or merged <= _cost(call, base, h - h0, wide) + _cost(call, base, 1, iv):  # costs no more
                groups[-1] = (h0, h + 1, _union(wide, iv))
                continue
        groups.append((h, h + 1, iv))
    return [(slice(h0, h1), _pieces(iv, base, call.q_len, call.kv_len)) for h0, h1, iv in groups]


def _key_row_heads(call: AttentionCall, interval: Interval, base: int, rule: KeyRowRule) -> tuple[int, ...]:
    """Per head: the query segments it needs to run as causal calls with its key row (0: it can't), exactly:
    the mask is causal (every key at or before the query), queries and keys are the same positions (the
    kernel's causal flag aligns top-left), the bias is linear there, and its row keeps to ``rule`` (the
    caller asks one segment for half precision, whose merge would round each segment's output first, and for
    autograd)."""
    d_lo, d_hi = interval
    causal = d_hi == 0 and (d_lo is None or d_lo <= 1 - call.kv_len)
    if not (call.bias.causal_linear and causal and base == 0 and call.q_len == call.kv_len):
        return (0,) * call.num_heads
    row = key_row(call)  # (H, Lk)
    out = []
    for span in (row.amax(-1) - row.amin(-1)).tolist():
        segments = max(1, math.ceil(span / rule.span))
        block_fall = span * min(1.0, KERNEL_KEY_BLOCK / max(1, call.kv_len - 1))  # across one kernel block
        fits = segments <= rule.segments and (rule.block_fall is None or block_fall <= rule.block_fall)
        out.append(segments if fits else 0)
    return tuple(out)


def key_row(call: AttentionCall) -> torch.Tensor:
    """``(H, Lk)`` float32: the bias of the last query against every key, ``score(h, Lk - 1, j)`` (ALiBi:
    ``-m_h (Lk - 1 - j)``). For a causal-linear bias (:attr:`~attnkit._bias.StructuredBias.causal_linear`) with
    Lq = Lk and consecutive positions, query i's bias against key j <= i is this row's entry j plus a constant
    of the row; kept in the prepared mask's memo when the bias has a :meth:`memo_key`."""
    def build() -> torch.Tensor:
        dev = call.q.device
        h = torch.arange(call.num_heads, device=dev)[:, None]  # (H, 1)
        j = torch.arange(call.kv_len, device=dev)[None, :]  # (1, Lk)
        return call.bias.score(h, torch.full((), call.kv_len - 1, device=dev), j).float()  # (H, Lk)
    return _bias_memo(call, ("key_row",), build)


def segment_rows(call: AttentionCall, heads: slice, segments: int) -> list[tuple[int, int, torch.Tensor]]:
    """The key rows of ``heads`` cut into ``segments`` query segments ``[a, b)``: ``(a, b, (h, Lk))``, each row
    less its segment's middle value (the bias at the diagonal block's ends averaged), so that its entries stay
    small. Kept in the prepared mask's memo beside :func:`key_row` (a mask built per call made the kernel call
    itself 5-7% slower than one it had read before, bfloat16 at N = 512)."""
    def build() -> list[tuple[int, int, torch.Tensor]]:
        row = key_row(call)[heads]  # (h, Lk)
        size, out = -(-call.q_len // segments), []
        for a in range(0, call.q_len, size):
            b = min(a + size, call.q_len)
            out.append((a, b, row - (row[:, a:a + 1] + row[:, b - 1:b]) / 2))  # (h, Lk)
        return out
    return _bias_memo(call, ("segment_rows", heads.start, heads.stop, segments), build)


def _bias_memo(call: AttentionCall, key: tuple, build: Callable[[], T]) -> T:
    """``build()`` kept in the prepared mask's memo under ``key`` and the bias's memo key (the prepared mask
    fixes Lq, Lk, the positions and the device; the bias's key what it scores); built per call without a
    prepared mask or when the bias can't say what it is."""
    bias_key = call.bias.memo_key()
    return build() if call.prepared is None or bias_key is None else call.prepared.memo((*key, bias_key), build)


def _union(a: Interval, b: Interval) -> Interval:
    """The smallest interval holding both (None: unbounded on that side)."""
    lo = None if a[0] is None or b[0] is None else min(a[0], b[0])
    hi = None if a[1] is None or b[1] is None else max(a[1], b[1])
    return lo, hi


def _cost(call: AttentionCall, base: int, heads: int, interval: Interval) -> int:
    """Score entries ``heads`` heads compute on the pieces of ``interval``, plus a call's fixed cost per piece."""
    pieces = _pieces(interval, base, call.q_len, call.kv_len)
    return heads * sum(p.lq * p.lk for p in pieces) + CALL_ENTRIES * len(pieces)


def describe(groups: list[HeadGroup], call: AttentionCall, sdpa: bool = False) -> str:
    """What :func:`relative_groups` planned, for ``ak.explain`` (``sdpa``: the pieces run on SDPA)."""
    rows = sum(g.heads.stop - g.heads.start for g in groups if g.key_row)
    rows_text = f"{rows} heads as causal SDPA calls with the bias as a row of key terms"
    table = [g for g in groups if not g.key_row]
    if not table:
        return f"{rows_text} (no offset table)"
    work = sum((g.heads.stop - g.heads.start) * p.lq * p.lk for g in table for p in g.pieces)
    work /= max(1, (call.num_heads - rows) * call.q_len * call.kv_len)
    pruned = f", {len(table)} head groups by how far their bias reaches" if len(table) > 1 else ""
    kernel = "SDPA with the table slice as its float mask" if sdpa else "tiled kernel"
    return (f"{kernel}, {len(table[0].pieces)} query pieces against the keys their offsets allow, bias from an "
            f"offset table{pruned}; computes {100 * work:.1f}% of the Lq x Lk entries" + (f"; {rows_text}" if rows else ""))


def _head_intervals(call: AttentionCall, interval: Interval, base: int, cutoff: float,
                    whole: tuple[int, ...]) -> list[Interval]:
    """The mask's interval per head, narrowed to the bias's reach (``cutoff`` beyond what the scores can add)
    where every query sees offset 0. Only heads whose reach may end inside the call (:func:`_may_cut`) read
    the norms of q and k; the rest, and heads in ``whole`` (key rows), keep the mask's interval."""
    d_lo, d_hi = interval
    H = call.num_heads
    sees_zero = (d_lo is None or d_lo <= 0) and (d_hi is None or d_hi >= 0) and base <= 0 \
        and call.q_len - 1 - base < call.kv_len  # key j = i - base exists for every query i
    cut = _may_cut(call, cutoff, whole) if sees_zero else []
    if not cut:  # no head's reach can end inside the call: the norms aren't read
        return [interval] * H
    heads, G = slice(cut[0], cut[-1] + 1), H // call.num_kv_heads  # the heads whose norms are read
    kv = slice(heads.start // G, (heads.stop - 1) // G + 1)  # their KV heads
    with torch.no_grad():
        dtype = torch.promote_types(call.q.dtype, torch.float32)  # norms without a float32 copy of q and k
        q_norm = torch.linalg.vector_norm(call.q[:, heads].detach(), dim=-1, dtype=dtype).amax(dim=(0, 2))  # (h,)
        k_norm = torch.linalg.vector_norm(call.k[:, kv].detach(), dim=-1, dtype=dtype).amax(dim=(0, 2))  # (hkv,)
        norms = torch.cat([q_norm, k_norm]).tolist()  # one read back: small host arithmetic from here
    margin = [cutoff] * H
    for h in range(heads.start, heads.stop):  # most a score can rise above offset 0's, rounded up (exact: a
        # wider reach only computes more) so that layers with similar norms share the memo's reach
        rise = 2 * abs(call.scale) * norms[h - heads.start] * norms[heads.stop - heads.start + h // G - kv.start]
        margin[h] += MARGIN_STEP * math.ceil(rise / MARGIN_STEP) if math.isfinite(rise) else math.inf
    reach = _reach(call, tuple(margin))
    if reach is None:
        return [interval] * H
    return [_narrow(call, interval, r) if h in cut else interval for h, r in enumerate(reach)]


def _reach(call: AttentionCall, margin: tuple[float, ...]) -> list[float] | None:
    """The bias's reach per head for ``margin`` (:meth:`~attnkit._bias.StructuredBias.reach`), kept in the
    prepared mask's memo when the bias has a memo key (a few tiny tensor operations per call otherwise)."""
    def build() -> list[float] | None:
        reach = call.bias.reach(torch.tensor(margin, dtype=torch.float64))  # (H,)
        return None if reach is None else reach.tolist()
    return _bias_memo(call, ("reach", margin), build)


def _narrow(call: AttentionCall, interval: Interval, r: float) -> Interval:
    """``interval`` cut to offsets within ``r`` of 0 (beyond, the weight is exactly 0 after the cutoff),
    ``r`` rounded up to a multiple of :data:`REACH_STEP` so that layers whose norms differ a little share
    the offset table (a wider reach only computes more, exactly); unchanged when ``r`` reaches every key."""
    if not math.isfinite(r) or r >= call.q_len + call.kv_len:
        return interval
    r = REACH_STEP * math.ceil(r / REACH_STEP)
    return -r if interval[0] is None else max(interval[0], -r), r if interval[1] is None else min(interval[1], r)


def _may_cut(call: AttentionCall, cutoff: float, whole: tuple[int, ...]) -> list[int]:
    """The heads, not in ``whole``, whose least reach (the scores adding nothing) ends before ``Lq + Lk``: only
    theirs can narrow. Narrowing also keeps far keys' weights out of float32's slow subnormal range (their
    table entries are -inf) where a group computes them for a wider head. Kept in the prepared mask's memo when
    the bias has a memo key (the prepared mask fixes Lq and Lk)."""
    def build() -> list[int]:
        floor = call.bias.reach(torch.full((call.num_heads,), cutoff, dtype=torch.float64))  # (H,)
        span = call.q_len + call.kv_len
        return [] if floor is None else [h for h, r in enumerate(floor.tolist()) if not whole[h] and r < span]
    return _bias_memo(call, ("reach_may_cut", cutoff, whole), build)


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
    """The table of all heads: ``T (H, BLOCK, X)``, ``T[h, r, x] = bias(h, d)`` where head h's interval
    (``per_head``: the mask's, narrowed to the bias's reach) allows offset ``d = x - r + d0``, else ``-inf``
    (so no weight falls into float32's slow subnormal range); each head's constant offset removed. Its columns cover
    every offset the mask allows between the call's queries and keys (a group's pruned pieces read inside it).
    Built on first use (``ak.explain`` plans without it), and kept in the prepared mask's memo when the bias
    can say what it is (:meth:`~attnkit._bias.StructuredBias.memo_key`) and the table is at most
    :data:`TABLE_MEMO_BYTES`: every layer of a forward reads the same table.
    """

    def __init__(self, call: AttentionCall, interval: Interval, per_head: list[Interval], base: int):
        self.call, self.interval, self.per_head, self.base = call, interval, per_head, base
        d_lo, d_hi = interval
        first, last = base - (call.q_len - 1), base + call.kv_len - 1  # offsets of the corner entries
        # BLOCK spare columns on the left: a piece cut into runs of rows (tiled.split_rows) starts its later
        # runs up to BLOCK - 1 rows lower in the table, against the same first key
        self.d0 = (first if d_lo is None else max(d_lo, first)) - BLOCK
        self.width = max(0, (last if d_hi is None else min(d_hi, last)) - self.d0 + 1) + BLOCK
        self._table: torch.Tensor | None = None

    def terms(self, piece: Piece, heads: slice) -> torch.Tensor:
        """The term of ``piece`` for ``heads`` (batch rows share it): a ``(1, h, lq, lk)`` view."""
        x0 = self.base + piece.kv[0][0] - piece.q_lo - self.d0
        assert x0 >= 0 and x0 + piece.lk <= self.width, "piece outside the offset table"
        return self.table[None, heads, :piece.lq, x0:x0 + piece.lk]

    def empty_rows(self) -> torch.Tensor | None:
        """``(Lq,)`` bool on the CPU: the queries the mask lets see no key (their output is 0), None when there
        are none; kept in the prepared mask's memo (it fixes Lq, Lk and the positions)."""
        if self.call.prepared is None:
            return self._empty_rows()
        return self.call.prepared.memo(("empty_rows", self.interval, self.base), self._empty_rows)

    def _empty_rows(self) -> torch.Tensor | None:
        d_lo, d_hi = self.interval
        i = torch.arange(self.call.q_len)  # (Lq,) key j = i - base + d sits at offset d
        lo = torch.zeros_like(i) if d_lo is None else (i - self.base + d_lo).clamp(min=0)  # lowest visible key
        hi = torch.full_like(i, self.call.kv_len - 1) if d_hi is None else (i - self.base + d_hi).clamp(
            max=self.call.kv_len - 1)  # highest
        empty = lo > hi  # (Lq,)
        return empty if bool(empty.any()) else None

    @property
    def table(self) -> torch.Tensor:
        if self._table is None:
            call = self.call
            dtype = torch.float64 if call.q.dtype == torch.float64 else torch.float32
            key = call.bias.memo_key()
            size = call.num_heads * min(BLOCK, call.q_len) * self.width * torch.finfo(dtype).bits // 8
            if call.prepared is None or key is None or size > TABLE_MEMO_BYTES:
                self._table = self._build(dtype)
            else:  # the prepared mask fixes Lq, Lk, the positions and the device; the key fixes the bias
                self._table = call.prepared.memo(("offset_table", tuple(self.per_head), self.base, dtype, key),
                                                 lambda: self._build(dtype))
        return self._table

    def _build(self, dtype: torch.dtype) -> torch.Tensor:
        call, dev = self.call, self.call.q.device
        rows = torch.arange(min(BLOCK, call.q_len), device=dev)
        d = torch.arange(self.width, device=dev)[None, :] - rows[:, None] + self.d0  # (BLOCK, X)
        h = torch.arange(call.num_heads, device=dev)[:, None, None]  # (H, 1, 1)
        table = call.bias.score(h, torch.zeros((), dtype=torch.int64, device=dev), d[None])  # (H, BLOCK, X)
        lo, hi = (torch.tensor([unbounded if b[i] is None else b[i] for b in self.per_head], device=dev)
                  for i, unbounded in ((0, -math.inf), (1, math.inf)))  # (H,) each head's allowed offsets
        allowed = (d[None] >= lo[:, None, None]) & (d[None] <= hi[:, None, None])  # (H, BLOCK, X)
        table = table.to(dtype)
        table = table - table.amax(dim=(1, 2), keepdim=True)  # a head's constant offset can't eat the scores' precision
        return table.masked_fill(~allowed, float("-inf"))


def _starts(call: AttentionCall) -> tuple[int | None, int | None]:
    """The first query and key positions when both run consecutively (see :func:`_consecutive_start`)."""
    q_pos, kv_pos = call.positions()
    return _consecutive_start(q_pos), _consecutive_start(kv_pos)


def _consecutive_start(pos: torch.Tensor) -> int | None:
    """``p0`` when every batch row of ``pos (B|1, L)`` is ``p0 + arange(L)``, else None."""
    start = pos[:1, :1]  # (1, 1)
    expected = start + torch.arange(pos.shape[-1], device=pos.device)[None, :]  # (1, L)
    return int(start) if bool((pos == expected).all()) else None

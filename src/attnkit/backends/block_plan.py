"""Planning block-sparse attention: which keys each run of queries must see, and how to batch the work.

From a mask's :class:`~attnkit.masks.blocks.BlockCover` (tiles of ``BLOCK`` queries x ``BLOCK`` keys), the
planner cuts the queries into pieces; each piece lists the key ranges its rows can reach and how the fused
kernel must treat them:

- ``"causal"``: the piece's keys are its own queries and the mask there is exactly lower-triangular (a
  causal document, the diagonal run of a causal mask, a residue class of a strided mask): SDPA's
  ``is_causal=True``, which skips the upper triangle;
- ``"none"``: every reachable key is visible to every row: no mask;
- ``"mask"``: the small ``(lq, lk)`` mask of the piece is evaluated and passed to the kernel.

Pieces whose rows reach no key produce zeros. Pieces of equal shape and mode are later stacked into one
kernel call, so a sliding window over 16k tokens is a handful of calls, not hundreds.

A strided mask (``strided(s)`` as a factor of an ``&``) is planned on queries and keys regrouped by
residue ``position % s``: in that order its allowed entries form dense (causal) squares.

Shape legend: R batch rows, Lq/Lk lengths (in plan order), nQ/nK tile counts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnkit.masks import BoundMask, MaskContext, MaskSpec
from attnkit.masks.blocks import BlockCover, BlockGrid, cover, evaluate_on

BLOCK = 64  # tile size (queries and keys)
MIN_PIECE = 256  # queries per piece at least (when mergeable): SDPA's CPU kernel is inefficient on small pieces
MAX_PIECE = 512  # queries per merged piece
MERGE_SLACK = 0.15  # beyond MIN_PIECE, merge query tiles while the extra (masked) work stays under 15%


@dataclass(frozen=True)
class Piece:
    """Queries ``[q_lo, q_hi)`` (plan order) against the keys in ``kv`` (plan-order ranges)."""

    q_lo: int
    q_hi: int
    kv: tuple[tuple[int, int], ...]
    mode: str  # "causal" | "none" | "mask" | "empty"

    @property
    def lq(self) -> int:
        return self.q_hi - self.q_lo

    @property
    def lk(self) -> int:
        return sum(hi - lo for lo, hi in self.kv)

    @property
    def work(self) -> float:
        """Entries computed (a causal square counts half)."""
        return self.lq * self.lk / (2 if self.mode == "causal" else 1)


@dataclass
class Plan:
    rows: torch.Tensor  # (R,) batch rows served
    q_perm: torch.Tensor | None  # (Lq,) plan order -> query index; None = identity
    kv_perm: torch.Tensor | None  # (Lk,)
    pieces: list[Piece]
    q_len: int
    kv_len: int

    def groups(self) -> dict[tuple[int, int, str], list[int]]:
        """Indices of the pieces that share (lq, lk, mode): each group is one kernel call."""
        out: dict[tuple[int, int, str], list[int]] = {}
        for i, p in enumerate(self.pieces):
            if p.mode != "empty":
                out.setdefault((p.lq, p.lk, p.mode), []).append(i)
        return out

    def density(self) -> float:
        """Fraction of the Lq x Lk entries the plan computes."""
        return sum(p.work for p in self.pieces) / max(1, self.q_len * self.kv_len)

    def describe(self) -> str:
        modes = sorted({p.mode for p in self.pieces})
        how = f"{len(self.pieces)} query pieces in {len(self.groups())} kernel calls ({', '.join(modes)})"
        if self.q_perm is not None:
            how += ", regrouped by stride residue"
        return f"{how}; computes {100 * self.density():.1f}% of the Lq x Lk entries"


def stride_hint(mask: MaskSpec | None) -> int | None:
    """The stride of a ``strided(s)`` conjunct of the mask, if any."""
    conjuncts = () if mask is None else mask.conjuncts()
    return next((p.stride for p in conjuncts if p.kind == "strided"), None)


def _residue_order(positions: torch.Tensor, stride: int) -> torch.Tensor:
    """Indices sorting ``positions (L,)`` by residue mod stride, keeping order within a residue."""
    return torch.sort(torch.remainder(positions, stride), stable=True).indices  # (L,)


def make_plan(mask: MaskSpec | None, ctx: MaskContext, rows: torch.Tensor, *, allow_causal: bool = True,
              block: int | None = None, fn: BoundMask | None = None, min_piece: int = MIN_PIECE) -> Plan:
    """Plan the call's queries for batch rows ``rows`` with tiles of ``block`` (default :data:`BLOCK`).
    ``allow_causal=False`` (a bias is present) never uses the kernel's causal flag. ``fn``: the mask already
    bound to ``ctx`` (a prepared mask's), bound here when not given. ``min_piece``: query tiles are merged up
    to this many queries whatever the extra work (:data:`MIN_PIECE`; ``block`` merges only within
    :data:`MERGE_SLACK`)."""
    Lq, Lk, dev = ctx.q_len, ctx.kv_len, ctx.device
    block = block or BLOCK
    q_perm = kv_perm = None
    stride = stride_hint(mask)
    if stride is not None and 1 < stride < Lk and _same_rows(ctx, rows):
        q_perm = _residue_order(ctx.q_positions[rows[0]], stride)
        kv_perm = _residue_order(ctx.kv_positions[rows[0]], stride)
    grid = BlockGrid(ctx, rows, torch.arange(Lq, device=dev) if q_perm is None else q_perm,
                     torch.arange(Lk, device=dev) if kv_perm is None else kv_perm, block, block)
    if mask is None:
        full = torch.ones(grid.n_q, grid.n_kv, dtype=torch.bool, device=dev)
        cov = BlockCover(full, full)
    else:
        cov = cover(mask, grid)
    diag = None
    if allow_causal and mask is not None and Lq == Lk:
        diag = _diagonal_is_tril(fn or mask.bind(ctx), mask.heads, grid, cov)
    pieces = _pieces(cov, diag, Lq, Lk, block, max(block, MAX_PIECE), min_piece)
    if all(p.mode == "empty" for p in pieces):  # nothing visible: one masked piece gives zeros with grads to q, k, v
        pieces = [Piece(0, Lq, ((0, Lk),), "mask")]
    return Plan(rows, q_perm, kv_perm, pieces, Lq, Lk)


def _same_rows(ctx: MaskContext, rows: torch.Tensor) -> bool:
    if rows.numel() == 1:
        return True
    qp, kvp = ctx.q_positions[rows], ctx.kv_positions[rows]
    return bool((qp == qp[:1]).all()) and bool((kvp == kvp[:1]).all())


def _diagonal_is_tril(fn: BoundMask, heads: int, grid: BlockGrid, cov: BlockCover) -> list[bool]:
    """For each diagonal tile (i, i): is the mask there exactly lower-triangular (for every row and head)?"""
    n, bq, L = grid.n_q, grid.q_block, grid.q_index.numel()
    out = [False] * n
    candidates = [i for i, ok in enumerate(torch.diagonal(cov.any).tolist()) if ok]
    if not candidates:
        return out
    for size, ids in ((bq, [i for i in candidates if (i + 1) * bq <= L]), (L % bq, [n - 1] if L % bq and
                                                                          n - 1 in candidates else [])):
        if not ids:
            continue
        starts = torch.tensor(ids, device=grid.q_index.device)[:, None] * bq  # (T, 1)
        offs = torch.arange(size, device=grid.q_index.device)[None, :]  # (1, size)
        allowed = evaluate_on(fn, grid.rows, grid.q_index[starts + offs], grid.kv_index[starts + offs],
                              heads)  # (T, R|1, H|1, size|1, size|1)
        tril = torch.ones(size, size, dtype=torch.bool, device=allowed.device).tril()
        ok = (allowed == tril).flatten(1).all(dim=1)  # (T,)
        for i, good in zip(ids, ok.tolist()):
            out[i] = good
    return out


def _ranges(blocks: list[int], block: int, length: int) -> tuple[tuple[int, int], ...]:
    """Merge sorted tile ids into index ranges clipped to ``length``."""
    out: list[list[int]] = []
    for j in blocks:
        lo, hi = j * block, min((j + 1) * block, length)
        if out and out[-1][1] == lo:
            out[-1][1] = hi
        else:
            out.append([lo, hi])
    return tuple((lo, hi) for lo, hi in out)


def _pieces(cov: BlockCover, diag: list[bool] | None, Lq: int, Lk: int, block: int, max_piece: int,
            min_piece: int = MIN_PIECE) -> list[Piece]:
    n_q = cov.any.shape[0]
    reach = [torch.nonzero(row).flatten().tolist() for row in cov.any]  # key tiles per query tile
    full = cov.full.tolist()
    pieces: list[Piece] = []
    i = 0
    while i < n_q:
        end = _causal_run(i, reach, full, diag) if diag else i
        if end > i:
            lo, hi = i * block, min(end * block, Lq)
            pieces.append(Piece(lo, hi, ((lo, hi),), "causal"))
            i = end
            continue
        blocks = set(reach[i])
        j = i + 1
        while j < n_q and not (diag and _causal_run(j, reach, full, diag) > j):
            union = blocks | set(reach[j])
            if (j + 1 - i) * block > max_piece and not (union == blocks == set(reach[j])):
                break  # beyond MAX_PIECE only rows with the very same keys join (no key copies, no extra work)
            separate = sum(len(reach[t]) for t in range(i, j + 1))
            if (j - i) * block >= min_piece and len(union) * (j + 1 - i) > (1 + MERGE_SLACK) * separate:
                break
            blocks, j = union, j + 1
        kv = _ranges(sorted(blocks), block, Lk)
        if not kv:
            mode = "empty"
        else:
            covered = all(full[t][b] for t in range(i, j) for b in blocks)
            mode = "none" if covered else "mask"
        pieces.append(Piece(i * block, min(j * block, Lq), kv, mode))
        i = j
    return pieces


def _causal_run(i0: int, reach: list[list[int]], full: list[list[bool]], diag: list[bool]) -> int:
    """End (exclusive) of the longest run of query tiles from ``i0`` whose mask is exactly causal on the
    square of keys ``[i0, end)`` tiles; ``i0`` when there is none."""
    k = i0
    while k < len(reach) and diag[k] and reach[k] and reach[k][0] >= i0 and reach[k][-1] == k \
            and all(full[k][j] for j in range(i0, k)):
        k += 1
    return k

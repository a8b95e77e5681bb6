"""Block structure of masks: which tiles of the (query, key) grid may hold an allowed entry, and which are full.

The grid is cut into tiles of ``q_block`` queries by ``kv_block`` keys. :func:`cover` returns two bool
tensors ``(nQ, nK)``:

- ``any[i, j]`` is False only if no entry of tile (i, j) is allowed (for every batch row and head served):
  the tile can be skipped. It may be True for a tile that turns out empty (a safe over-approximation).
- ``full[i, j]`` is True only if every entry of the tile is allowed: no mask is needed there.

Both are derived from the mask itself, from per-tile ranges of positions, indices and mask data, in
O(nQ x nK): causal, sliding and two-sided windows from position ranges, chunks and documents from id ranges,
strided masks from residues, global tokens and padding from their data; a dense tensor is reduced per tile.
``&`` intersects, ``|`` unites, ``~`` swaps the two. Only custom masks (an opaque function) and unknown
subclasses are probed: evaluated on the whole grid, O(Lq x Lk). Each kind registers its cover
(``@cover.register``) beside its class in :mod:`attnkit.masks.kinds`; this module holds the grid, the dispatch,
the algebra's covers and the helpers (:func:`outer`, :func:`overlap`, :func:`single_equal`, :func:`tiles_of`), and
imports no kind.

The grid may list queries and keys in any order (``q_index``/``kv_index``, e.g. grouped by residue for a
strided mask); tiles are cut along that order.

Shape legend: R batch rows served, H heads, Lq/Lk query/key lengths, nQ/nK query/key tile counts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property, singledispatch

import torch

from attnkit.masks.dense import BoundMask, MaskContext
from attnkit.masks.spec import Combination, MaskSpec, Not


@dataclass(frozen=True)
class BlockCover:
    any: torch.Tensor  # (nQ, nK) bool: some entry of the tile may be allowed
    full: torch.Tensor  # (nQ, nK) bool: every entry of the tile is allowed


@dataclass
class BlockGrid:
    """Tiles over the queries ``q_index`` and keys ``kv_index`` (in that order) of batch rows ``rows``."""

    ctx: MaskContext
    rows: torch.Tensor  # (R,) int64 batch rows of ctx
    q_index: torch.Tensor  # (Lq,) int64 query indices, in tile order
    kv_index: torch.Tensor  # (Lk,) int64 key indices, in tile order
    q_block: int
    kv_block: int

    @property
    def n_q(self) -> int:
        return math.ceil(self.q_index.numel() / self.q_block)

    @property
    def n_kv(self) -> int:
        return math.ceil(self.kv_index.numel() / self.kv_block)

    @cached_property
    def q_pos(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Per query tile min and max position over the rows ``(nQ,)`` each."""
        return tile_range(self.ctx.q_positions[self.rows][:, self.q_index], self.q_block)

    @cached_property
    def kv_pos(self) -> tuple[torch.Tensor, torch.Tensor]:
        return tile_range(self.ctx.kv_positions[self.rows][:, self.kv_index], self.kv_block)

    def q_tiles(self, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Min/max per query tile of per-query ``values (R, Lq)`` given in index order."""
        return tile_range(values[:, self.q_index], self.q_block)

    def kv_tiles(self, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return tile_range(values[:, self.kv_index], self.kv_block)


def tile_range(values: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Min and max of ``values (R, L)`` over rows and over each run of ``block`` columns: ``(n,)`` each."""
    R, L = values.shape
    n = math.ceil(L / block)
    padded = torch.cat([values, values[:, -1:].expand(R, n * block - L)], dim=1)  # (R, n * block), edge-padded
    tiles = padded.view(R, n, block)  # (R, n, block)
    return tiles.amin(dim=(0, 2)), tiles.amax(dim=(0, 2))


def outer(a: torch.Tensor, b: torch.Tensor, op) -> torch.Tensor:
    return op(a[:, None], b[None, :])  # (nQ, nK)


def overlap(q_lo, q_hi, kv_lo, kv_hi) -> torch.Tensor:
    """Tiles whose value ranges [q_lo, q_hi] and [kv_lo, kv_hi] intersect ``(nQ, nK)``."""
    return (q_lo[:, None] <= kv_hi[None, :]) & (kv_lo[None, :] <= q_hi[:, None])


def single_equal(q_lo, q_hi, kv_lo, kv_hi) -> torch.Tensor:
    """Tiles where both ranges are the same single value ``(nQ, nK)``."""
    return ((q_lo == q_hi)[:, None] & (kv_lo == kv_hi)[None, :]) & (q_lo[:, None] == kv_lo[None, :])


@singledispatch
def cover(mask: MaskSpec | None, grid: BlockGrid) -> BlockCover:
    """The :class:`BlockCover` of ``mask`` on ``grid`` (see the module docstring). Unknown masks are probed."""
    return probe(mask, grid)


@cover.register
def _(mask: Combination, grid: BlockGrid) -> BlockCover:  # & intersects, | unites (mask.join)
    parts = [cover(p, grid) for p in mask.parts]
    return BlockCover(_reduce([p.any for p in parts], mask.join), _reduce([p.full for p in parts], mask.join))


@cover.register
def _(mask: Not, grid: BlockGrid) -> BlockCover:
    inner = cover(mask.inner, grid)
    return BlockCover(~inner.full, ~inner.any)


def _reduce(tensors, op):
    out = tensors[0]
    for t in tensors[1:]:
        out = op(out, t)
    return out


def evaluate_on(fn: BoundMask, rows: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor,
                heads: int) -> torch.Tensor:
    """Evaluate the bound mask ``fn`` for rows ``(R,)`` on index tensors ``q_idx (..., lq)`` and ``kv_idx (..., lk)``.

    ``fn`` is bound once per call (a prepared mask's ``fn``, shared by every piece and layer), never here.
    Returns bool ``(..., R|1, heads|1, lq, lk)`` in its natural broadcast shape (a padding mask stays
    ``(..., R, 1, 1, lk)``), where ``...`` are the leading dims shared by the two index tensors.
    """
    lead = q_idx.shape[:-1]
    n = len(lead)
    b = rows.view(*([1] * n), -1, 1, 1, 1)  # (1.., R, 1, 1, 1)
    h = torch.arange(heads, device=rows.device).view(*([1] * n), 1, -1, 1, 1)  # (1.., 1, H, 1, 1)
    qi = q_idx.view(*lead, 1, 1, q_idx.shape[-1], 1)  # (..., 1, 1, lq, 1)
    ki = kv_idx.view(*kv_idx.shape[:-1], 1, 1, 1, kv_idx.shape[-1])  # (..., 1, 1, 1, lk)
    return fn(b, h, qi, ki)


def probe(mask: MaskSpec, grid: BlockGrid) -> BlockCover:
    """Cover by evaluating the mask on every entry (O(Lq x Lk)): only for custom and unknown masks."""
    return tiles_of(evaluate_on(mask.bind(grid.ctx), grid.rows, grid.q_index, grid.kv_index, mask.heads), grid)


def tiles_of(allowed: torch.Tensor, grid: BlockGrid) -> BlockCover:
    """Any/all per tile of ``allowed (R|1, H|1, Lq|1, Lk|1)`` (grid order) over rows and heads."""
    Lq, Lk = grid.q_index.numel(), grid.kv_index.numel()
    allowed = allowed.expand(*allowed.shape[:2], Lq, Lk).to(torch.int8)
    pad_q, pad_k = grid.n_q * grid.q_block - Lq, grid.n_kv * grid.kv_block - Lk
    tiles = []
    for fill in (0, 1):  # padding entries never make a tile non-empty (0) nor non-full (1)
        t = torch.nn.functional.pad(allowed, (0, pad_k, 0, pad_q), value=fill)  # (R, H, nQ*bq, nK*bk)
        tiles.append(t.view(*t.shape[:2], grid.n_q, grid.q_block, grid.n_kv, grid.kv_block))  # (R, H, nQ, bq, nK, bk)
    return BlockCover(tiles[0].amax(dim=(0, 1, 3, 5)).bool(), tiles[1].amin(dim=(0, 1, 3, 5)).bool())

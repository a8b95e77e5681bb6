"""What each rank must compute and receive for a mask, and which strategy moves it best.

From the mask's block cover (``attnkit.masks.blocks.cover``, on global positions and indices) the plan
derives, identically on every rank:

- ``needs[r][s]``: some query of rank r may see some key of rank s's shard. A shard nobody needs is
  never sent (sliding windows, chunked attention and documents skip most shards);
- ``tiles[s]``: this rank's (query tile, key tile) pairs against shard s that hold an allowed entry, each
  marked full (no mask to evaluate) or partial; empty tiles cost nothing;
- ``hops[s]``: how far shard s must travel around the ring (the farthest rank, in ring order, that needs it).

Strategies (:func:`choose`): ``all_gather`` sends each shard once, directly, to the ranks that need it
(Llama 3's choice; best when K/V are small next to Q, i.e. GQA, and when the needs are irregular, i.e.
documents); ``ring`` passes shards rank to rank, overlapping each step's transfer with the previous
shard's compute and holding only two shards at a time (best for long MHA sequences with regular needs).

Shape legend: B batch, L global length, W world size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnkit.distributed.kernel import Tile
from attnkit.distributed.layout import ShardLayout
from attnkit.masks import MaskContext, MaskSpec
from attnkit.masks.blocks import BlockGrid, cover

STRATEGIES = ("auto", "ring", "all_gather")


@dataclass(frozen=True)
class Plan:
    layout: ShardLayout
    rank: int
    needs: tuple[tuple[bool, ...], ...]  # (W, W): needs[r][s]
    tiles: tuple[tuple[Tile, ...], ...]  # (W,): this rank's tiles against shard s
    hops: tuple[int, ...]  # (W,): ring distance shard s travels

    @property
    def world(self) -> int:
        return self.layout.world

    def sources(self) -> list[int]:
        """Shards this rank needs (its own first)."""
        r = self.rank
        return [s for s in [r] + [x for x in range(self.world) if x != r] if self.needs[r][s]]

    def needers(self) -> list[int]:
        """Other ranks that need this rank's shard."""
        return [p for p in range(self.world) if p != self.rank and self.needs[p][self.rank]]

    def pair_count(self) -> int:
        """Number of (rank, other rank's shard) pairs with traffic under all-gather: the minimum."""
        return sum(self.needs[r][s] for r in range(self.world) for s in range(self.world) if r != s)


def _grid(ctx: MaskContext, q_run, kv_run, q_block: int, kv_block: int) -> BlockGrid:
    rows = torch.arange(ctx.batch, device=ctx.device)
    return BlockGrid(ctx, rows, torch.arange(*q_run, device=ctx.device), torch.arange(*kv_run, device=ctx.device),
                     q_block, kv_block)


def build_plan(mask: MaskSpec | None, ctx: MaskContext, layout: ShardLayout, rank: int, tile: int) -> Plan:
    """The plan of ``rank`` for ``mask`` bound to the global context ``ctx`` (positions ``(B, L)``).

    Every rank derives the tiles of every (rank, shard) pair, so that it knows who needs its shard; the
    block cover proposes tiles and the partial ones are checked entry by entry (a cover over-approximates,
    e.g. ``document & causal`` with positions restarted per document), so a shard is sent only when some
    query really sees one of its keys.
    """
    W = layout.world
    runs = [[run for run in layout.chunks[r] if run[1] > run[0]] for r in range(W)]
    exact = _Exact(mask, ctx)
    all_tiles = []
    for r in range(W):
        row = []
        for s in range(W):
            found: list[Tile] = []
            q_off = 0
            for a in runs[r]:
                k_off = 0
                for b in runs[s]:
                    found += _tiles(mask, ctx, exact, a, b, q_off, k_off, tile)
                    k_off += b[1] - b[0]
                q_off += a[1] - a[0]
            row.append(tuple(found))
        all_tiles.append(row)
    needs = tuple(tuple(bool(all_tiles[r][s]) for s in range(W)) for r in range(W))
    hops = tuple(max([(r - s) % W for r in range(W) if r != s and needs[r][s]], default=0) for s in range(W))
    return Plan(layout, rank, needs, tuple(all_tiles[rank]), hops)


class _Exact:
    """Whether a tile really holds an allowed entry: the mask evaluated on its entries, many tiles at once."""

    BATCH = 64  # tiles evaluated together (memory: BATCH * B * heads * tile^2 bools)

    def __init__(self, mask: MaskSpec | None, ctx: MaskContext):
        self.fn = None if mask is None else mask.bind(ctx)
        device = ctx.device
        self.b = torch.arange(ctx.batch, device=device).view(1, -1, 1, 1, 1)  # (1, B, 1, 1, 1)
        self.h = torch.arange(1 if mask is None else mask.heads, device=device).view(1, 1, -1, 1, 1)

    def any(self, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        """``q_idx (n, lq)``, ``kv_idx (n, lk)`` global indices -> ``(n,)`` bool: some entry allowed."""
        out = []
        for i in range(0, q_idx.shape[0], self.BATCH):
            qi = q_idx[i:i + self.BATCH, None, None, :, None]  # (n, 1, 1, lq, 1)
            ki = kv_idx[i:i + self.BATCH, None, None, None, :]  # (n, 1, 1, 1, lk)
            out.append(self.fn(self.b, self.h, qi, ki).flatten(1).any(dim=1))
        return torch.cat(out) if out else torch.zeros(0, dtype=torch.bool)


def _tile_index(run, tile: int, n: int) -> torch.Tensor:
    """Global indices ``(n, tile)`` of the n tiles of ``run``; the last tile repeats its last index."""
    start, stop = run
    idx = start + torch.arange(n)[:, None] * tile + torch.arange(tile)[None, :]  # (n, tile)
    return idx.clamp(max=stop - 1)


def _tiles(mask, ctx, exact: _Exact, q_run, kv_run, q_off: int, k_off: int, tile: int) -> list[Tile]:
    """Non-empty tiles of queries ``q_run`` x keys ``kv_run`` in local coordinates (offsets q_off, k_off)."""
    lq, lk = q_run[1] - q_run[0], kv_run[1] - kv_run[0]
    nq, nk = -(-lq // tile), -(-lk // tile)
    if mask is None:
        any_ = full = torch.ones(nq, nk, dtype=torch.bool)
    else:
        c = cover(mask, _grid(ctx, q_run, kv_run, tile, tile))
        any_, full = c.any.cpu(), c.full.cpu()
        partial = torch.nonzero(any_ & ~full)  # (n, 2) candidates to check entry by entry
        if partial.numel():
            device = ctx.device
            qi = _tile_index(q_run, tile, nq).to(device)[partial[:, 0]]
            ki = _tile_index(kv_run, tile, nk).to(device)[partial[:, 1]]
            any_ = any_.clone()
            any_[partial[:, 0], partial[:, 1]] = exact.any(qi, ki).cpu()
    out = []
    for i, j in torch.nonzero(any_).tolist():
        q0, k0 = i * tile, j * tile
        out.append(Tile(q_off + q0, q_off + min(q0 + tile, lq), k_off + k0, k_off + min(k0 + tile, lk),
                        bool(full[i, j])))
    return out


def ring_sends(plan: Plan) -> int:
    """Shard transfers the ring makes (all ranks together, forward): each shard s moves ``hops[s]`` times."""
    return sum(plan.hops)


def choose(plan: Plan, num_heads: int, num_kv_heads: int, requested: str = "auto") -> tuple[str, str]:
    """``(strategy, reason)``. ``requested`` other than "auto" is honoured (the reason says so)."""
    if plan.world == 1:
        return "local", "one process: no other shard exists, attention runs locally"
    if requested != "auto":
        return requested, f"strategy={requested!r} was requested"
    minimum, ring = plan.pair_count(), ring_sends(plan)
    if minimum == 0:
        return "all_gather", "no query needs another rank's keys: nothing is sent"
    if num_kv_heads < num_heads:
        return "all_gather", (f"GQA (Hkv={num_kv_heads} < H={num_heads}): K/V are {num_heads // num_kv_heads}x "
                              "smaller than Q, so gathering the needed shards at once is cheap (Llama 3's choice)")
    if ring > minimum:
        return "all_gather", (f"irregular needs (document-like): the ring would move {ring} shard transfers to "
                              f"deliver {minimum}, relaying shards through ranks that do not need them")
    return "ring", (f"MHA with ring-shaped needs: {ring} neighbour transfers deliver exactly the {minimum} "
                    "needed, overlapped with compute, holding two shards at a time")

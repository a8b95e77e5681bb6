"""Which tokens of the global sequence each rank holds: contiguous, zigzag (causal) or by document.

A :class:`ShardLayout` cuts a sequence of ``L`` tokens into ``W`` shards, one per rank of the
context-parallel group. A shard is a tuple of *chunks*, each a contiguous run ``[start, stop)`` of global
token indices; the rank holds its chunks concatenated in that order. Every rank builds the same layout
from global information (lengths, document ids), so no rank has to ask another what it holds.

- :func:`contiguous`: rank r holds one run; lengths differ by at most one token (odd lengths are fine).
- :func:`zigzag`: the sequence is cut into ``2W`` chunks and rank r holds chunks r and ``2W - 1 - r``, so
  under a causal mask every rank does the same work (an early chunk sees few keys, a late one many).
- :func:`by_documents`: cuts at document boundaries so that each rank's causal-within-document work is
  balanced; with whole documents per rank, a document mask needs no key of another rank at all.
- :func:`layout_for` picks one of these for a mask.

Shape legend: B batch, L global length, W world size (ranks in the group).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from attnkit._checks import integer
from attnkit.errors import AttnkitValueError, describe
from attnkit.masks import MaskSpec


@dataclass(frozen=True)
class ShardLayout:
    """``chunks[r]``: the runs ``(start, stop)`` of global indices that rank r holds, in its local order."""

    seq_len: int
    chunks: tuple[tuple[tuple[int, int], ...], ...]
    kind: str = "custom"

    def __post_init__(self):
        covered = sorted(run for shard in self.chunks for run in shard if run[1] > run[0])
        position = 0
        for start, stop in covered:
            if start != position:
                break
            position = stop
        if position != self.seq_len or any(start > stop for shard in self.chunks for start, stop in shard):
            raise AttnkitValueError(f"shard layout chunks {describe(self.chunks)} must cover 0..{self.seq_len} "
                                    "exactly once with runs (start, stop); build layouts with contiguous(), "
                                    "zigzag() or by_documents().")

    @property
    def world(self) -> int:
        return len(self.chunks)

    def length(self, rank: int) -> int:
        """Number of tokens rank ``rank`` holds."""
        return sum(stop - start for start, stop in self.chunks[rank])

    @cached_property
    def _indices(self) -> tuple[torch.Tensor, ...]:
        return tuple(
            torch.cat([torch.arange(a, b) for a, b in shard]) if shard else torch.zeros(0, dtype=torch.long)
            for shard in self.chunks)

    def index(self, rank: int, device: torch.device | str | None = None) -> torch.Tensor:
        """Global token indices ``(L_r,)`` int64 that rank ``rank`` holds, in its local order."""
        return self._indices[rank].to(device)

    def shard(self, x: torch.Tensor, rank: int, dim: int = -2) -> torch.Tensor:
        """Rank ``rank``'s slice of a global tensor along ``dim`` (the sequence dim: -2 for ``(B, H, L, D)``)."""
        if x.shape[dim] != self.seq_len:
            raise AttnkitValueError(f"x has {x.shape[dim]} entries along dim {dim} but the layout covers "
                                    f"seq_len={self.seq_len}; pass the global tensor and its sequence dim.")
        return x.index_select(dim, self.index(rank, x.device))

    def unshard(self, shards: list[torch.Tensor], dim: int = -2) -> torch.Tensor:
        """Put every rank's shard back in global order (the inverse of :meth:`shard` over all ranks)."""
        joined = torch.cat(shards, dim=dim)  # (..., L, ...) in rank order
        order = torch.cat([self.index(r) for r in range(self.world)])  # (L,) global index of each joined entry
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(order.numel())
        return joined.index_select(dim, inverse.to(joined.device))


def _split(total: int, parts: int) -> list[int]:
    """``parts`` sizes summing to ``total``, the first ``total % parts`` one larger."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def _check(seq_len: int, world: int) -> tuple[int, int]:
    seq_len = integer(seq_len, "seq_len", low=1, fix="pass the global sequence length.")
    world = integer(world, "world", low=1, fix="pass the number of ranks in the context-parallel group.")
    return seq_len, world


def contiguous(seq_len: int, world: int) -> ShardLayout:
    """Rank r holds one contiguous run; sizes differ by at most one token."""
    seq_len, world = _check(seq_len, world)
    bounds = torch.tensor([0] + _split(seq_len, world)).cumsum(0).tolist()
    return ShardLayout(seq_len, tuple(((bounds[r], bounds[r + 1]),) for r in range(world)), "contiguous")


def zigzag(seq_len: int, world: int) -> ShardLayout:
    """``2W`` chunks; rank r holds chunks ``r`` and ``2W - 1 - r`` (balanced work under a causal mask)."""
    seq_len, world = _check(seq_len, world)
    bounds = torch.tensor([0] + _split(seq_len, 2 * world)).cumsum(0).tolist()
    run = [(bounds[c], bounds[c + 1]) for c in range(2 * world)]
    return ShardLayout(seq_len, tuple((run[r], run[2 * world - 1 - r]) for r in range(world)), "zigzag")


def by_documents(doc_ids: torch.Tensor, world: int) -> ShardLayout:
    """Contiguous shards cut at document boundaries, balancing causal-within-document work.

    ``doc_ids``: int ``(B, L)`` or ``(L,)``. The work of query i is the number of keys it sees under
    ``document & causal`` (its index inside its document + 1), summed over batch rows. Each cut goes to the
    document boundary (shared by every row) nearest the balanced target; with fewer boundaries than ranks
    (or none near the target) it falls back to the balanced position itself.
    """
    ids = torch.as_tensor(doc_ids).long().reshape(-1, torch.as_tensor(doc_ids).shape[-1])  # (B, L)
    seq_len, world = _check(ids.shape[1], world)
    starts = torch.ones_like(ids, dtype=torch.bool)  # (B, L): token starts a document
    starts[:, 1:] = ids[:, 1:] != ids[:, :-1]
    index = torch.arange(seq_len).expand_as(ids)
    first = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=1).values  # (B, L) start of own doc
    work = (index - first + 1).sum(dim=0).double()  # (L,) keys seen per query, summed over rows
    cumulative = torch.cat([torch.zeros(1, dtype=torch.float64), work.cumsum(0)])  # (L + 1,) work before i
    boundaries = torch.nonzero(starts.all(dim=0)).flatten().tolist() + [seq_len]  # cut positions shared by all
    cuts, total = [0], float(cumulative[-1])
    for r in range(1, world):
        target = total * r / world
        ideal = int(torch.searchsorted(cumulative, torch.tensor([target], dtype=torch.float64)).item())
        ideal = min(max(ideal, cuts[-1]), seq_len)
        doc_cut = min((b for b in boundaries if b >= cuts[-1]), key=lambda b: abs(float(cumulative[b]) - target))
        # a boundary cut is taken unless it costs more imbalance than one document's worth of the target share
        cuts.append(doc_cut if abs(float(cumulative[doc_cut]) - target) <= total / (2 * world) else ideal)
    cuts.append(seq_len)
    return ShardLayout(seq_len, tuple(((cuts[r], cuts[r + 1]),) for r in range(world)), "documents")


def layout_for(mask: MaskSpec | None, seq_len: int, world: int) -> ShardLayout:
    """The layout that balances ``mask``: by documents when one of its conjuncts is a document mask, zigzag
    when it reaches every earlier key (``reach() == (None, 0)``: causal, causal & padding), contiguous
    otherwise (windows, chunks: each rank then needs only its neighbours' keys; bidirectional: all keys
    at equal cost)."""
    if mask is None:
        return contiguous(seq_len, world)
    document = next((c for c in mask.conjuncts() if c.kind == "document"), None)
    if document is not None and document.queries_from_keys:
        return by_documents(document.doc_ids, world)
    if mask.reach() == (None, 0):
        return zigzag(seq_len, world)
    return contiguous(seq_len, world)

"""``StaticCache``: ``max_length`` slots preallocated; every update returns the same fixed shapes.

``update`` writes the new tokens into the next free slots and returns the whole buffers: keys/values
``(B, Hkv, max_length, D)`` and positions ``(B, max_length)``, where empty slots sit at
:data:`~attnkit.cache.base.EMPTY_POSITION` (later than any query), so the causal mask hides them. Fixed
shapes are what ``torch.compile`` (and CUDA graphs) want: one compiled graph serves every decode step (the write
cursor is a tensor, so no Python int changes between steps). Eager updates also keep its value on the host and
write there, so an eager step does not read the cursor back, and an eager one-token step attends to the filled
slots only (:meth:`StaticCache.decode_view`: views, no mask) instead of masking the empty ones. Writing more
than ``max_length`` tokens raises :class:`~attnkit.cache.base.CacheFullError` in eager mode; inside
``torch.compile`` the value checks (full, positions continuing) are skipped, as they need a host sync, and an
overflowing write fails in ``index_copy_``.

Shape legend: B batch, Hkv key/value heads, Lnew new tokens, Lk filled slots, M max_length, D head dim.
"""

from __future__ import annotations

import torch

from attnkit._checks import positive_int
from attnkit.cache.base import EMPTY_POSITION, CacheBase, CacheFullError, index_parts
from attnkit.errors import AttnkitValueError


class StaticCache(CacheBase):
    """A preallocated cache of ``max_length`` tokens per row with fixed-shape outputs."""

    kind = "static"

    def __init__(self, batch_size: int, num_kv_heads: int, head_dim: int, *, max_length: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None):
        super().__init__(batch_size, num_kv_heads, head_dim, dtype=dtype, device=device)
        self.max_length = positive_int(max_length, "max_length")
        self._allocate(self.max_length, EMPTY_POSITION)
        self._cursor = torch.zeros((), dtype=torch.long, device=self.device)  # next free slot
        self._host_length: int | None = 0  # the cursor as a Python int, kept by eager updates (None: read it)

    def check_mask(self, mask: object) -> None:
        super().check_mask(mask)
        implicit = [p for p in index_parts(mask) if p.queries_from_keys]
        if implicit:  # the queries are not the last Lq of the max_length slots
            raise AttnkitValueError(
                f"a static cache returns all max_length={self.max_length} slots, but mask={mask!r} has a document "
                "mask without q_doc_ids, which takes the queries' ids from the last keys; pass "
                "document(doc_ids, q_doc_ids=<the new tokens' ids (B, Lnew)>), or use a dynamic cache.")

    @property
    def length(self) -> int:
        """Tokens stored; read from the device only after compiled steps (an eager decode step needs no sync)."""
        if self._host_length is None:
            self._host_length = int(self._cursor)
        return self._host_length

    def _advance(self, n: int) -> None:
        self._cursor += n
        # a compiled step advances the cursor inside the graph: forget the host copy, read it back when asked
        compiling = torch.compiler.is_compiling()
        self._host_length = None if compiling or self._host_length is None else self._host_length + n

    def _store(self, k, v, positions):
        n = k.shape[2]
        if torch.compiler.is_compiling():  # the cursor is a tensor: one graph for every step, fixed shapes
            slots = self._cursor + torch.arange(n, device=self.device)  # (Lnew,)
            self.k.index_copy_(2, slots, k)
            self.v.index_copy_(2, slots, v)
            self.positions.index_copy_(1, slots, positions.expand(self.batch_size, n))
            return self.k, self.v, self.positions  # (B, Hkv, M, D) x2, (B, M)
        start = self.length
        if start + n > self.max_length:
            raise CacheFullError(
                f"static cache is full: it holds max_length={self.max_length} tokens, has {start} and got "
                f"{n} more; build it with max_length >= prompt length + max_new_tokens (here >= {start + n}), "
                "or use kind='dynamic'.")
        self.k.narrow(2, start, n).copy_(k)  # at the host cursor: no slot tensor to build
        self.v.narrow(2, start, n).copy_(v)
        self.positions.narrow(1, start, n).copy_(positions)  # (B|1, Lnew) broadcast to (B, Lnew)
        return self.k, self.v, self.positions  # (B, Hkv, M, D) x2, (B, M)

    def decode_view(self, k, v, kv_positions, mask):
        """Eager, after a one-token update: the filled slots ``(B, Hkv, Lk, D)`` x2, ``(B, Lk)`` (all at positions
        <= the new token's), so a causal mask is dropped as with the dynamic cache; a mask with parts on key
        indices (sized to ``max_length``) and compiled steps (fixed shapes) keep every slot and the mask."""
        if torch.compiler.is_compiling() or index_parts(mask):
            return super().decode_view(k, v, kv_positions, mask)
        Lk = self.length
        k, v, kv_positions = k.narrow(2, 0, Lk), v.narrow(2, 0, Lk), kv_positions.narrow(1, 0, Lk)  # filled slots
        return k, v, kv_positions, self.decode_mask(mask, (None, 0))

    def _reset(self) -> None:
        self.positions.fill_(EMPTY_POSITION)
        self._cursor.zero_()
        self._host_length = 0

    def _buffers(self):
        return [self.k, self.v, self.positions]

    def __repr__(self) -> str:
        return super().__repr__()[:-1] + f", max_length={self.max_length})"

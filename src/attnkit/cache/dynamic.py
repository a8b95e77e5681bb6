"""``DynamicCache``: grows with the sequence (capacity doubles, so appending is amortised O(1)).

``update`` writes the new tokens after the stored ones and returns views of everything stored:
keys/values ``(B, Hkv, Lk, D)`` with ``Lk = length`` and positions ``(B, Lk)``.

Shape legend: B batch, Hkv key/value heads, Lnew new tokens, Lk stored tokens, C capacity, D head dim.
"""

from __future__ import annotations

import torch

from attnkit.cache.base import CacheBase


class DynamicCache(CacheBase):
    """A growing cache; ``initial_capacity`` slots are allocated on the first update (more when needed)."""

    kind = "dynamic"
    returned_offsets = (None, 0)  # every stored key sits at a position <= the newest one (checked in order)

    def __init__(self, batch_size: int, num_kv_heads: int, head_dim: int, *, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None, initial_capacity: int = 256):
        super().__init__(batch_size, num_kv_heads, head_dim, dtype=dtype, device=device)
        self.initial_capacity = max(1, int(initial_capacity))
        self.k = self.v = self.positions = None  # (B, Hkv, C, D), (B, Hkv, C, D), (B, C)

    def _grow(self, needed: int) -> None:
        capacity = self.initial_capacity if self.k is None else self.k.shape[2]
        while capacity < needed:
            capacity *= 2
        B, Hkv, D, n = self.batch_size, self.num_kv_heads, self.head_dim, self.length
        k = torch.empty(B, Hkv, capacity, D, dtype=self.dtype, device=self.device)  # (B, Hkv, C, D)
        v = torch.empty_like(k)
        pos = torch.empty(B, capacity, dtype=torch.long, device=self.device)  # (B, C)
        if n:
            k[:, :, :n], v[:, :, :n], pos[:, :n] = self.k[:, :, :n], self.v[:, :, :n], self.positions[:, :n]
        self.k, self.v, self.positions = k, v, pos

    def _store(self, k, v, positions):
        start, end = self.length, self.length + k.shape[2]
        if self.k is None or end > self.k.shape[2]:
            self._grow(end)
        n = end - start
        self.k.narrow(2, start, n).copy_(k)
        self.v.narrow(2, start, n).copy_(v)
        self.positions.narrow(1, start, n).copy_(positions)  # (B|1, Lnew) broadcast to (B, Lnew)
        return self.k.narrow(2, 0, end), self.v.narrow(2, 0, end), self.positions.narrow(1, 0, end)  # (B, Hkv, Lk, D) x2, (B, Lk)


    def _buffers(self):
        return [] if self.k is None else [self.k, self.v, self.positions]


__all__ = ["DynamicCache"]

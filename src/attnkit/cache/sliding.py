"""``SlidingWindowCache``: a ring buffer of ``window`` slots for sliding-window attention; memory O(W).

Slot ``t % W`` holds the token written ``t``-th, so after the ring wraps the slots are no longer in position
order; that is harmless because masks are evaluated on the stored absolute positions.

- One new token (decode): it overwrites the oldest slot, whose key (position p - W) is outside the new
  query's window, and the ring itself is returned: keys/values ``(B, Hkv, min(length, W), D)``.
- A chunk of n > 1 tokens (prefill, chunked prefill): the earlier queries of the chunk still need keys the
  chunk will overwrite, so the stored keys and the chunk are returned together (``(B, Hkv, <= W + n, D)``,
  transient), and then the last ``min(n, W)`` tokens of the chunk are written into the ring.

The mask must not reach further back than the ring (:meth:`~attnkit.masks.MaskSpec.reach`: at most
``window - 1`` positions back, e.g. ``sliding_window(w)`` with ``w <= window`` or ``chunked(C)`` with ``C <= window``
among its ``&`` parts), otherwise :meth:`check_mask` raises (a plain causal mask would silently lose old keys).

Shape legend: B batch, Hkv key/value heads, W window, n new tokens, D head dim.
"""

from __future__ import annotations

import torch

from attnkit._checks import positive_int
from attnkit.cache.base import CacheBase, index_parts, reach_of
from attnkit.errors import AttnkitValueError


class SlidingWindowCache(CacheBase):
    """A ring buffer holding the last ``window`` tokens of each row."""

    kind = "sliding"

    def __init__(self, batch_size: int, num_kv_heads: int, head_dim: int, *, window: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None):
        super().__init__(batch_size, num_kv_heads, head_dim, dtype=dtype, device=device)
        self.window = positive_int(window, "window")
        self._allocate(self.window, 0)

    @property
    def returned_offsets(self) -> tuple[int, int]:
        return 1 - self.window, 0  # after a one-token update the ring holds positions (p - W, p]

    def check_mask(self, mask: object) -> None:
        super().check_mask(mask)
        back = reach_of(mask)[0]
        if back is None or back < 1 - self.window:
            raise AttnkitValueError(
                f"a sliding-window cache of window={self.window} holds only the last {self.window} keys, but "
                f"mask={mask!r} can see further back; use a mask with ak.masks.sliding_window(w), w <= {self.window} "
                "(combined with & for padding), or a dynamic/static cache.")
        by_index = index_parts(mask)
        if by_index:  # the ring returns keys in slot order, which stops being position order once it wraps
            raise AttnkitValueError(
                f"a sliding-window cache returns its keys in ring order, but mask={mask!r} has parts defined on key "
                f"indices ({', '.join(p.kind for p in by_index)}), which would point at the wrong keys once "
                "the ring wraps; express padding by position (ak.masks.padding(start=first_real_positions)), or use "
                "a dynamic/static cache.")

    def _store(self, k, v, positions):
        W, n, start = self.window, k.shape[2], self.length
        filled = min(start, W)
        if n == 1:
            slot = start % W
            self.k[:, :, slot:slot + 1] = k
            self.v[:, :, slot:slot + 1] = v
            self.positions[:, slot:slot + 1] = positions  # (B|1, 1) broadcast to (B, 1)
            end = min(start + 1, W)
            return self.k[:, :, :end], self.v[:, :, :end], self.positions[:, :end]  # (B, Hkv, <=W, D) x2, (B, <=W)
        k_all = torch.cat([self.k[:, :, :filled], k], dim=2)  # (B, Hkv, filled + n, D)
        v_all = torch.cat([self.v[:, :, :filled], v], dim=2)  # (B, Hkv, filled + n, D)
        pos_all = torch.cat([self.positions[:, :filled], positions.expand(self.batch_size, n)], dim=1)  # (B, filled + n)
        keep = min(n, W)  # the chunk's last `keep` tokens go into the ring
        slots = torch.arange(start + n - keep, start + n, device=self.device) % W  # (keep,)
        self.k.index_copy_(2, slots, k[:, :, n - keep:])
        self.v.index_copy_(2, slots, v[:, :, n - keep:])
        self.positions.index_copy_(1, slots, positions.expand(self.batch_size, n)[:, n - keep:])
        return k_all, v_all, pos_all

    def _buffers(self):
        return [self.k, self.v, self.positions]

    def __repr__(self) -> str:
        return super().__repr__()[:-1] + f", window={self.window})"

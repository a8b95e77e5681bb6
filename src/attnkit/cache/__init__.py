"""KV caches for decoding: every cache returns the absolute positions of the keys it returns, so masks are
built from positions and stay right across chunked prefill, ring wrap-around and left padding.

- :class:`DynamicCache` grows with the sequence (the fast default in eager mode),
- :class:`StaticCache` preallocates ``max_length`` slots and returns fixed shapes (for ``torch.compile``),
- :class:`SlidingWindowCache` keeps the last ``window`` tokens in a ring buffer (memory O(window)).

>>> import torch, attnkit as ak
>>> mha = ak.nn.MultiHeadAttention(32, 4, num_kv_heads=2, positions="rope")
>>> from attnkit.cache import make_cache
>>> cache = make_cache("dynamic", 1, num_kv_heads=2, head_dim=8)
>>> x = torch.randn(1, 5, 32)
>>> prefill = mha(x[:, :3], ak.masks.causal(), positions=torch.arange(3)[None], cache=cache)
>>> step = mha(x[:, 3:4], ak.masks.causal(), positions=torch.tensor([[3]]), cache=cache)
>>> bool(torch.allclose(step, mha(x[:, :4], ak.masks.causal())[:, 3:], atol=1e-5))
True

Shape legend: B batch, Hkv key/value heads, D head dim.
"""

from __future__ import annotations

import torch

from attnkit.cache.base import EMPTY_POSITION, CacheBase, CacheFullError, KVCache
from attnkit.cache.dynamic import DynamicCache
from attnkit.cache.sliding import SlidingWindowCache
from attnkit.cache.static import StaticCache
from attnkit.errors import AttnkitValueError

KINDS = ("dynamic", "static", "sliding")


def make_cache(kind: str, batch_size: int, num_kv_heads: int, head_dim: int, *, max_length: int | None = None,
               window: int | None = None, dtype: torch.dtype = torch.float32,
               device: torch.device | str | None = None) -> CacheBase:
    """One layer's cache of ``kind`` ("dynamic", "static" needs ``max_length``, "sliding" needs ``window``)."""
    common = {"dtype": dtype, "device": device}
    if kind == "dynamic":
        return DynamicCache(batch_size, num_kv_heads, head_dim, **common)
    if kind == "static":
        if max_length is None:
            raise AttnkitValueError("kind='static' needs max_length (the prompt length + max_new_tokens), got None; "
                                    "pass max_length=..., or use kind='dynamic'.")
        return StaticCache(batch_size, num_kv_heads, head_dim, max_length=max_length, **common)
    if kind == "sliding":
        if window is None:
            raise AttnkitValueError("kind='sliding' needs window (the model's sliding-window size), got None; a model "
                                    "without a sliding window needs kind='dynamic' or 'static'.")
        return SlidingWindowCache(batch_size, num_kv_heads, head_dim, window=window, **common)
    raise AttnkitValueError(f"cache kind must be one of {KINDS}, got {kind!r}.")


__all__ = ["KVCache", "CacheBase", "CacheFullError", "DynamicCache", "StaticCache", "SlidingWindowCache",
           "make_cache", "KINDS", "EMPTY_POSITION"]

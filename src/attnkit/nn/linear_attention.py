"""``LinearAttention``: the drop-in O(n) counterpart of :class:`~attnkit.nn.MultiHeadAttention`.

Same constructor shape and the same ``forward(x, mask, *, positions, cache, return_weights)``, so a model can
choose per layer. The mask is read, not materialised: ``None`` (bidirectional), ``causal()``, ``padding(...)``
and their ``&`` combinations are served; other masks (documents, windows, ...) raise, since one running
state can't express them. Decoding keeps a :class:`LinearAttentionCache` — a (D x Dv) state and a normaliser
per KV head — instead of growing keys and values. Positions are accepted and ignored: linear attention has no
positional term (position information comes from the embeddings or the softmax layers of a hybrid).

Shape legend: B batch, L length, E embed_dim, H num_heads, Hkv num_kv_heads, D head_dim.
"""

from __future__ import annotations

import torch
from torch import nn

from attnkit.errors import AttnkitValueError, BackendUnsupportedError, describe
from attnkit.functional.linear import LinearState, linear_attention, resolve_feature_map
from attnkit.masks import MaskSpec
from attnkit.nn.attention import _check_shape_args, init_normal


class LinearAttentionCache:
    """The decoding state of one linear-attention layer; ``state`` is replaced as tokens are absorbed."""

    def __init__(self, state: LinearState | None = None):
        self.state = state

    @property
    def length(self) -> int:
        return 0 if self.state is None else self.state.length


def read_mask(mask, batch: int, length: int) -> tuple[bool, torch.Tensor | None]:
    """``(causal, key_is_real (B, length) or None)`` from a mask of causal/padding parts; raise for the rest."""
    if mask is not None and not isinstance(mask, MaskSpec):
        raise BackendUnsupportedError(f"LinearAttention needs an attnkit mask (causal/padding), got {describe(mask)}.")
    parts = () if mask is None else mask.conjuncts()
    causal, key_is_real = False, None
    for part in parts:
        if part.kind == "causal":
            causal = True
        elif part.kind == "padding":
            real = part.key_mask(batch, length)  # (B, Lk)
            key_is_real = real if key_is_real is None else key_is_real & real
        else:
            raise BackendUnsupportedError(
                f"LinearAttention serves masks built from causal() and padding(...), got {describe(part)} in "
                f"{mask!r}; use MultiHeadAttention for this layer (e.g. document masks: turn packing off).",
                [f"{part!r} is not expressible with one running state"])
    return causal, key_is_real


class LinearAttention(nn.Module):
    """Multi-head linear attention (Katharopoulos et al., 2020) with GQA and a recurrent decoding cache.

    Args mirror :class:`~attnkit.nn.MultiHeadAttention`; in addition ``feature_map`` ("elu1", "relu" or a
    callable) and ``chunk_size`` for the chunked training form. ``dropout`` is applied to the attention output
    (before the output projection) in training mode: there are no probabilities to drop.
    """

    #: the layer reads padding by key index, from the mask as given (its recurrent state has no slots to reorder):
    #: a model hands it the unprepared mask, not the cached, position-bound one (see ``TransformerLM.encode``)
    mask_by_key_index = True

    def __init__(self, embed_dim: int, num_heads: int, *, num_kv_heads: int | None = None,
                 head_dim: int | None = None, dropout: float = 0.0, bias: bool = True, positions=None,
                 feature_map="elu1", chunk_size: int = 64, eps: float = 1e-6, init_std: float | None = None,
                 device=None, dtype=None):
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        _check_shape_args(embed_dim, num_heads, num_kv_heads, head_dim)
        if not 0.0 <= dropout < 1.0:
            raise AttnkitValueError(f"dropout must be in [0, 1), got {dropout}; use e.g. 0.1, or 0.0 to disable.")
        if positions is not None:
            raise AttnkitValueError(f"LinearAttention takes no positions scheme, got {describe(positions)}; add "
                                    "sinusoidal/learned embeddings in the model or mix in softmax layers with RoPE.")
        resolve_feature_map(feature_map)
        self.embed_dim, self.num_heads, self.num_kv_heads = embed_dim, num_heads, num_kv_heads
        self.head_dim = head_dim or embed_dim // num_heads
        self.feature_map, self.chunk_size, self.eps = feature_map, chunk_size, eps
        D, H, Hkv = self.head_dim, num_heads, num_kv_heads
        factory = {"device": device, "dtype": dtype}
        self.qkv_proj = nn.Linear(embed_dim, (H + 2 * Hkv) * D, bias=bias, **factory)
        self.out_proj = nn.Linear(H * D, embed_dim, bias=bias, **factory)
        self.dropout = nn.Dropout(dropout)
        if init_std is not None:
            init_normal(self.qkv_proj, self.out_proj, std=init_std)

    def new_cache(self, batch_size: int | None = None, **_: object) -> LinearAttentionCache:
        """An empty decoding cache (its state is created on the first forward)."""
        return LinearAttentionCache()

    def forward(self, x: torch.Tensor, mask=None, *, positions: torch.Tensor | None = None,
                cache: LinearAttentionCache | None = None, return_weights: bool = False):
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.embed_dim:
            raise AttnkitValueError(f"x must have shape (B, L, embed_dim={self.embed_dim}), got {describe(x)}; "
                                    "attnkit modules are batch-first.")
        B, L, _ = x.shape
        H, Hkv, D = self.num_heads, self.num_kv_heads, self.head_dim
        causal, key_is_real = read_mask(mask, B, L)
        if key_is_real is not None:
            key_is_real = key_is_real[:, -L:].to(x.device)  # (B, L): the new tokens' part
        q, k, v = self.qkv_proj(x).split([H * D, Hkv * D, Hkv * D], dim=-1)
        q = q.view(B, L, H, D).transpose(1, 2)  # (B, H, L, D)
        k = k.view(B, L, Hkv, D).transpose(1, 2)  # (B, Hkv, L, D)
        v = v.view(B, L, Hkv, D).transpose(1, 2)  # (B, Hkv, L, D)
        if cache is not None:
            if return_weights:
                raise BackendUnsupportedError("LinearAttention returns weights only without a cache (the state no "
                                              "longer holds per-key terms); call it on the full sequence instead.")
            if not causal:
                raise AttnkitValueError("a LinearAttentionCache needs a causal mask (decoding); pass causal().")
            out, cache.state = linear_attention(q, k, v, feature_map=self.feature_map, chunk_size=self.chunk_size,
                                                eps=self.eps, key_is_real=key_is_real, state=cache.state,
                                                return_state=True)
        else:
            out = linear_attention(q, k, v, feature_map=self.feature_map, causal=causal, chunk_size=self.chunk_size,
                                   eps=self.eps, key_is_real=key_is_real)
        out = self.dropout(out).transpose(1, 2).reshape(B, L, H * D)  # (B, L, H*D)
        out = self.out_proj(out)  # (B, L, E)
        if return_weights:
            return out, self.weights(q, k, causal, key_is_real)
        return out

    def weights(self, q, k, causal, key_is_real):
        """The effective attention weights ``(B, H, L, L)``: phi(q_i).phi(k_j) normalised per row (O(L^2))."""
        phi = resolve_feature_map(self.feature_map)
        fq, fk = phi(q.float()), phi(k.float()).repeat_interleave(self.num_heads // self.num_kv_heads, dim=1)
        scores = fq @ fk.transpose(-2, -1)  # (B, H, L, L)
        if key_is_real is not None:
            scores = scores * key_is_real[:, None, None, :]
        if causal:
            scores = scores.tril()
        return (scores / (scores.sum(-1, keepdim=True) + self.eps)).to(q.dtype)

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
                f"head_dim={self.head_dim}, feature_map={self.feature_map!r}, chunk_size={self.chunk_size}")

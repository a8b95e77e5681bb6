"""``MultiHeadAttention``: projections, GQA/MQA, positions, dropout and output projection around
:func:`attnkit.attention`.

Shape legend: B batch, L length, E embed_dim, H num_heads, Hkv num_kv_heads, D head_dim.
"""

from __future__ import annotations

import torch
from torch import nn

from attnkit._checks import positive_int
from attnkit._validation import check_positions
from attnkit.backends import attention, get
from attnkit.errors import AttnkitTypeError, AttnkitValueError, describe
from attnkit.positions import ALiBi, RoPE


class MultiHeadAttention(nn.Module):
    """Multi-head self-attention with grouped/multi-query heads.

    Args:
        embed_dim: E, the model width.
        num_heads: H query heads; ``head_dim`` defaults to ``E // H``.
        num_kv_heads: Hkv key/value heads (``H`` = MHA, ``1`` = MQA, in between = GQA); H % Hkv == 0.
        dropout: attention dropout on the probabilities, active in training mode only.
        bias: whether the projections have biases.
        positions: ``None``, a :class:`~attnkit.positions.RoPE` (rotates q and k), an
            :class:`~attnkit.positions.ALiBi` (a bias from positions), or the strings ``"rope"``/``"alibi"``.
            Sinusoidal and learned embeddings are added to the token embeddings by the model, not here.
        backend: passed to :func:`attnkit.attention` ("auto" picks the fastest capable kernel).
        init_std: if set, all projection weights are drawn from normal(0, init_std) (GPT style: 0.02) and
            biases zeroed; ``None`` keeps PyTorch's default ``nn.Linear`` init.

    ``forward(x (B, L, E), mask=None, *, positions=None, cache=None, return_weights=False) -> (B, L, E)``
    (and weights ``(B, H, L, Lk)`` when asked).

    With ``cache`` (an :mod:`attnkit.cache` cache, or any object with ``update(k, v, positions)``), the
    new tokens' k and v (after RoPE, Hkv heads) go through ``cache.update`` and attention runs over every key
    it returns, at the absolute positions it returns: one code path for prefill, chunked prefill and
    decoding. ``positions`` (absolute, ``(B|1, L)``) is then required and the mask must be causal; it is
    evaluated on absolute positions (bottom-right), never on "the last L columns".
    """

    def __init__(self, embed_dim: int, num_heads: int, *, num_kv_heads: int | None = None,
                 head_dim: int | None = None, dropout: float = 0.0, bias: bool = True,
                 positions: RoPE | ALiBi | str | None = None, backend: str = "auto",
                 init_std: float | None = None, device=None, dtype=None):
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        _check_shape_args(embed_dim, num_heads, num_kv_heads, head_dim)
        if not 0.0 <= dropout < 1.0:
            raise AttnkitValueError(f"dropout must be in [0, 1), got {dropout}; use e.g. 0.1, or 0.0 to disable.")
        if backend != "auto":
            get(backend)  # fail early on unknown names
        self.embed_dim, self.num_heads, self.num_kv_heads = embed_dim, num_heads, num_kv_heads
        self.head_dim = head_dim or embed_dim // num_heads
        self.dropout, self.backend = dropout, backend
        D, H, Hkv = self.head_dim, num_heads, num_kv_heads
        factory = {"device": device, "dtype": dtype}
        self.qkv_proj = nn.Linear(embed_dim, (H + 2 * Hkv) * D, bias=bias, **factory)  # fused q, k, v
        self.out_proj = nn.Linear(H * D, embed_dim, bias=bias, **factory)
        self.rope, self.alibi = _positions_module(positions, D, H)
        if init_std is not None:
            init_normal(self.qkv_proj, self.out_proj, std=init_std)

    def project(self, x: torch.Tensor, positions: torch.Tensor | None = None):
        """q ``(B, H, L, D)``, k and v ``(B, Hkv, L, D)``, with RoPE applied when configured."""
        B, L, _ = x.shape
        H, Hkv, D = self.num_heads, self.num_kv_heads, self.head_dim
        q, k, v = self.qkv_proj(x).split([H * D, Hkv * D, Hkv * D], dim=-1)
        q = q.view(B, L, H, D).transpose(1, 2)  # (B, H, L, D)
        k = k.view(B, L, Hkv, D).transpose(1, 2)  # (B, Hkv, L, D)
        v = v.view(B, L, Hkv, D).transpose(1, 2)  # (B, Hkv, L, D)
        if self.rope is not None:
            pos = torch.arange(L, device=x.device) if positions is None else positions
            q, k = self.rope(q, pos), self.rope(k, pos)
        return q, k, v

    def forward(self, x: torch.Tensor, mask=None, *, positions: torch.Tensor | None = None, cache=None,
                return_weights: bool = False):
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.embed_dim:
            raise AttnkitValueError(f"x must have shape (B, L, embed_dim={self.embed_dim}), got {describe(x)}; "
                                    "attnkit modules are batch-first.")
        B, L, _ = x.shape
        positions = check_positions(positions, "positions", B, L, x.device)  # (B|1, L) or None
        if cache is not None:
            _check_cache_call(cache, mask, positions)
        q, k, v = self.project(x, positions)
        q_positions = kv_positions = positions
        if cache is not None:
            k, v, kv_positions = cache.update(k, v, positions)  # (B, Hkv, Lk, D) x2, (B|1, Lk)
            if L == 1 and hasattr(cache, "decode_mask"):
                mask = cache.decode_mask(mask)  # None when the newest query sees every returned key
                if mask is None and self.alibi is None:
                    q_positions = kv_positions = None  # no mask, no bias: positions are not needed any more
        result = attention(q, k, v, mask, bias=self.alibi, dropout_p=self.dropout if self.training else 0.0,
                           q_positions=q_positions, kv_positions=kv_positions, backend=self.backend,
                           return_weights=return_weights)
        out, weights = result if return_weights else (result, None)
        out = out.transpose(1, 2).reshape(B, L, self.num_heads * self.head_dim)  # (B, L, H*D)
        out = self.out_proj(out)  # (B, L, E)
        return (out, weights) if return_weights else out

    @classmethod
    def from_torch(cls, mha: nn.MultiheadAttention, **kwargs) -> MultiHeadAttention:
        """Copy the weights of a ``torch.nn.MultiheadAttention`` (self-attention, packed in-projection)."""
        if not isinstance(mha, nn.MultiheadAttention) or not mha._qkv_same_embed_dim:
            raise AttnkitTypeError(f"from_torch expects an nn.MultiheadAttention with kdim == vdim == embed_dim, "
                                   f"got {describe(mha)}.")
        w = mha.in_proj_weight
        new = cls(mha.embed_dim, mha.num_heads, dropout=mha.dropout, bias=mha.in_proj_bias is not None,
                  device=w.device, dtype=w.dtype, **kwargs)
        with torch.no_grad():
            new.qkv_proj.weight.copy_(w)  # torch packs [Wq; Wk; Wv] like attnkit
            new.out_proj.weight.copy_(mha.out_proj.weight)
            if mha.in_proj_bias is not None:
                new.qkv_proj.bias.copy_(mha.in_proj_bias)
                new.out_proj.bias.copy_(mha.out_proj.bias)
        return new

    def extra_repr(self) -> str:
        pos = "rope" if self.rope is not None else "alibi" if self.alibi is not None else None
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
                f"head_dim={self.head_dim}, dropout={self.dropout}, positions={pos}, backend={self.backend!r}")


def _check_cache_call(cache, mask, positions) -> None:
    if not callable(getattr(cache, "update", None)):
        raise AttnkitTypeError(f"cache must be a KV cache with update(k, v, positions) (attnkit.cache.make_cache), "
                               f"got {describe(cache)}; build one per layer with model.new_cache(batch_size).")
    if positions is None:
        raise AttnkitValueError("positions must be given with cache=: pass the absolute positions (B|1, L) of the new "
                                "tokens, e.g. torch.arange(n_cached, n_cached + L)[None].")
    if hasattr(cache, "check_mask"):
        cache.check_mask(mask)


def init_normal(*linears: nn.Linear, std: float) -> None:
    """GPT-style init: weights from normal(0, std), biases zero."""
    for linear in linears:
        nn.init.normal_(linear.weight, mean=0.0, std=std)
        if linear.bias is not None:
            nn.init.zeros_(linear.bias)


def _check_shape_args(embed_dim, num_heads, num_kv_heads, head_dim) -> None:
    for name, value in (("embed_dim", embed_dim), ("num_heads", num_heads), ("num_kv_heads", num_kv_heads)):
        positive_int(value, name)
    if num_heads % num_kv_heads:
        raise AttnkitValueError(f"num_heads={num_heads} must be a multiple of num_kv_heads={num_kv_heads}; "
                                "choose num_kv_heads dividing num_heads (1 = MQA, num_heads = MHA).")
    if head_dim is None and embed_dim % num_heads:
        raise AttnkitValueError(f"embed_dim={embed_dim} must be divisible by num_heads={num_heads}, or pass "
                                "head_dim explicitly.")
    if head_dim is not None:
        positive_int(head_dim, "head_dim")


def _positions_module(positions, head_dim: int, num_heads: int):
    """(rope, alibi) from the ``positions`` argument."""
    if positions is None:
        return None, None
    if positions == "rope":
        positions = RoPE(head_dim)
    elif positions == "alibi":
        positions = ALiBi(num_heads)
    if isinstance(positions, RoPE):
        if positions.head_dim != head_dim:
            raise AttnkitValueError(f"positions RoPE has head_dim={positions.head_dim} but the heads have "
                                    f"head_dim={head_dim}; build RoPE(head_dim={head_dim}).")
        return positions, None
    if isinstance(positions, ALiBi):
        if positions.num_heads != num_heads:
            raise AttnkitValueError(f"positions ALiBi has num_heads={positions.num_heads} but the module has "
                                    f"num_heads={num_heads}; build ALiBi({num_heads}).")
        return None, positions
    raise AttnkitTypeError(
        f"positions must be None, 'rope', 'alibi', an ak.positions.RoPE or ALiBi, got {describe(positions)}; "
        "sinusoidal and learned embeddings are added to token embeddings by the model, not inside attention."
    )

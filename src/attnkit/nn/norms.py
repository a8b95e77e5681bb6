"""Normalisation layers by name: ``make_norm("layernorm" | "rmsnorm" | "offset_rmsnorm", dim, eps=..., bias=...)``
(``offset_rmsnorm``: Gemma's, scaled by ``1 + weight``).

A new kind registers a factory in :data:`NORMS`; blocks and QK-norm take the module it builds.

Shape legend: ``(..., E)`` in, ``(..., E)`` out; E the normalised width.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from attnkit.errors import AttnkitValueError


def _layernorm(dim: int, eps: float, bias: bool) -> nn.Module:
    return nn.LayerNorm(dim, eps=eps, bias=bias)


def _rmsnorm(dim: int, eps: float, bias: bool) -> nn.Module:
    return nn.RMSNorm(dim, eps=eps)  # x / rms(x) * weight; RMSNorm has no bias (LLaMA, Mistral, Qwen2)


class OffsetRMSNorm(nn.Module):
    """Gemma's RMSNorm: ``x / rms(x) * (1 + weight)``, computed in float32 and cast back; ``weight`` starts at 0
    (the identity). ``(..., E) -> (..., E)``."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.float())).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}"


def _offset_rmsnorm(dim: int, eps: float, bias: bool) -> nn.Module:
    return OffsetRMSNorm(dim, eps=eps)


#: norm kind -> factory(dim, eps, bias) -> module
NORMS: dict[str, Callable[[int, float, bool], nn.Module]] = {"layernorm": _layernorm, "rmsnorm": _rmsnorm,
                                                             "offset_rmsnorm": _offset_rmsnorm}


def make_norm(kind: str, dim: int, *, eps: float = 1e-5, bias: bool = True) -> nn.Module:
    """A norm over the last ``dim`` channels; ``bias`` is ignored by kinds that have none (RMSNorm)."""
    if kind not in NORMS:
        raise AttnkitValueError(f"norm must be one of {sorted(NORMS)}, got {kind!r}; register a new kind in "
                                "attnkit.nn.norms.NORMS.")
    return NORMS[kind](dim, eps, bias)

"""Normalisation layers by name: ``make_norm("layernorm" | "rmsnorm", dim, eps=..., bias=...)``.

A new kind registers a factory in :data:`NORMS`; blocks and QK-norm take the module it builds.

Shape legend: ``(..., E)`` in, ``(..., E)`` out; E the normalised width.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from attnkit.errors import AttnkitValueError


def _layernorm(dim: int, eps: float, bias: bool) -> nn.Module:
    return nn.LayerNorm(dim, eps=eps, bias=bias)


def _rmsnorm(dim: int, eps: float, bias: bool) -> nn.Module:
    return nn.RMSNorm(dim, eps=eps)  # x / rms(x) * weight; RMSNorm has no bias (LLaMA, Mistral, Qwen2)


#: norm kind -> factory(dim, eps, bias) -> module
NORMS: dict[str, Callable[[int, float, bool], nn.Module]] = {"layernorm": _layernorm, "rmsnorm": _rmsnorm}


def make_norm(kind: str, dim: int, *, eps: float = 1e-5, bias: bool = True) -> nn.Module:
    """A norm over the last ``dim`` channels; ``bias`` is ignored by kinds that have none (RMSNorm)."""
    if kind not in NORMS:
        raise AttnkitValueError(f"norm must be one of {sorted(NORMS)}, got {kind!r}; register a new kind in "
                                "attnkit.nn.norms.NORMS.")
    return NORMS[kind](dim, eps, bias)

"""Attention modules built on :func:`attnkit.attention` (inputs ``(B, L, E)``, batch-first)."""

from attnkit.nn.attention import MultiHeadAttention

__all__ = ["MultiHeadAttention"]

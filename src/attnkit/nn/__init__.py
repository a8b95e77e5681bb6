"""Attention modules built on :func:`attnkit.attention` (inputs ``(B, L, E)``, batch-first)."""

from attnkit.nn.attention import MultiHeadAttention
from attnkit.nn.linear_attention import LinearAttention, LinearAttentionCache

__all__ = ["MultiHeadAttention", "LinearAttention", "LinearAttentionCache"]

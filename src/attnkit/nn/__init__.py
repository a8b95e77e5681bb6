"""Attention modules built on :func:`attnkit.attention` (inputs ``(B, L, E)``, batch-first), and the other
parts a Transformer block injects: MLPs and norms by name."""

from attnkit.nn.attention import MultiHeadAttention
from attnkit.nn.linear_attention import LinearAttention, LinearAttentionCache
from attnkit.nn.mlp import MLP, GatedMLP, make_mlp
from attnkit.nn.norms import make_norm

__all__ = ["MultiHeadAttention", "LinearAttention", "LinearAttentionCache", "MLP", "GatedMLP", "make_mlp",
           "make_norm"]

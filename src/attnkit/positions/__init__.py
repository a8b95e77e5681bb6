"""Positional schemes: absolute embeddings added to the input, and relative schemes applied inside attention.

- :class:`Sinusoidal` (fixed, any length) and :class:`Learned` (a trained table) map positions ``(L,)`` or
  ``(B, L)`` to embeddings ``(L, E)`` / ``(B, L, E)`` that are added to token embeddings.
- :class:`RoPE` rotates queries and keys ``(B, H, L, D)`` so scores depend on position differences only; it
  takes long-context scaling (:class:`LinearScaling`, :class:`NTKScaling`, :class:`YaRNScaling`,
  :class:`Llama3Scaling` or a Hugging Face ``rope_scaling`` dict), pairs channels half-split by default or interleaved, and
  :func:`convert_rope_layout` moves projection weights between the two pairings.
- :class:`ALiBi` is a structured bias ``-slope[h] * |i - j|`` (slopes from :func:`alibi_slopes`) that
  backends evaluate per block, or materialise as ``(B|1, H, Lq, Lk)``.

Shape legend: B batch, H heads, L length, E embed_dim, D head_dim.
"""

from attnkit.positions.alibi import ALiBi, alibi_slopes
from attnkit.positions.learned import Learned
from attnkit.positions.rope import RoPE, convert_rope_layout
from attnkit.positions.rope_scaling import LinearScaling, Llama3Scaling, NTKScaling, YaRNScaling
from attnkit.positions.sinusoidal import Sinusoidal

__all__ = [
    "ALiBi",
    "Learned",
    "LinearScaling",
    "Llama3Scaling",
    "NTKScaling",
    "RoPE",
    "Sinusoidal",
    "YaRNScaling",
    "alibi_slopes",
    "convert_rope_layout",
]

"""Sinusoidal absolute position embeddings (Vaswani et al. 2017), computed on the fly for any position.

``PE[p, 2i] = sin(p / base ** (2i / E))`` and ``PE[p, 2i + 1] = cos(p / base ** (2i / E))``: sin on even
channels, cos on odd channels, interleaved as in the paper (fairseq and tensor2tensor concatenate
``[sin | cos]`` instead; the two differ by a fixed channel permutation).

An odd ``embed_dim`` is allowed: the formula defines every channel, so channel ``E - 1`` (even) is a sin with
the ``2i = E - 1`` frequency and there is one more sin than cos channel.

Angles are computed in float64 (float32 on devices without float64, such as MPS) and the output is float32,
so large positions keep full float32 accuracy. There is no maximum length.

Shape legend: B batch, L length, E embed_dim.
"""

from __future__ import annotations

import torch
from torch import nn

from attnkit._checks import integer, number, position_ids


class Sinusoidal(nn.Module):
    """Fixed sinusoidal embeddings: ``forward(positions (L,) | (B, L)) -> (L, E) | (B, L, E)`` float32."""

    def __init__(self, embed_dim: int, base: float = 10000.0):
        super().__init__()
        integer(embed_dim, "embed_dim", low=1, fix="pass the model width E.")
        number(base, "base", low=0, low_open=True, fix="use the paper's base=10000.0.")
        self.embed_dim = embed_dim
        self.base = float(base)

    def extra_repr(self) -> str:
        return f"embed_dim={self.embed_dim}, base={self.base}"

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        position_ids(positions)
        device = positions.device
        compute = torch.float32 if device.type == "mps" else torch.float64
        exponent = torch.arange(0, self.embed_dim, 2, dtype=compute, device=device) / self.embed_dim  # (ceil(E/2),)
        angles = positions.to(compute)[..., None] * self.base ** -exponent  # (..., L, ceil(E/2))
        out = torch.empty(*positions.shape, self.embed_dim, dtype=compute, device=device)  # (..., L, E)
        out[..., 0::2] = angles.sin()  # (..., L, ceil(E/2))
        out[..., 1::2] = angles[..., : self.embed_dim // 2].cos()  # (..., L, floor(E/2))
        return out.float()

"""Learned absolute position embeddings: one trained vector per position in ``[0, max_positions)``.

Positions outside the table raise :class:`attnkit.errors.AttnkitValueError` instead of an opaque index error
(the check reads the min and max of ``positions``, one device synchronisation on an accelerator).

Shape legend: B batch, L length, E embed_dim, P max_positions.
"""

from __future__ import annotations

import torch
from torch import nn

from attnkit._checks import integer, number, position_ids
from attnkit.errors import AttnkitValueError


class Learned(nn.Module):
    """A ``(P, E)`` embedding table: ``forward(positions (L,) | (B, L)) -> (L, E) | (B, L, E)``.

    Weights are initialised from ``N(0, init_std**2)`` (GPT-2 uses 0.02). The output has the table's dtype.
    """

    def __init__(self, max_positions: int, embed_dim: int, init_std: float = 0.02):
        super().__init__()
        self.max_positions = integer(max_positions, "max_positions", low=1, fix="pass the longest sequence length to support.")
        self.embed_dim = integer(embed_dim, "embed_dim", low=1, fix="pass the model width E.")
        self.init_std = number(init_std, "init_std", low=0, fix="use e.g. 0.02.")
        self.embedding = nn.Embedding(max_positions, embed_dim)  # weight (P, E)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.embedding.weight, mean=0.0, std=self.init_std)

    def extra_repr(self) -> str:
        return f"max_positions={self.max_positions}, embed_dim={self.embed_dim}, init_std={self.init_std}"

    def forward(self, positions: torch.Tensor, *, below: int | None = None) -> torch.Tensor:
        """``below``: the caller knows (on the host) that every position lies in ``[0, below)`` (a cache that
        continues its sequence, pads clamped to 0): the range is checked on that bound, nothing read back."""
        position_ids(positions)
        if positions.numel():
            if torch.compiler.is_compiling():  # no host reads: a compiled decode step would specialise on each
                return self.embedding(positions.long())  # step's values and compile again (lengths checked up front)
            low, high = (0, below - 1) if below is not None else (int(positions.min()), int(positions.max()))
            if low < 0:
                raise AttnkitValueError(f"positions must be >= 0, got value {low}; learned positions are absolute "
                                        "indices into the table, starting at 0.")
            if high >= self.max_positions:
                raise AttnkitValueError(
                    f"positions must be < max_positions={self.max_positions}, got value {high}; raise max_positions "
                    f"to at least {high + 1}, or use a scheme without a maximum length (Sinusoidal, RoPE, ALiBi)."
                )
        return self.embedding(positions.long())  # (L, E) or (B, L, E)

"""ALiBi (Press et al. 2022): a per-head linear penalty on query-key distance, added to the scores.

Head ``h`` of ``n`` (a power of two) has slope ``m_h = 2 ** (-8 (h + 1) / n)``: 1/2, 1/4, ..., 1/256 for 8 heads.
For a head count ``H`` that is not a power of two the paper takes the ``n = 2 ** floor(log2 H)`` slopes for
``n`` heads, then every other slope (``[0::2]``) of the ``2n``-head sequence for the remaining ``H - n`` heads.

The bias is ``score(h, i, j) = -m_h * |i - j|`` on absolute positions. Under a causal mask (``j <= i``) this is
the paper's ``-m_h * (i - j)``; it equals BLOOM's ``+m_h * j`` up to the row constant ``-m_h * i``, which
softmax ignores. Taking the absolute distance makes the same module the usual symmetric variant for
bidirectional (encoder) attention, instead of rewarding keys after the query.

:class:`ALiBi` is a :class:`attnkit._bias.StructuredBias`: backends evaluate ``score`` per block (or in flex
attention's ``score_mod``) instead of materialising ``(B, H, Lq, Lk)``.

Shape legend: B batch, H heads, Lq/Lk query/key lengths.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from attnkit._bias import StructuredBias
from attnkit._checks import integer
from attnkit.errors import AttnkitTypeError, AttnkitValueError, describe


def _power_of_two_slopes(n: int) -> list[float]:
    return [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]  # start = ratio = 2 ** (-8 / n)


def _slopes(num_heads: int) -> list[float]:
    n = 2 ** math.floor(math.log2(num_heads))  # closest power of two <= num_heads
    if n == num_heads:
        return _power_of_two_slopes(n)
    return _power_of_two_slopes(n) + _slopes(2 * n)[0::2][: num_heads - n]


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """ALiBi slopes ``(H,)`` float32 for ``num_heads`` heads, per the paper (computed in float64, then rounded)."""
    num_heads = integer(num_heads, "num_heads", low=1, fix="pass the number of query heads.")
    return torch.tensor(_slopes(num_heads), dtype=torch.float64).float()  # (H,)


def _check_slopes(slopes: object, num_heads: int) -> torch.Tensor:
    if not isinstance(slopes, torch.Tensor) or not slopes.dtype.is_floating_point:
        raise AttnkitTypeError(f"ALiBi slopes must be a float tensor (H,) or (B, H), got {describe(slopes)}; pass "
                               "e.g. torch.tensor([0.5, 0.25]) or omit it for the paper's slopes.")
    if slopes.dim() not in (1, 2) or slopes.shape[-1] != num_heads:
        raise AttnkitValueError(f"ALiBi slopes must have shape ({num_heads},) or (B, {num_heads}) for num_heads="
                                f"{num_heads}, got {describe(slopes)}; give one slope per head (per batch row).")
    if not bool(torch.isfinite(slopes.detach()).all()):
        raise AttnkitValueError(f"ALiBi slopes must be finite, got {describe(slopes)}; replace inf/NaN slopes.")
    return slopes


class ALiBi(nn.Module, StructuredBias):
    """ALiBi bias for ``num_heads`` query heads: ``score(h, q_pos, kv_pos) = -slopes[h] * |q_pos - kv_pos|``.

    ``slopes`` defaults to the paper's (a non-persistent float32 buffer ``(H,)``). Any slopes may be given
    instead: ``(H,)`` per head or ``(B, H)`` per batch row and head (finite floats, kept as a float32 buffer
    that is saved with the module; an ``nn.Parameter`` stays a trainable parameter). Per-row slopes are
    evaluated per entry (no shared offset table). ``forward`` is :meth:`materialize`: a dense float32 bias
    ``(B|1, H, Lq, Lk)`` from positions ``(B|1, Lq)`` and ``(B|1, Lk)``.
    """

    slopes: torch.Tensor

    def __init__(self, num_heads: int, slopes: torch.Tensor | None = None):
        super().__init__()
        self.num_heads = integer(num_heads, "num_heads", low=1, fix="pass the number of query heads.")
        if slopes is None:
            self.register_buffer("slopes", alibi_slopes(num_heads), persistent=False)
        else:
            slopes = _check_slopes(slopes, self.num_heads)
            if isinstance(slopes, nn.Parameter):
                self.slopes = slopes
            else:
                self.register_buffer("slopes", slopes.detach().float())
        self.batch = 1 if self.slopes.dim() == 1 else self.slopes.shape[0]
        self.relative = self.batch == 1  # -m_h * |q_pos - kv_pos| depends only on the head and the offset
        self.causal_linear = self.relative  # -m_h * (q_pos - kv_pos) for kv_pos <= q_pos

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}" + (f", batch={self.batch}" if self.batch > 1 else "")

    def score(self, h: torch.Tensor, q_pos: torch.Tensor, kv_pos: torch.Tensor,
              b: torch.Tensor | None = None) -> torch.Tensor:
        """Bias ``-slopes[(b,) h] * |q_pos - kv_pos|`` as float32, broadcasting its arguments (``b``, the batch
        row, is needed for per-row slopes)."""
        slopes = self.slopes.to(device=q_pos.device, dtype=torch.float32)  # (H,) or (B, H)
        if slopes.dim() == 2:
            if b is None:
                raise AttnkitValueError(f"ALiBi with per-row slopes {tuple(slopes.shape)} needs the batch index b; "
                                        "call score(h, q_pos, kv_pos, b=...).")
            m = slopes[b, h]
        else:
            m = slopes[h]
        return -m * (q_pos - kv_pos).abs().to(torch.float32)

    def needs_grad(self, device: torch.device) -> bool:
        """Whether the slopes, the score's only tensor, require grad: read, not scored (scoring one entry took
        ~0.1 ms per call on a busy CPU, 12% of a bfloat16 ALiBi call at N = 512); a subclass with a score of
        its own is scored."""
        if type(self).score is not ALiBi.score:
            return super().needs_grad(device)
        return self.slopes.requires_grad

    def memo_key(self):
        """``("alibi", slopes...)`` for fixed per-head slopes; None for trainable or per-row slopes."""
        if self.batch > 1 or self.slopes.requires_grad:
            return None
        return ("alibi", *self.slopes.tolist())

    def reach(self, margin: torch.Tensor) -> torch.Tensor | None:
        """``margin / slopes``: beyond this distance head h's penalty exceeds ``margin[h]``; ``(H,)`` float
        (None when a slope is negative or per row: the penalty then does not fall with distance per head)."""
        slopes = self.slopes.detach().to(device=margin.device, dtype=torch.float64)
        if slopes.dim() != 1 or bool((slopes < 0).any()):
            return None
        return margin.to(torch.float64) / slopes

    def forward(self, q_positions: torch.Tensor, kv_positions: torch.Tensor) -> torch.Tensor:
        return self.materialize(q_positions, kv_positions)

"""Per-head attention metrics and health verdicts.

For probabilities ``p`` of shape ``(B, H, Lq, Lk)`` and the visible keys of each row (from the mask):

- ``entropy``: ``-sum_j p_ij log p_ij`` in nats, mean over rows;
- ``norm_entropy``: entropy / log(number of visible keys): 0 = one-hot, 1 = uniform over what it may see;
- ``max_prob``: the largest probability of the row, mean over rows;
- ``sink_mass``: probability on the first key (position 0 of the keys: the "attention sink"), mean over rows;
- ``distance``: ``sum_j p_ij |pos_i - pos_j|``, mean over rows (how far a head looks, in tokens);
- ``masked_mass``: the largest total probability on masked keys over all rows — must be exactly 0.

Rows with fewer than 2 visible keys (the first token under a causal mask, fully masked rows) carry no
information about a head and are left out of every mean; ``masked_mass`` covers all rows.

Verdicts (thresholds in :class:`HealthThresholds`, documented in docs/readme/diagnostics.md):

- ``collapsed``: near one-hot — mean ``max_prob >= 0.95``;
- ``uniform``: near log n entropy — mean ``norm_entropy >= 0.98`` (normal at initialisation, a warning sign
  after training: the head attends to everything equally and learned nothing);
- ``healthy`` otherwise.

Shape legend: B batch, H heads, Lq/Lk lengths.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True)
class HealthThresholds:
    """Where a head stops being healthy. ``max_logit``: attention logits (pre-softmax scores) above this
    saturate the softmax (Gemma 2 caps them at 50); ``growth_window``: the monitor warns when the max logit
    has risen at each of that many checks and doubled over them."""

    collapsed_max_prob: float = 0.95
    uniform_norm_entropy: float = 0.98
    masked_mass_tol: float = 1e-6
    max_logit: float = 50.0
    growth_window: int = 5


@dataclass
class HeadMetrics:
    """Metrics of one layer's heads; every field is a list with one float per head."""

    entropy: list[float]
    norm_entropy: list[float]
    max_prob: list[float]
    sink_mass: list[float]
    distance: list[float]
    masked_mass: list[float]

    def verdicts(self, thresholds: HealthThresholds = HealthThresholds()) -> list[str]:
        """``"collapsed"``, ``"uniform"`` or ``"healthy"`` per head (``"empty"`` with no informative row)."""
        return [verdict(mp, ne, thresholds) for mp, ne in zip(self.max_prob, self.norm_entropy)]

    def to_dict(self) -> dict:
        return asdict(self)


def verdict(max_prob: float, norm_entropy: float, thresholds: HealthThresholds = HealthThresholds()) -> str:
    """The health verdict of one head from its mean max probability and normalised entropy."""
    if math.isnan(max_prob) or math.isnan(norm_entropy):
        return "empty"
    if max_prob >= thresholds.collapsed_max_prob:
        return "collapsed"
    if norm_entropy >= thresholds.uniform_norm_entropy:
        return "uniform"
    return "healthy"


def head_metrics(weights: torch.Tensor, allowed: torch.Tensor | None = None,
                 q_positions: torch.Tensor | None = None, kv_positions: torch.Tensor | None = None) -> HeadMetrics:
    """Metrics per head of probabilities ``weights (B, H, Lq, Lk)``.

    ``allowed``: boolean mask broadcastable to ``(B, H, Lq, Lk)`` (True = may attend), None = all visible.
    ``q_positions``/``kv_positions``: ``(B|1, Lq)``/``(B|1, Lk)`` for the distance (default: bottom-right
    aligned aranges).
    """
    p = weights.detach().double()  # (B, H, Lq, Lk)
    B, H, Lq, Lk = p.shape
    visible = torch.ones_like(p, dtype=torch.bool) if allowed is None else allowed.to(p.device).expand(B, H, Lq, Lk)
    if q_positions is None:
        q_positions = torch.arange(Lk - Lq, Lk, device=p.device)[None]  # (1, Lq)
    if kv_positions is None:
        kv_positions = torch.arange(Lk, device=p.device)[None]  # (1, Lk)
    n_visible = visible.sum(-1)  # (B, H, Lq)
    informative = (n_visible >= 2).double()  # (B, H, Lq)
    rows = informative.sum(dim=(0, 2))  # (H,)

    def row_mean(per_row: torch.Tensor) -> list[float]:
        """(B, H, Lq) -> one mean per head over informative rows (NaN when there is none)."""
        total = (per_row * informative).sum(dim=(0, 2))
        return torch.where(rows > 0, total / rows.clamp_min(1), torch.full_like(total, math.nan)).tolist()

    plogp = torch.where(p > 0, p * p.clamp_min(1e-300).log(), torch.zeros_like(p))
    entropy = -plogp.sum(-1)  # (B, H, Lq)
    norm_entropy = entropy / n_visible.clamp_min(2).double().log()
    dist = (q_positions[:, None, :, None] - kv_positions[:, None, None, :]).abs().double()  # (B|1, 1, Lq, Lk)
    masked = torch.where(visible, torch.zeros_like(p), p).sum(-1)  # (B, H, Lq)
    return HeadMetrics(
        entropy=row_mean(entropy),
        norm_entropy=row_mean(norm_entropy),
        max_prob=row_mean(p.amax(-1)),
        sink_mass=row_mean(p[..., 0]),
        distance=row_mean((p * dist).sum(-1)),
        masked_mass=masked.amax(dim=(0, 2)).tolist() if masked.numel() else [0.0] * H,
    )


def record_metrics(record) -> HeadMetrics:
    """:func:`head_metrics` of a :class:`~attnkit.diagnostics.capture.Record` (its selected heads and rows)."""
    return head_metrics(record.weights, record.allowed, record.q_positions, record.kv_positions)


def max_logit(record) -> float:
    """The largest finite ``|score|`` of a record captured with ``scores=True`` (NaN when none is finite)."""
    if record.scores is None:
        return math.nan
    finite = record.scores[torch.isfinite(record.scores)]
    return float(finite.abs().max()) if finite.numel() else math.nan

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


#: query rows per slab in :func:`head_metrics`: B * H * rows * Lk stays near this many elements (a few MiB)
SLAB_ELEMENTS = 1 << 22


def head_metrics(weights: torch.Tensor, allowed: torch.Tensor | None = None,
                 q_positions: torch.Tensor | None = None, kv_positions: torch.Tensor | None = None) -> HeadMetrics:
    """Metrics per head of probabilities ``weights (B, H, Lq, Lk)``.

    ``allowed``: boolean mask broadcastable to ``(B, H, Lq, Lk)`` (True = may attend), None = all visible.
    ``q_positions``/``kv_positions``: ``(B|1, Lq)``/``(B|1, Lk)`` for the distance (default: bottom-right
    aligned aranges).

    Computed in slabs of query rows (nothing of size ``B*H*Lq*Lk`` is allocated beyond the input; keys past a
    slab's last visible one are skipped when they hold no mass, half the work under a causal mask), elementwise
    in the weights' precision (float32 for float32/bf16/fp16 weights), every row sum in float64 (a float32 log
    is several times cheaper than a float64 one; ``attnkit bench report`` times both paths).
    Against :func:`head_metrics_reference` (all float64): ``max_prob``, ``sink_mass`` and ``masked_mass`` are
    exact up to the order of the float64 sum; a row's entropy is within ``3 u entropy`` and its distance within
    ``u distance`` (``u = 2**-24``: the float32 log and product round each term once or twice; the float64 sum
    adds ~1e-16), so at 2048 keys entropy is off by < 2e-6 nats and distance by < 1.3e-4 tokens, below the
    report's 3 decimals.
    """
    w = weights.detach()
    B, H, Lq, Lk = w.shape
    dtype = torch.float64 if w.dtype == torch.float64 else torch.float32
    if q_positions is None:
        q_positions = torch.arange(Lk - Lq, Lk, device=w.device)[None]  # (1, Lq)
    if kv_positions is None:
        kv_positions = torch.arange(Lk, device=w.device)[None]  # (1, Lk)
    forbidden = None
    if allowed is not None:
        allowed = allowed.to(w.device)
        allowed = allowed.reshape((1,) * (4 - allowed.dim()) + tuple(allowed.shape))  # (B|1, H|1, Lq|1, Lk)
        forbidden = (~allowed).to(dtype)  # 1.0 where masked: p * forbidden is exact (and fast, unlike where)
    entropy, max_prob, distance, masked = (w.new_zeros(B, H, Lq, dtype=torch.float64) for _ in range(4))
    distances = (q_positions[:, :, None] - kv_positions[:, None, :]).abs().to(dtype)  # (B|1, Lq, Lk), exact ints
    tiny = torch.finfo(dtype).tiny  # p log p -> 0 at p = 0 (changes nothing above the smallest normal)
    step = max(1, SLAB_ELEMENTS // max(1, B * H * Lk))
    for r0 in range(0, Lq, step):
        rows = slice(r0, min(Lq, r0 + step))
        p = w[:, :, rows].to(dtype)  # (B, H, r, Lk)
        dist = distances[:, rows]  # (B|1, r, Lk)
        if forbidden is not None:
            f = forbidden[:, :, rows] if forbidden.shape[2] != 1 else forbidden  # (B|1, H|1, r|1, Lk)
            k = _extent(f)
            if k < Lk and not p[..., k:].any():  # keys past the slab's last visible one hold no mass: skip them
                p, f, dist = p[..., :k], f[..., :k], dist[..., :k]
            leak = p * f  # (B, H, r, k): exact (f is 0 or 1)
            if leak.any():  # NaN counts as any: a NaN leak is reported, not skipped
                masked[:, :, rows] = leak.double().sum(-1)
        entropy[:, :, rows] = -(p * p.clamp_min(tiny).log()).double().sum(-1)
        max_prob[:, :, rows] = p.amax(-1).double()
        distance[:, :, rows] = (p * dist[:, None]).double().sum(-1)
    n_visible = torch.full((1, 1, 1), Lk, device=w.device) if allowed is None else allowed.sum(-1)  # (B|1, H|1, Lq|1)
    return _summarise(w[..., 0].double(), entropy, max_prob, distance, masked, n_visible.expand(B, H, Lq))


def _extent(forbidden: torch.Tensor) -> int:
    """One past the last key column any row of the slab may see (>= 1), from ``forbidden (.., r, Lk)``."""
    visible = (forbidden == 0).reshape(-1, forbidden.shape[-1]).any(0)  # (Lk,)
    return int(visible.nonzero().max()) + 1 if visible.any() else 1


def _summarise(sink: torch.Tensor, entropy: torch.Tensor, max_prob: torch.Tensor, distance: torch.Tensor,
               masked: torch.Tensor, n_visible: torch.Tensor) -> HeadMetrics:
    """Per-row float64 quantities ``(B, H, Lq)`` -> the per-head means over informative rows."""
    informative = (n_visible >= 2).double()  # (B, H, Lq)
    rows = informative.sum(dim=(0, 2))  # (H,)

    def row_mean(per_row: torch.Tensor) -> list[float]:
        """(B, H, Lq) -> one mean per head over informative rows (NaN when there is none)."""
        total = (per_row * informative).sum(dim=(0, 2))
        return torch.where(rows > 0, total / rows.clamp_min(1), torch.full_like(total, math.nan)).tolist()

    return HeadMetrics(
        entropy=row_mean(entropy),
        norm_entropy=row_mean(entropy / n_visible.clamp_min(2).double().log()),
        max_prob=row_mean(max_prob),
        sink_mass=row_mean(sink),
        distance=row_mean(distance),
        masked_mass=masked.amax(dim=(0, 2)).tolist() if masked.numel() else [0.0] * masked.shape[1],
    )


def head_metrics_reference(weights: torch.Tensor, allowed: torch.Tensor | None = None,
                           q_positions: torch.Tensor | None = None, kv_positions: torch.Tensor | None = None) -> HeadMetrics:
    """The float64 oracle of :func:`head_metrics`: every elementwise step and sum in float64 on the whole
    ``(B, H, Lq, Lk)`` tensor at once (tests and ``attnkit bench report`` compare the fast path with it).

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
    plogp = torch.where(p > 0, p * p.clamp_min(1e-300).log(), torch.zeros_like(p))
    dist = (q_positions[:, None, :, None] - kv_positions[:, None, None, :]).abs().double()  # (B|1, 1, Lq, Lk)
    masked = torch.where(visible, torch.zeros_like(p), p).sum(-1)  # (B, H, Lq)
    return _summarise(p[..., 0], -plogp.sum(-1), p.amax(-1), (p * dist).sum(-1), masked, n_visible)


def record_metrics(record) -> HeadMetrics:
    """:func:`head_metrics` of a :class:`~attnkit.diagnostics.capture.Record` (its selected heads and rows)."""
    return head_metrics(record.weights, record.allowed, record.q_positions, record.kv_positions)


def max_logit(record) -> float:
    """The largest finite ``|score|`` of a record captured with ``scores=True`` (NaN when none is finite)."""
    if record.scores is None:
        return math.nan
    finite = record.scores[torch.isfinite(record.scores)]
    return float(finite.abs().max()) if finite.numel() else math.nan

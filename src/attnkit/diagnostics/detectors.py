"""Head detectors as interpretability users know them (TransformerLens' ``detect_head``): how much of each head's
attention falls where a previous-token, duplicate-token or induction head would put it, on one token sequence.

>>> import torch
>>> from attnkit.models.builders import build_lm
>>> from attnkit.diagnostics.detectors import detect_heads
>>> scores = detect_heads(build_lm("nano").eval(), torch.tensor([[5, 9, 12, 5, 9, 12]]))
>>> sorted(scores), tuple(scores["previous_token"].shape)
(['duplicate_token', 'induction', 'previous_token'], (2, 2))

The score is TransformerLens' (``transformer_lens.head_detector``, ``error_measure="mul"``, its default), so numbers
carry over from its papers and tutorials: with ``A`` a head's attention pattern ``(L, L)`` on the sequence and ``P``
the detector's 0/1 pattern, ``score = sum(A * P) / sum(A)``: the share of the head's attention on the positions the
pattern names (1 = a perfect head of that kind). ``exclude_bos`` zeroes ``A``'s first column and
``exclude_current_token`` its diagonal before both sums, as there. The patterns (lower-triangular, ``(L, L)``):

- ``previous_token``: ``P[i, i-1] = 1``;
- ``duplicate_token``: ``P[i, j] = 1`` for ``j < i`` with ``token[j] == token[i]`` (an earlier copy of itself);
- ``induction``: the duplicate pattern shifted one key right: ``P[i, j] = 1`` where ``token[j-1] == token[i]``,
  ``j - 1 < i`` (the token after an earlier copy: what comes next last time), column 0 never.

A sequence with repeats is what makes the last two mean anything (a random run of tokens, twice: the standard
induction probe); without any repeat their pattern is all zero and the score 0. Any model whose attention goes
through ``attnkit.attention`` (attnkit models; transformers models through the attention interface): the weights
come from :func:`attnkit.diagnostics.report.collect.collect` (one forward). Checked against TransformerLens itself
(its forward and ``detect_head`` on the same GPT-2 weights) in tests/diagnostics/test_detectors_lens.py.

Shape legend: H heads, L tokens.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from attnkit.errors import AttnkitTypeError, AttnkitValueError, describe

#: detector name -> tokens (L,) -> its 0/1 pattern (L, L) float64, lower-triangular
DETECTORS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {}


def register_detector(name: str, pattern: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Add a detector: ``pattern(tokens (L,)) -> (L, L)`` 0/1 float, lower-triangular (a query's keys at or before it)."""
    DETECTORS[name] = pattern


def previous_token_pattern(tokens: torch.Tensor) -> torch.Tensor:
    L = tokens.shape[-1]
    return torch.diag(torch.ones(L - 1, dtype=torch.float64), -1)  # (L, L): ones just below the diagonal


def duplicate_token_pattern(tokens: torch.Tensor) -> torch.Tensor:
    t = tokens.reshape(-1)
    same = (t[:, None] == t[None, :]).double()  # (L, L): token j equals token i
    return torch.tril(same, -1)  # earlier copies only (never the token itself)


def induction_pattern(tokens: torch.Tensor) -> torch.Tensor:
    dup = duplicate_token_pattern(tokens)  # (L, L)
    shifted = torch.zeros_like(dup)
    shifted[:, 1:] = dup[:, :-1]  # key j marked where key j-1 is an earlier copy of the query's token
    return torch.tril(shifted)


register_detector("previous_token", previous_token_pattern)
register_detector("duplicate_token", duplicate_token_pattern)
register_detector("induction", induction_pattern)


def head_scores(weights: torch.Tensor, pattern: torch.Tensor, *, exclude_bos: bool = False,
                exclude_current_token: bool = False) -> list[float]:
    """TransformerLens' ``mul`` score of each head: ``weights (H, L, L)``, ``pattern (L, L)`` -> H floats (see the
    module docstring), summed in float64; NaN for a head with no attention left to score."""
    if weights.dim() != 3 or weights.shape[-1] != weights.shape[-2] or pattern.shape != weights.shape[-2:]:
        raise AttnkitValueError(f"head_scores needs square weights (H, L, L) and a pattern (L, L), got weights "
                                f"{tuple(weights.shape)} and pattern {tuple(pattern.shape)}.")
    a = weights.double().clone()  # (H, L, L)
    if exclude_bos:
        a[:, :, 0] = 0
    if exclude_current_token:
        a.diagonal(dim1=-2, dim2=-1).zero_()
    total = a.sum((-2, -1))  # (H,)
    hit = (a * pattern.to(a.device)).sum((-2, -1))  # (H,)
    return torch.where(total > 0, hit / total.where(total > 0, torch.ones_like(total)),
                       torch.full_like(total, float("nan"))).tolist()


def layer_scores(weights: torch.Tensor, tokens: torch.Tensor, **options) -> dict[str, list[float]]:
    """Every registered detector's scores of one layer's heads: ``weights (H, L, L)`` on ``tokens (L,)``."""
    return {name: head_scores(weights, pattern(tokens.reshape(-1).cpu()), **options) for name, pattern in DETECTORS.items()}


def detect_heads(model: nn.Module, tokens, *, exclude_bos: bool = False,
                 exclude_current_token: bool = False) -> dict[str, torch.Tensor]:
    """``{detector: scores (layers, heads)}`` of ``model`` on ``tokens`` (ids ``(L,)`` / ``(1, L)``, a list of
    ids), float64, NaN where a layer has fewer heads than the widest. One forward (no gradient, eval mode)."""
    from attnkit.diagnostics.report.collect import collect

    if not isinstance(model, nn.Module):
        raise AttnkitTypeError(f"detect_heads(model=...) must be a torch.nn.Module, got {describe(model)}.")
    if isinstance(tokens, (list, tuple)):
        tokens = torch.tensor(tokens)
    if not isinstance(tokens, torch.Tensor) or tokens.dtype not in (torch.int64, torch.int32) or tokens.numel() < 2 \
            or tokens.dim() not in (1, 2) or (tokens.dim() == 2 and tokens.shape[0] != 1):
        raise AttnkitValueError(f"tokens must be one sequence of at least 2 token ids ((L,) or (1, L) ints), got "
                                f"{describe(tokens)}.")
    ids = tokens.reshape(1, -1).long()  # (1, L)
    device = next(iter(model.parameters()), torch.empty(0)).device
    data = collect(model, ids.to(device), [str(t) for t in ids[0].tolist()])
    width = max(layer.num_heads for layer in data.layers)
    out = {name: torch.full((len(data.layers), width), float("nan"), dtype=torch.float64) for name in DETECTORS}
    for l, layer in enumerate(data.layers):
        scores = layer_scores(layer.weights, ids[0], exclude_bos=exclude_bos, exclude_current_token=exclude_current_token)
        for name, values in scores.items():
            out[name][l, :len(values)] = torch.tensor(values, dtype=torch.float64)
    return out


def top_heads(scores: torch.Tensor, k: int = 3) -> list[tuple[tuple[int, int], float]]:
    """The ``k`` highest ``((layer, head), score)`` of a ``(layers, heads)`` score table (NaN last)."""
    flat = torch.nan_to_num(scores, nan=float("-inf")).reshape(-1)
    order = torch.argsort(flat, descending=True)[:k].tolist()
    width = scores.shape[1]
    return [((i // width, i % width), float(scores.reshape(-1)[i])) for i in order]


__all__ = ["DETECTORS", "detect_heads", "duplicate_token_pattern", "head_scores", "induction_pattern", "layer_scores",
           "previous_token_pattern", "register_detector", "top_heads"]

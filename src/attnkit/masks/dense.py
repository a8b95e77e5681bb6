"""Binding masks to a call (:class:`MaskContext`, the bound function :data:`BoundMask`) and materialising them
as dense boolean tensors. Below every other module of ``masks/``: it imports none of them.

Shape legend: B batch, H heads, Lq/Lk query/key lengths.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from attnkit._checks import position_ids
from attnkit.errors import AttnkitTypeError, AttnkitValueError, describe

if TYPE_CHECKING:
    from attnkit.masks.spec import MaskSpec

# fn(b, h, q_idx, kv_idx) -> bool tensor, all arguments broadcasting int64 tensors
BoundMask = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class MaskContext:
    """What a mask is bound to: positions ``(B, Lq)`` / ``(B, Lk)`` int64, already broadcast to one batch."""

    q_positions: torch.Tensor
    kv_positions: torch.Tensor

    @property
    def batch(self) -> int:
        return self.q_positions.shape[0]

    @property
    def q_len(self) -> int:
        return self.q_positions.shape[1]

    @property
    def kv_len(self) -> int:
        return self.kv_positions.shape[1]

    @property
    def device(self) -> torch.device:
        return self.q_positions.device


def default_positions(q_len: int, kv_len: int, device: torch.device | str | None = None):
    """Bottom-right aligned defaults: keys at ``arange(Lk)``, queries at the last Lq of them. ``(1, L)`` each.

    With Lq > Lk the first Lq - Lk queries sit at negative positions, before every key (flash-attn's and
    PyTorch's ``causal_lower_right``): a causal or window mask gives them no visible key, so their rows are 0."""
    kv = torch.arange(kv_len, device=device).unsqueeze(0)  # (1, Lk)
    q = torch.arange(kv_len - q_len, kv_len, device=device).unsqueeze(0)  # (1, Lq); starts below 0 when Lq > Lk
    return q, kv


def _as_positions(value: torch.Tensor | int, name: str) -> torch.Tensor | int:
    if isinstance(value, bool) or not isinstance(value, (int, torch.Tensor)):
        raise AttnkitTypeError(f"{name} must be an int64 tensor (L,)/(B, L) or a length int, got {describe(value)}.")
    if isinstance(value, torch.Tensor):
        return position_ids(value, name, length=value.shape[-1] if value.dim() else None)  # (B|1, L)
    if value < 0:
        raise AttnkitValueError(f"{name} as a length must be >= 0, got {value}.")
    return value


def context_for(
    mask: MaskSpec,
    q_positions: torch.Tensor | int,
    kv_positions: torch.Tensor | int | None = None,
    *,
    batch: int | None = None,
) -> MaskContext:
    """Normalise positions (tensors or lengths) and broadcast them to one batch size."""
    qp = _as_positions(q_positions, "q_positions")
    kvp = qp if kv_positions is None else _as_positions(kv_positions, "kv_positions")
    device = next((t.device for t in (qp, kvp) if isinstance(t, torch.Tensor)), None)
    if isinstance(qp, int) or isinstance(kvp, int):
        q_len = qp if isinstance(qp, int) else qp.shape[1]
        kv_len = kvp if isinstance(kvp, int) else kvp.shape[1]
        dq, dkv = default_positions(q_len, kv_len, device)
        qp = dq if isinstance(qp, int) else qp
        kvp = dkv if isinstance(kvp, int) else kvp
    sizes = {qp.shape[0], kvp.shape[0], mask.batch, batch or 1} - {1}
    if len(sizes) > 1:
        raise AttnkitValueError(f"batch sizes disagree: positions {qp.shape[0]}/{kvp.shape[0]}, mask data "
                                f"{mask.batch}, batch={batch}; use one batch size (or 1 to broadcast).")
    b = sizes.pop() if sizes else 1
    return MaskContext(qp.expand(b, -1), kvp.expand(b, -1))


def evaluate(fn: BoundMask, ctx: MaskContext, heads: int = 1) -> torch.Tensor:
    """Evaluate a bound mask on the whole grid: bool ``(B, heads, Lq, Lk)``."""
    dev = ctx.device
    b = torch.arange(ctx.batch, device=dev).view(-1, 1, 1, 1)  # (B, 1, 1, 1)
    h = torch.arange(heads, device=dev).view(1, -1, 1, 1)  # (1, heads, 1, 1)
    q_idx = torch.arange(ctx.q_len, device=dev).view(1, 1, -1, 1)  # (1, 1, Lq, 1)
    kv_idx = torch.arange(ctx.kv_len, device=dev).view(1, 1, 1, -1)  # (1, 1, 1, Lk)
    out = fn(b, h, q_idx, kv_idx)
    return out.expand(ctx.batch, heads, ctx.q_len, ctx.kv_len)


def materialize(
    mask: MaskSpec | torch.Tensor | None, q_positions: torch.Tensor, kv_positions: torch.Tensor
) -> torch.Tensor | None:
    """The dense boolean mask of a call, broadcastable to ``(B, H, Lq, Lk)``; ``None`` when there is no mask.

    ``q_positions``/``kv_positions`` are the call's normalised ``(B|1, L)`` positions. Bool tensors pass
    through untouched (they are already dense); a prepared mask gives its own (cached) dense form.
    """
    if mask is None:
        return None
    if isinstance(mask, torch.Tensor):
        return mask
    if hasattr(mask, "dense"):  # a PreparedMask: already bound to the call (its dense form is kept)
        return mask.dense()
    ctx = context_for(mask, q_positions, kv_positions)
    return evaluate(mask.bind(ctx), ctx, heads=mask.heads)

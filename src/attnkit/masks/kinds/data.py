"""Masks that carry data, read by index rather than position: padding, packed documents, a dense tensor.

Shape legend: B batch, H heads, Lq/Lk query/key lengths, L a sequence's length.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from attnkit.errors import AttnkitTypeError, AttnkitValueError, describe
from attnkit.masks.blocks import BlockCover, BlockGrid, cover, overlap, single_equal, tiles_of
from attnkit.masks.dense import BoundMask, MaskContext
from attnkit.masks.spec import MaskSpec, _check_batch


class Padding(MaskSpec):
    """Keys that are padding are masked. ``key_is_real``: bool ``(B, Lk)`` (True = real) or lengths ``(B,)``
    (the first ``lengths[b]`` keys of row b are real, i.e. right padding)."""

    kind = "padding"

    def __init__(self, key_is_real_or_lengths: torch.Tensor | Sequence[int]):
        data = torch.as_tensor(key_is_real_or_lengths)
        if data.dtype == torch.bool and data.dim() == 2:
            self.key_is_real, self.lengths = data, None
        elif not data.dtype.is_floating_point and data.dtype != torch.bool and data.dim() == 1:
            if bool((data < 0).any()):
                raise AttnkitValueError(f"padding lengths must be >= 0, got {describe(data)}; pass the number "
                                        "of real tokens per row.")
            self.key_is_real, self.lengths = None, data.long()
        else:
            raise AttnkitValueError(
                f"padding(...) expects a bool tensor (B, Lk) with True = real token, or int lengths (B,); got "
                f"{describe(key_is_real_or_lengths)}. Fix: pass attention_mask.bool() (HF style) or lengths."
            )
        self.batch = data.shape[0]

    def natural_length(self) -> int | None:
        if self.key_is_real is not None:
            return self.key_is_real.shape[1]
        return int(self.lengths.max()) if self.lengths.numel() else None

    def key_mask(self, batch: int, length: int) -> torch.Tensor:
        """The real keys as bool ``(batch, Lk)`` (True = real): ``key_is_real``, or the first ``lengths[b]`` of at
        least ``length`` keys."""
        if self.key_is_real is not None:
            return self.key_is_real.expand(batch, -1)  # (B, Lk)
        lk = max(length, int(self.lengths.max()) if self.lengths.numel() else 0)
        return (torch.arange(lk, device=self.lengths.device)[None, :] < self.lengths[:, None]).expand(batch, -1)

    def bind(self, ctx: MaskContext) -> BoundMask:
        _check_batch(self, ctx)
        if self.key_is_real is not None:
            if self.key_is_real.shape[1] != ctx.kv_len:
                raise AttnkitValueError(
                    f"padding mask covers {self.key_is_real.shape[1]} keys but the call has Lk={ctx.kv_len}; "
                    "pass key_is_real of shape (B, Lk) for the keys of this call (cache included)."
                )
            real = self.key_is_real.to(ctx.device).expand(ctx.batch, -1)  # (B, Lk)
            return lambda b, h, q_idx, kv_idx: real[b, kv_idx]
        lengths = self.lengths.to(ctx.device).expand(ctx.batch)  # (B,)
        return lambda b, h, q_idx, kv_idx: kv_idx < lengths[b]

    def __repr__(self) -> str:
        what = "key_is_real" if self.key_is_real is not None else f"lengths={self.lengths.tolist()}"
        return f"padding({what})" if len(what) < 60 else "padding(...)"


class Document(MaskSpec):
    """Packed sequences: a token attends only within its own document. ``doc_ids``: int ``(B, Lk)``.

    Queries are the last Lq tokens of the keys' sequence (bottom-right), unless ``q_doc_ids`` ``(B, Lq)`` is
    given. Combine with ``causal()`` for decoders; positions should restart at each document.
    """

    kind = "document"

    def __init__(self, doc_ids: torch.Tensor, q_doc_ids: torch.Tensor | None = None):
        self.doc_ids = _doc_tensor(doc_ids, "doc_ids")
        self.q_doc_ids = None if q_doc_ids is None else _doc_tensor(q_doc_ids, "q_doc_ids")
        self.batch = self.doc_ids.shape[0]

    @property
    def queries_from_keys(self) -> bool:
        return self.q_doc_ids is None

    def natural_length(self) -> int | None:
        return self.doc_ids.shape[1]

    def bind(self, ctx: MaskContext) -> BoundMask:
        _check_batch(self, ctx)
        q_doc, kv_doc = self.ids_for(ctx)  # (B, Lq), (B, Lk)
        return lambda b, h, q_idx, kv_idx: q_doc[b, q_idx] == kv_doc[b, kv_idx]

    def ids_for(self, ctx: MaskContext) -> tuple[torch.Tensor, torch.Tensor]:
        """Document ids of the call's queries ``(B, Lq)`` and keys ``(B, Lk)``, checked against its lengths."""
        kv_doc = self.doc_ids.to(ctx.device).expand(ctx.batch, -1)  # (B, Lk)
        if kv_doc.shape[1] != ctx.kv_len:
            raise AttnkitValueError(
                f"doc_ids has length {kv_doc.shape[1]} but the call has Lk={ctx.kv_len}; pass one document id "
                "per key, shape (B, Lk)."
            )
        if self.q_doc_ids is not None:
            q_doc = self.q_doc_ids.to(ctx.device).expand(ctx.batch, -1)  # (B, Lq)
            if q_doc.shape[1] != ctx.q_len:
                raise AttnkitValueError(f"q_doc_ids has length {q_doc.shape[1]} but the call has Lq={ctx.q_len}; "
                                        "pass one document id per query, shape (B, Lq).")
            return q_doc, kv_doc
        if ctx.q_len > ctx.kv_len:
            raise AttnkitValueError(
                f"document(doc_ids) has no ids for Lq={ctx.q_len} queries against Lk={ctx.kv_len} keys (by default the "
                "queries are the last Lq keys); pass q_doc_ids=... with one document id per query.")
        return kv_doc[:, ctx.kv_len - ctx.q_len:], kv_doc  # queries are the last Lq tokens

    def __repr__(self) -> str:
        return f"document(doc_ids{tuple(self.doc_ids.shape)})"


def _doc_tensor(ids: object, name: str) -> torch.Tensor:
    data = torch.as_tensor(ids)
    if data.dtype.is_floating_point or data.dtype == torch.bool or data.dim() not in (1, 2):
        raise AttnkitValueError(f"{name} must be an int tensor (B, L) (or (L,)), got {describe(ids)}; give each "
                                "token the index of its document, e.g. [0, 0, 0, 1, 1, 2].")
    return data.long().reshape(-1, data.shape[-1])  # (B, L)


class Dense(MaskSpec):
    """A boolean tensor broadcastable to ``(B, H, Lq, Lk)`` wrapped as a mask (indices, not positions)."""

    kind = "dense"

    def __init__(self, tensor: torch.Tensor):
        if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.bool or not 2 <= tensor.dim() <= 4:
            raise AttnkitTypeError(f"dense mask must be a bool tensor with 2 to 4 dims (True = may attend), got "
                                   f"{describe(tensor)}; use tensor.bool() or pass float masks as bias=.")
        self.tensor = tensor.reshape((1,) * (4 - tensor.dim()) + tuple(tensor.shape))  # (B|1, H|1, Lq, Lk)
        self.batch, self.heads = self.tensor.shape[0], self.tensor.shape[1]

    def natural_length(self):
        return self.tensor.shape[-1]

    def bind(self, ctx):
        _check_batch(self, ctx)
        t = self.tensor.to(ctx.device)
        try:
            torch.broadcast_shapes(t.shape[2:], (ctx.q_len, ctx.kv_len))
        except RuntimeError:
            raise AttnkitValueError(f"dense mask of shape {tuple(self.tensor.shape)} does not broadcast to "
                                    f"(Lq, Lk)=({ctx.q_len}, {ctx.kv_len}); build it for this call's lengths.") from None
        qi = 0 if t.shape[2] == 1 else None
        ki = 0 if t.shape[3] == 1 else None

        def fn(b, h, q_idx, kv_idx):
            bb = b if t.shape[0] > 1 else torch.zeros_like(b)
            hh = h if t.shape[1] > 1 else torch.zeros_like(h)
            return t[bb, hh, q_idx if qi is None else torch.zeros_like(q_idx),
                     kv_idx if ki is None else torch.zeros_like(kv_idx)]

        return fn

    def __repr__(self):
        return f"dense{tuple(self.tensor.shape)}"


# ---------------------------------------------------------------- block covers (masks.blocks)


@cover.register
def _(mask: Padding, grid: BlockGrid) -> BlockCover:
    B, Lk = grid.ctx.batch, grid.ctx.kv_len
    if mask.key_is_real is not None:
        real = mask.key_is_real.to(grid.ctx.device).expand(B, -1)[grid.rows].to(torch.int8)  # (R, Lk)
    else:
        lengths = mask.lengths.to(grid.ctx.device).expand(B)[grid.rows]  # (R,)
        real = (torch.arange(Lk, device=grid.ctx.device)[None, :] < lengths[:, None]).to(torch.int8)  # (R, Lk)
    lo, hi = grid.kv_tiles(real)
    n_q = grid.n_q
    return BlockCover(hi.bool()[None, :].expand(n_q, -1), lo.bool()[None, :].expand(n_q, -1))


@cover.register
def _(mask: Document, grid: BlockGrid) -> BlockCover:
    q_doc, kv_doc = mask.ids_for(grid.ctx)  # (B, Lq), (B, Lk)
    q_r, kv_r = grid.q_tiles(q_doc[grid.rows]), grid.kv_tiles(kv_doc[grid.rows])
    return BlockCover(overlap(*q_r, *kv_r), single_equal(*q_r, *kv_r))


@cover.register
def _(mask: Dense, grid: BlockGrid) -> BlockCover:
    """A dense tensor is its own data: its tiles are reduced directly (no bound function per entry)."""
    t = mask.tensor.to(grid.ctx.device)  # (B|1, H|1, Lq|1, Lk|1)
    t = t[grid.rows] if t.shape[0] > 1 else t
    t = t.expand(-1, -1, grid.ctx.q_len, grid.ctx.kv_len)[:, :, grid.q_index][:, :, :, grid.kv_index]  # tile order
    return tiles_of(t, grid)

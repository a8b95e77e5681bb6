"""Masks: what each query may attend to. ``True`` = may attend; causality on absolute positions.

>>> import attnkit as ak
>>> m = ak.masks.causal() & ak.masks.sliding_window(3)
>>> print(m.picture(4))
# . . .
# # . .
# # # .
. # # #

Builders return :class:`MaskSpec` objects; combine them with ``&``, ``|``, ``~`` and materialise with
``mask.to_dense(q_positions, kv_positions)``. :func:`prepare` binds a mask once per forward (a
:class:`PreparedMask` every layer shares; see :mod:`attnkit.masks.prepared`).

Adding a mask kind: a :class:`MaskSpec` subclass in ``kinds/positional.py`` or ``kinds/data.py`` (its ``kind``
name, ``bind``, ``offsets``/``reach`` when it is a band, and its block cover, ``@cover.register``, beside it) and a
builder here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from attnkit.errors import AttnkitValueError
from attnkit.masks.dense import BoundMask, MaskContext, default_positions, materialize
from attnkit.masks.kinds.data import Dense, Document, Padding
from attnkit.masks.kinds.positional import (
    Causal,
    Chunked,
    Custom,
    GlobalTokens,
    PositionPadding,
    SlidingWindow,
    Strided,
    TwoSidedWindow,
    is_plain_causal,
)
from attnkit.masks.prepared import MaskStructure, PreparedMask, prepare
from attnkit.masks.spec import And, Combination, MaskSpec, Not, Or


def causal() -> Causal:
    """Query at absolute position p sees keys at positions <= p (bottom-right aligned with a cache)."""
    return Causal()


def sliding_window(window: int, right: int | None = None) -> SlidingWindow | TwoSidedWindow:
    """``sliding_window(W)``: causal local window of W keys including the query itself, p - W < j <= p.

    ``sliding_window(left, right)``: the two-sided window of flash-attn's ``window_size=(left, right)``,
    p - left <= j <= p + right (encoders; ``sliding_window(W - 1, 0)`` equals ``sliding_window(W)``).
    """
    return SlidingWindow(window) if right is None else TwoSidedWindow(window, right)


def chunked(chunk: int, start: torch.Tensor | Sequence[int] | None = None) -> Chunked:
    """Chunked local attention (Llama 4 local layers): keys of the query's own chunk of ``chunk`` positions,
    causal inside: ``j // C == p // C and j <= p``. ``start`` int ``(B,)``: row b's chunks begin at position
    ``start[b]`` (``(j - s) // C == (p - s) // C``; transformers counts them from the first real token)."""
    return Chunked(chunk, start)


def padding(key_is_real_or_lengths: torch.Tensor | Sequence[int] | None = None, *,
            start: torch.Tensor | Sequence[int] | None = None, by: str = "index") -> Padding | PositionPadding:
    """Mask padded keys.

    - ``padding(key_is_real)``: bool ``(B, Lk)``, True = real token, read by key index; ``padding(lengths)``: int
      ``(B,)``, the first ``lengths[b]`` keys of row b are real (right padding);
    - ``padding(start=s)``: int ``(B,)``, the keys at positions ``>= s[b]`` are real (left padding by position:
      right for every cache kind, whatever order it keeps its slots in);
    - ``padding(key_is_real, by="position")``: bool ``(B, N)`` indexed by key position (every position in
      ``[0, N)``), as transformers' ``padding_mask_function`` reads its 2-D mask.
    """
    if by not in ("index", "position"):
        raise AttnkitValueError(f"padding(by=...) must be 'index' or 'position', got {by!r}.")
    if start is not None and (key_is_real_or_lengths is not None or by != "index"):
        raise AttnkitValueError("padding(start=...) takes no key_is_real and no by=: the start positions say "
                                "everything (keys at positions >= start[b] are real).")
    if start is not None or by == "position":
        return PositionPadding(start=start, key_is_real=key_is_real_or_lengths)
    if key_is_real_or_lengths is None:
        raise AttnkitValueError("padding() needs key_is_real (B, Lk) bool, lengths (B,) or start=(B,); e.g. "
                                "ak.masks.padding(attention_mask.bool()).")
    return Padding(key_is_real_or_lengths)


def document(doc_ids: torch.Tensor, q_doc_ids: torch.Tensor | None = None) -> Document:
    """Packed documents: tokens attend only within their document. ``doc_ids`` int ``(B, Lk)``."""
    return Document(doc_ids, q_doc_ids)


def strided(stride: int) -> Strided:
    """Keys whose distance from the query is a multiple of ``stride`` (combine with ``causal()``)."""
    return Strided(stride)


def global_tokens(positions: Sequence[int] | torch.Tensor) -> GlobalTokens:
    """Tokens at these absolute positions see and are seen by every token (combine with ``|``)."""
    return GlobalTokens(positions)


def custom(fn: Callable[..., torch.Tensor], name: str | None = None) -> Custom:
    """A mask from ``fn(b, h, q_pos, kv_pos) -> bool`` written with elementwise tensor operations."""
    return Custom(fn, name)


def dense(tensor: torch.Tensor) -> Dense:
    """Wrap a boolean tensor broadcastable to ``(B, H, Lq, Lk)`` (True = may attend) as a mask."""
    return Dense(tensor)


__all__ = [
    "MaskSpec", "MaskContext", "BoundMask", "PreparedMask", "MaskStructure", "prepare", "Causal", "SlidingWindow",
    "TwoSidedWindow", "Chunked", "chunked", "Padding", "PositionPadding", "Document", "Strided", "GlobalTokens",
    "Custom", "Dense", "Combination", "And", "Or", "Not", "causal", "sliding_window", "padding", "document", "strided",
    "global_tokens", "custom", "dense", "materialize", "default_positions", "is_plain_causal",
]

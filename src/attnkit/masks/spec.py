"""Mask specifications: what each query may attend to, as a function of positions and indices.

A :class:`MaskSpec` is a small expression tree (``causal() & sliding_window(256) | global_tokens([0])``)
that is *bound* to a concrete call (query/key positions, batch) and then evaluated elementwise:
``fn(b, h, q_idx, kv_idx) -> bool``. Because the bound function uses only broadcasting tensor operations and
gathers, the same definition materialises a dense mask, serves flex attention's ``mask_mod`` and lets the
block-sparse backend probe blocks.

Conventions (docs/conventions.md): ``True`` = may attend. Causality is on absolute positions: a query at
position p sees keys at positions <= p. Padding masks: ``True`` = real token.

Shape legend: B batch, H heads, Lq/Lk query/key lengths.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from attnkit._checks import integer, positive_int
from attnkit.errors import AttnkitTypeError, AttnkitValueError, describe

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


class MaskSpec:
    """Base class of all masks. Combine with ``&``, ``|`` and ``~``; ``print(mask)`` draws it."""

    #: batch size of the data the mask carries (padding lengths, document ids); 1 when it carries none
    batch: int = 1
    #: number of heads the mask distinguishes (only dense per-head masks have more than 1)
    heads: int = 1
    #: True when the mask reads token positions (causal, windows, strides, global tokens, custom), not only
    #: indices and data (a cache serves it by how far back it reaches)
    positional: bool = False

    def bind(self, ctx: MaskContext) -> BoundMask:
        """Return the elementwise function ``fn(b, h, q_idx, kv_idx) -> bool`` for this call."""
        raise NotImplementedError

    # ----- algebra -----
    def __and__(self, other: MaskSpec) -> MaskSpec:
        return And(self, _check_spec(other, "&"))

    def __or__(self, other: MaskSpec) -> MaskSpec:
        return Or(self, _check_spec(other, "|"))

    def __invert__(self) -> MaskSpec:
        return Not(self)

    # ----- materialisation -----
    def to_dense(
        self,
        q_positions: torch.Tensor | int,
        kv_positions: torch.Tensor | int | None = None,
        *,
        batch: int | None = None,
        heads: int | None = None,
    ) -> torch.Tensor:
        """Dense boolean mask ``(B, heads, Lq, Lk)``, ``True`` = may attend.

        Positions are int64 tensors ``(Lq,)``/``(B, Lq)`` and ``(Lk,)``/``(B, Lk)``, or plain lengths: an
        int ``Lk`` means ``arange(Lk)`` and an int ``Lq`` means the last Lq of those (bottom-right
        alignment). ``kv_positions`` defaults to ``q_positions``. B is 1 unless the positions or the
        mask's data (padding, document ids) or ``batch`` say otherwise; ``heads`` defaults to the number of
        heads the mask distinguishes (1 unless it wraps a per-head tensor).
        """
        from attnkit.masks.dense import context_for, evaluate

        ctx = context_for(self, q_positions, kv_positions, batch=batch)
        return evaluate(self.bind(ctx), ctx, heads=heads or self.heads)

    def picture(self, q_len: int | None = None, kv_len: int | None = None) -> str:
        """An ASCII picture (rows = queries, columns = keys; ``#`` attends, ``.`` masked) of batch row 0."""
        from attnkit.masks.picture import draw

        return draw(self, q_len, kv_len)

    def __str__(self) -> str:
        return f"{self!r}\n{self.picture()}"

    def natural_length(self) -> int | None:
        """The sequence length implied by the mask's data (padding/documents), if any."""
        return None

    def offsets(self) -> tuple[int | None, int | None] | None:
        """When the mask allows exactly the offsets ``lo <= kv_pos - q_pos <= hi`` (None = unbounded), that
        interval; None when it depends on anything else (data, absolute positions, heads)."""
        return None

    def reach(self) -> tuple[int | None, int | None]:
        """Bounds ``(lo, hi)`` on the offsets ``kv_pos - q_pos`` of every allowed entry (None = unbounded): the
        mask never lets a query see a key more than ``-lo`` positions back or ``hi`` ahead. Unlike
        :meth:`offsets` it need not be exact: ``causal() & padding(x)`` reaches ``(None, 0)``. Caches decide
        from it whether they hold every key a mask can reach."""
        exact = self.offsets()
        return (None, None) if exact is None else exact

    def conjuncts(self) -> tuple[MaskSpec, ...]:
        """The masks whose ``&`` this mask is, flattened: ``(causal() & padding(x)).conjuncts()`` is
        ``(causal(), padding(x))``; any mask that is not an ``&`` is its own single conjunct."""
        return (self,)


def _check_spec(other: object, op: str) -> MaskSpec:
    if not isinstance(other, MaskSpec):
        raise AttnkitTypeError(
            f"mask {op} expects another attnkit mask, got {describe(other)}; wrap a boolean tensor with "
            "ak.masks.dense(tensor) or pass it directly as mask=."
        )
    return other


def _lookup(ctx: MaskContext):
    """Position lookups shared by the position-based masks."""
    qp, kvp = ctx.q_positions, ctx.kv_positions

    def positions(b: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor):
        return qp[b, q_idx], kvp[b, kv_idx]

    return positions


# ---------------------------------------------------------------- position-based masks


class Causal(MaskSpec):
    """Query at position p sees keys at positions <= p."""

    positional = True

    def bind(self, ctx: MaskContext) -> BoundMask:
        positions = _lookup(ctx)

        def fn(b, h, q_idx, kv_idx):
            q_pos, kv_pos = positions(b, q_idx, kv_idx)
            return kv_pos <= q_pos

        return fn

    def offsets(self) -> tuple[int | None, int | None]:
        return None, 0

    def __repr__(self) -> str:
        return "causal()"


class SlidingWindow(MaskSpec):
    """Causal window of W keys including the query itself: p - W < j <= p."""

    positional = True

    def __init__(self, window: int):
        self.window = positive_int(window, "window", "use window >= 1 (window=1 lets a token see only itself).")

    def bind(self, ctx: MaskContext) -> BoundMask:
        positions, window = _lookup(ctx), self.window

        def fn(b, h, q_idx, kv_idx):
            q_pos, kv_pos = positions(b, q_idx, kv_idx)
            return (kv_pos <= q_pos) & (q_pos - kv_pos < window)

        return fn

    def offsets(self) -> tuple[int | None, int | None]:
        return 1 - self.window, 0

    def __repr__(self) -> str:
        return f"sliding_window({self.window})"


class TwoSidedWindow(MaskSpec):
    """flash-attn's ``window_size=(left, right)``: a query at p sees keys p - left <= j <= p + right (encoders)."""

    positional = True

    def __init__(self, left: int, right: int):
        fix = "use ints >= 0 (sliding_window(left, right) sees left keys back and right keys ahead)."
        self.left = integer(left, "left", low=0, fix=fix)
        self.right = integer(right, "right", low=0, fix=fix)

    def bind(self, ctx: MaskContext) -> BoundMask:
        positions, left, right = _lookup(ctx), self.left, self.right

        def fn(b, h, q_idx, kv_idx):
            q_pos, kv_pos = positions(b, q_idx, kv_idx)
            d = kv_pos - q_pos
            return (d >= -left) & (d <= right)

        return fn

    def offsets(self) -> tuple[int, int]:
        return -self.left, self.right

    def __repr__(self) -> str:
        return f"sliding_window({self.left}, {self.right})"


class Chunked(MaskSpec):
    """Chunked local attention (Llama 4's local layers): a query at p sees keys j of its own chunk of C
    positions, causally: ``j // C == p // C`` and ``j <= p``."""

    positional = True

    def __init__(self, chunk: int):
        self.chunk = positive_int(chunk, "chunk", "use chunk >= 1 (the number of positions per chunk, e.g. 8192).")

    def bind(self, ctx: MaskContext) -> BoundMask:
        positions, chunk = _lookup(ctx), self.chunk

        def fn(b, h, q_idx, kv_idx):
            q_pos, kv_pos = positions(b, q_idx, kv_idx)
            return (kv_pos <= q_pos) & (torch.div(kv_pos, chunk, rounding_mode="floor")
                                        == torch.div(q_pos, chunk, rounding_mode="floor"))

        return fn

    def reach(self) -> tuple[int, int]:
        return 1 - self.chunk, 0  # the chunk's first key is at most C - 1 positions back

    def __repr__(self) -> str:
        return f"chunked({self.chunk})"


class Strided(MaskSpec):
    """Sparse Transformer's strided pattern: keys whose distance is a multiple of ``stride`` (not causal by
    itself: combine with ``causal()``)."""

    positional = True

    def __init__(self, stride: int):
        self.stride = positive_int(stride, "stride", "use stride >= 1.")

    def bind(self, ctx: MaskContext) -> BoundMask:
        positions, stride = _lookup(ctx), self.stride

        def fn(b, h, q_idx, kv_idx):
            q_pos, kv_pos = positions(b, q_idx, kv_idx)
            return torch.remainder(q_pos - kv_pos, stride) == 0

        return fn

    def __repr__(self) -> str:
        return f"strided({self.stride})"


class GlobalTokens(MaskSpec):
    """Tokens at the given absolute positions attend to everything and are attended by everything.

    Combine with another mask by ``|`` (``sliding_window(256) | global_tokens([0])``) and with ``& causal()``
    for decoders.
    """

    positional = True

    def __init__(self, positions: Sequence[int] | torch.Tensor):
        values = torch.as_tensor(positions).flatten()
        if values.numel() and (values.dtype.is_floating_point or values.dtype.is_complex or values.dtype == torch.bool):
            raise AttnkitTypeError(
                f"global_tokens positions must be ints, got {describe(positions)}; pass integer token positions, "
                "e.g. global_tokens([0]) (a float such as 1.5 is not a position).")
        if values.numel() == 0 or bool((values < 0).any()):
            raise AttnkitValueError(
                f"global_tokens positions must be a non-empty list of non-negative ints, got {describe(positions)}; "
                "pass e.g. global_tokens([0]) for a leading CLS/sink token."
            )
        self.positions = sorted(set(values.tolist()))

    def bind(self, ctx: MaskContext) -> BoundMask:
        # one flag per token of the call (memory grows with Lq + Lk, not with the largest global position)
        table = torch.tensor(self.positions, device=ctx.device)  # (n,) the global positions
        q_global = torch.isin(ctx.q_positions, table)  # (B, Lq)
        kv_global = torch.isin(ctx.kv_positions, table)  # (B, Lk)

        def fn(b, h, q_idx, kv_idx):
            return q_global[b, q_idx] | kv_global[b, kv_idx]

        return fn

    def __repr__(self) -> str:
        return f"global_tokens({self.positions})"


class Custom(MaskSpec):
    """A user mask ``fn(b, h, q_pos, kv_pos) -> bool`` on absolute positions (elementwise, broadcasting)."""

    positional = True

    def __init__(self, fn: Callable[..., torch.Tensor], name: str | None = None):
        if not callable(fn):
            raise AttnkitTypeError(f"custom mask fn must be callable, got {describe(fn)}; pass a function "
                                   "fn(b, h, q_pos, kv_pos) -> bool tensor.")
        self.fn, self.name = fn, name or getattr(fn, "__name__", "fn")

    def bind(self, ctx: MaskContext) -> BoundMask:
        positions, user = _lookup(ctx), self.fn

        def fn(b, h, q_idx, kv_idx):
            q_pos, kv_pos = positions(b, q_idx, kv_idx)
            return user(b, h, q_pos, kv_pos)

        return fn

    def __repr__(self) -> str:
        return f"custom({self.name})"


# ---------------------------------------------------------------- index-based masks (carry data)


class Padding(MaskSpec):
    """Keys that are padding are masked. ``key_is_real``: bool ``(B, Lk)`` (True = real) or lengths ``(B,)``
    (the first ``lengths[b]`` keys of row b are real, i.e. right padding)."""

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

    def __init__(self, doc_ids: torch.Tensor, q_doc_ids: torch.Tensor | None = None):
        self.doc_ids = _doc_tensor(doc_ids, "doc_ids")
        self.q_doc_ids = None if q_doc_ids is None else _doc_tensor(q_doc_ids, "q_doc_ids")
        self.batch = self.doc_ids.shape[0]

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


def _check_batch(mask: MaskSpec, ctx: MaskContext) -> None:
    if mask.batch not in (1, ctx.batch):
        raise AttnkitValueError(
            f"{mask!r} carries data for batch {mask.batch} but the call has batch {ctx.batch}; build the mask "
            "from tensors with the same batch size as q."
        )


# ---------------------------------------------------------------- algebra and dense tensors


class Combination(MaskSpec):
    """An n-ary combination of masks; :class:`And` and :class:`Or` are its two (sibling) kinds."""

    symbol = "?"

    def __init__(self, *parts: MaskSpec):
        self.parts = parts
        self.batch = max(p.batch for p in parts)
        self.heads = max(p.heads for p in parts)
        self.positional = any(p.positional for p in parts)

    @staticmethod
    def join(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def bind(self, ctx):
        fns, join = [p.bind(ctx) for p in self.parts], self.join

        def fn(b, h, q_idx, kv_idx):
            out = fns[0](b, h, q_idx, kv_idx)
            for f in fns[1:]:
                out = join(out, f(b, h, q_idx, kv_idx))
            return out

        return fn

    def natural_length(self):
        return max((n for p in self.parts if (n := p.natural_length()) is not None), default=None)

    def __repr__(self):
        return "(" + f" {self.symbol} ".join(map(repr, self.parts)) + ")"


class And(Combination):
    """Allowed where every part allows."""

    symbol = "&"
    join = staticmethod(torch.logical_and)

    def conjuncts(self) -> tuple[MaskSpec, ...]:
        return tuple(c for p in self.parts for c in p.conjuncts())

    def offsets(self) -> tuple[int | None, int | None] | None:
        """The intersection of the parts' offset intervals (None if any part has none)."""
        parts = [p.offsets() for p in self.parts]
        if any(o is None for o in parts):
            return None
        return _intersect(parts)

    def reach(self) -> tuple[int | None, int | None]:
        return _intersect([p.reach() for p in self.parts])


class Or(Combination):
    """Allowed where any part allows."""

    symbol = "|"
    join = staticmethod(torch.logical_or)

    def offsets(self) -> None:
        return None  # a union of intervals need not be one

    def reach(self) -> tuple[int | None, int | None]:
        lows, highs = zip(*(p.reach() for p in self.parts))
        return (None if None in lows else min(lows)), (None if None in highs else max(highs))


def _intersect(intervals) -> tuple[int | None, int | None]:
    lows = [lo for lo, _ in intervals if lo is not None]
    highs = [hi for _, hi in intervals if hi is not None]
    return (max(lows) if lows else None), (min(highs) if highs else None)


class Not(MaskSpec):
    def __init__(self, inner: MaskSpec):
        self.inner, self.batch, self.heads, self.positional = inner, inner.batch, inner.heads, inner.positional

    def bind(self, ctx):
        inner = self.inner.bind(ctx)
        return lambda b, h, q_idx, kv_idx: ~inner(b, h, q_idx, kv_idx)

    def natural_length(self):
        return self.inner.natural_length()

    def __repr__(self):
        return f"~{self.inner!r}"


class Dense(MaskSpec):
    """A boolean tensor broadcastable to ``(B, H, Lq, Lk)`` wrapped as a mask (indices, not positions)."""

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

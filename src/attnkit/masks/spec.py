"""Mask specifications: what each query may attend to, as a function of positions and indices.

A :class:`MaskSpec` is a small expression tree (``causal() & sliding_window(256) | global_tokens([0])``)
that is *bound* to a concrete call (query/key positions, batch) and then evaluated elementwise:
``fn(b, h, q_idx, kv_idx) -> bool``. Because the bound function uses only broadcasting tensor operations and
gathers, the same definition materialises a dense mask, serves flex attention's ``mask_mod`` and lets the
block-sparse backend probe blocks.

Conventions (docs/conventions.md): ``True`` = may attend. Causality is on absolute positions: a query at
position p sees keys at positions <= p. Padding masks: ``True`` = real token.

The kinds live in :mod:`attnkit.masks.kinds` (by family: ``positional``, ``data``) and import this module,
which holds the base class and the algebra (``&``, ``|``, ``~``); the context a mask is bound to is
:mod:`attnkit.masks.dense`'s. Nothing here imports a kind (``masks/`` imports in one direction).

Shape legend: B batch, H heads, Lq/Lk query/key lengths.
"""

from __future__ import annotations

import torch

from attnkit.errors import AttnkitTypeError, AttnkitValueError, describe
from attnkit.masks.dense import BoundMask, MaskContext, context_for, evaluate


class MaskSpec:
    """Base class of all masks. Combine with ``&``, ``|`` and ``~``; ``print(mask)`` draws it."""

    #: batch size of the data the mask carries (padding lengths, document ids); 1 when it carries none
    batch: int = 1
    #: number of heads the mask distinguishes (only dense per-head masks have more than 1)
    heads: int = 1
    #: True when the mask reads token positions (causal, windows, strides, global tokens, custom), not only
    #: indices and data (a cache serves it by how far back it reaches)
    positional: bool = False
    #: the kind's name, its constructor's (``"causal"``, ``"padding"``, ...; ``"and"``/``"or"``/``"not"`` for the
    #: algebra): what backends and caches read instead of the class (``"mask"``: a subclass that names none)
    kind: str = "mask"
    #: True when the mask reads the queries' data from the keys' (the queries are the last Lq keys by index: a
    #: document mask without ``q_doc_ids``); a cache that returns more slots than it was given keys refuses it
    queries_from_keys: bool = False

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

    def leaves(self) -> tuple[MaskSpec, ...]:
        """The kinds this mask combines, under every ``&``, ``|`` and ``~``, in order:
        ``(causal() | ~padding(x)).leaves()`` is ``(causal(), padding(x))``; a kind is its own single leaf."""
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


def _check_batch(mask: MaskSpec, ctx: MaskContext) -> None:
    if mask.batch not in (1, ctx.batch):
        raise AttnkitValueError(
            f"{mask!r} carries data for batch {mask.batch} but the call has batch {ctx.batch}; build the mask "
            "from tensors with the same batch size as q."
        )

# ---------------------------------------------------------------- algebra


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

    def leaves(self) -> tuple[MaskSpec, ...]:
        return tuple(leaf for p in self.parts for leaf in p.leaves())

    def __repr__(self):
        return "(" + f" {self.symbol} ".join(map(repr, self.parts)) + ")"


class And(Combination):
    """Allowed where every part allows."""

    symbol, kind = "&", "and"
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

    symbol, kind = "|", "or"
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
    """Allowed where the inner mask is not."""

    kind = "not"

    def __init__(self, inner: MaskSpec):
        self.inner, self.batch, self.heads, self.positional = inner, inner.batch, inner.heads, inner.positional

    def bind(self, ctx):
        inner = self.inner.bind(ctx)
        return lambda b, h, q_idx, kv_idx: ~inner(b, h, q_idx, kv_idx)

    def natural_length(self):
        return self.inner.natural_length()

    def leaves(self) -> tuple[MaskSpec, ...]:
        return self.inner.leaves()

    def __repr__(self):
        return f"~{self.inner!r}"


__all__ = ["MaskSpec", "Combination", "And", "Or", "Not"]

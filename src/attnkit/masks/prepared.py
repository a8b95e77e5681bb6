"""A mask prepared for one forward: bound once to its positions, then read by every layer and backend.

:func:`prepare` binds a mask (an ``ak.masks`` mask or a bool tensor) to the positions of a call and returns a
:class:`PreparedMask`. It carries

- ``fn``: the bound elementwise function ``fn(b, h, q_idx, kv_idx) -> bool`` (flex's ``mask_mod``),
- :meth:`~PreparedMask.dense`: the dense bool tensor ``(B|1, H|1, Lq, Lk)``, built on first use and kept,
- :meth:`~PreparedMask.grid`: a :class:`~attnkit.masks.blocks.BlockGrid` over its context, on which
  ``masks.blocks.cover(spec, grid)`` says which tiles may hold / are full of allowed entries (the block-sparse
  planner keeps its plans, cover included, in the memo),
- :attr:`~PreparedMask.structure`: a small description a backend or a cache can act on without evaluating
  anything: the offset band (how far back and ahead it reaches), document ids, key lengths, chunk size, stride,
- :meth:`~PreparedMask.memo`: a per-object store where backends keep what they derive (flex's block mask,
  blocksparse's plans), so a model that prepares its mask once per forward builds each of them once, not
  once per layer.

``ak.attention`` accepts a prepared mask wherever it accepts a mask (and prepares a plain one itself, for
that one call). A prepared mask lives for one forward: nothing is keyed on object identity or memory
addresses across calls, so it serves only what it provably equals. Its derived forms are computed from the
mask data and positions the first time they are asked for: don't edit those tensors in place while the
prepared mask is in use (prepare a new one for the next batch).

>>> import torch, attnkit as ak
>>> pm = ak.masks.prepare(ak.masks.causal() & ak.masks.padding(torch.tensor([3, 2])), 4)
>>> pm.batch, pm.q_len, pm.kv_len, pm.structure.reach, pm.structure.key_lengths.tolist()
(2, 4, 4, (None, 0), [3, 2])
>>> pm.dense().shape
torch.Size([2, 1, 4, 4])

Shape legend: B batch, H heads the mask distinguishes (1 unless a per-head tensor), Lq/Lk query/key lengths,
nQ/nK tile counts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from attnkit._memo import Memo
from attnkit.errors import AttnkitTypeError, AttnkitValueError, describe
from attnkit.masks.blocks import BlockGrid
from attnkit.masks.dense import BoundMask, MaskContext, context_for, default_positions, evaluate
from attnkit.masks.kinds.data import Dense, Document, Padding
from attnkit.masks.kinds.positional import Chunked, Strided, is_plain_causal
from attnkit.masks.spec import MaskSpec

_MISSING = object()
#: forms of small pure causal masks on default positions kept across calls (see PreparedMask.memo(shared=True))
_SHARED = Memo("shared causal forms", 32)
#: Lq x Lk of the largest mask whose forms are shared (a decode step's, never a prefill's): 32 x 256 KiB at most
SHARED_MAX_ENTRIES = 1 << 18
#: plain lanes one prepared mask keeps (one per shape/dtype/grad mode of the calls that use it: a few per forward)
LANES_MAX_ENTRIES = 64


@dataclass(frozen=True)
class MaskStructure:
    """What a prepared mask is, as far as backends and caches can exploit it (None = not known / absent).

    ``reach``: bounds ``(lo, hi)`` on ``kv_pos - q_pos`` of every allowed entry (:meth:`MaskSpec.reach`);
    ``offsets``: the exact offset interval when the mask is nothing else (:meth:`MaskSpec.offsets`);
    ``doc_ids``: ``(q_doc (B, Lq), kv_doc (B, Lk))`` of a document conjunct; ``key_lengths``: ``(B,)`` real keys
    per row of a padding-by-lengths conjunct; ``chunk``: C of a ``chunked(C)`` conjunct; ``stride``: s of a
    ``strided(s)`` conjunct; ``kinds``: the :attr:`~MaskSpec.kind` of every conjunct, sorted (``("causal",
    "document")`` for ``causal() & document(ids)``).
    """

    reach: tuple[int | None, int | None]
    offsets: tuple[int | None, int | None] | None
    doc_ids: tuple[torch.Tensor, torch.Tensor] | None
    key_lengths: torch.Tensor | None
    chunk: int | None
    stride: int | None
    kinds: tuple[str, ...] = ()


class PreparedMask:
    """A mask bound to one call's positions (see the module docstring); build it with :func:`prepare`.

    Attributes: ``spec`` (the :class:`MaskSpec`; a bool tensor is wrapped as :class:`Dense`), ``source`` (what
    was passed), ``is_tensor``, ``ctx`` (:class:`MaskContext`, positions ``(B, Lq)``/``(B, Lk)``), ``batch``,
    ``q_len``, ``kv_len``, ``heads``, ``device``, ``default_positions`` (keys at ``arange(Lk)``, queries at the
    last Lq of them).
    """

    def __init__(self, mask: MaskSpec | torch.Tensor, q_positions: torch.Tensor | int,
                 kv_positions: torch.Tensor | int | None = None, batch: int | None = None, *,
                 _default: bool | None = None):
        spec = _spec_of(mask)
        ctx = context_for(spec, q_positions, kv_positions, batch=batch)
        default = _is_default(q_positions, kv_positions, ctx) if _default is None else _default
        self._setup(mask, spec, ctx.batch, ctx.q_len, ctx.kv_len, ctx.device, default)
        self._ctx = ctx

    def _setup(self, source, spec: MaskSpec, batch: int, q_len: int, kv_len: int, device: torch.device,
               default: bool) -> None:
        self.source, self.is_tensor, self.spec = source, isinstance(source, torch.Tensor), spec
        self.batch, self.q_len, self.kv_len, self.heads, self.device = batch, q_len, kv_len, spec.heads, device
        self.default_positions = default
        self._memo: dict[Any, Any] = {}
        #: the plain lanes of calls with this mask (``backends.lane``), read on every such call
        self.lanes = Memo("prepared mask lanes", LANES_MAX_ENTRIES, register=False)
        self._ctx: MaskContext | None = None
        self._positions: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None)

    @classmethod
    def for_call(cls, mask: MaskSpec | torch.Tensor, q_positions: torch.Tensor | None,
                 kv_positions: torch.Tensor | None, batch: int, q_len: int, kv_len: int,
                 device: torch.device) -> PreparedMask:
        """Prepare for a validated call: positions ``(B|1, L)`` or None for the defaults (no check needed: the
        call's checks fixed their shapes, the mask's batch and the device). Nothing is built here: the
        positions are broadcast (the defaults made) the first time something reads :attr:`ctx`, so a call that
        needs only the structure (a causal mask SDPA flags) pays for none of it."""
        prepared = cls.__new__(cls)
        prepared._setup(mask, _spec_of(mask), batch, q_len, kv_len, device,
                        q_positions is None and kv_positions is None)
        prepared._positions = (q_positions, kv_positions)
        return prepared

    @property
    def ctx(self) -> MaskContext:
        """The :class:`MaskContext`: positions ``(B, Lq)``, ``(B, Lk)`` int64 (built on first use)."""
        if self._ctx is None:
            q, kv = self._positions
            if q is None or kv is None:
                dq, dkv = default_positions(self.q_len, self.kv_len, self.device)  # (1, Lq), (1, Lk)
                q, kv = dq if q is None else q, dkv if kv is None else kv
            self._ctx = MaskContext(q.expand(self.batch, -1), kv.expand(self.batch, -1))  # (B, Lq), (B, Lk)
        return self._ctx

    # ------------------------------------------------------------------ bound forms
    @property
    def fn(self) -> BoundMask:
        """The bound elementwise function ``fn(b, h, q_idx, kv_idx) -> bool`` (broadcasting int64 indices)."""
        return self.memo("fn", lambda: self.spec.bind(self.ctx))

    def dense(self) -> torch.Tensor:
        """The dense bool mask, broadcastable to ``(B, H, Lq, Lk)`` (a tensor mask is returned as given, 4-D; a mask
        alike for every row, with no per-row data on default positions, has batch 1)."""
        return self.memo("dense", self._dense, shared=True)

    def _dense(self) -> torch.Tensor:
        if self.is_tensor:
            self.fn  # noqa: B018 -- binding checks the tensor against the call's shape
            return self.spec.tensor.to(self.device)  # (B|1, H|1, Lq|1, Lk|1)
        if self.batch > 1 and self.default_positions and self.spec.batch == 1 and \
                all(leaf.kind != "custom" for leaf in self.spec.leaves()):  # every row alike: one, broadcast
            # (a custom fn may read per-row data through b that its batch of 1 does not declare)
            return PreparedMask.for_call(self.source, None, None, 1, self.q_len, self.kv_len, self.device).dense()
        return evaluate(self.fn, self.ctx, heads=self.heads)  # (B, H|1, Lq, Lk)

    def dense_opened(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(mask | empty_rows, empty_rows)``: rows with no visible key opened to every key (their output is
        zeroed afterwards, which gives finite gradients on any kernel), and the empty-row mask
        ``(B|1, H|1, Lq, 1)``; ``(mask, None)`` when every row sees a key."""
        return self.memo("opened", self._dense_opened, shared=True)

    def _dense_opened(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        allowed = self.dense()
        empty = ~allowed.any(dim=-1, keepdim=True)  # (B|1, H|1, Lq, 1)
        if not torch.compiler.is_compiling() and not bool(empty.any()):  # (data-dependent: breaks graphs)
            return allowed, None
        return allowed | empty, empty

    def grid(self, block: int, kv_block: int | None = None, rows: torch.Tensor | None = None,
             q_index: torch.Tensor | None = None, kv_index: torch.Tensor | None = None) -> BlockGrid:
        """A :class:`~attnkit.masks.blocks.BlockGrid` over this mask's context (defaults: every row, index order)."""
        dev = self.device
        return BlockGrid(self.ctx, torch.arange(self.batch, device=dev) if rows is None else rows,
                         torch.arange(self.q_len, device=dev) if q_index is None else q_index,
                         torch.arange(self.kv_len, device=dev) if kv_index is None else kv_index,
                         block, kv_block or block)

    def memo(self, key: Any, build: Callable[[], Any], *, shared: bool = False) -> Any:
        """``build()`` once per key for this prepared mask (backends keep their derived forms here).

        ``shared=True``, for forms built from the mask alone (never from a call's tensors): a pure causal mask
        on default positions has no data, so such a form is a function of exactly ``(key, B, Lq, Lk, device)``
        and is kept across calls too, in a small bounded table, when the mask is small (a decode step's
        ``Lq x Lk``, at most ``SHARED_MAX_ENTRIES``): an unprepared ``causal()`` decode call then builds its
        dense form once, not once per call."""
        value = self._memo.get(key, _MISSING)
        if value is not _MISSING:
            return value
        if shared and self.pure_causal and self.q_len * self.kv_len <= SHARED_MAX_ENTRIES and \
                not torch.compiler.is_compiling():
            table_key = (key, self.batch, self.q_len, self.kv_len, self.device)
            value = _SHARED.get_or_build(table_key, build)
        else:
            value = build()
        self._memo[key] = value
        return value

    # ------------------------------------------------------------------ structure
    @property
    def structure(self) -> MaskStructure:
        """The :class:`MaskStructure` (computed on first use)."""
        return self.memo("structure", self._structure)

    def _structure(self) -> MaskStructure:
        parts = self.spec.conjuncts()
        docs = next((p for p in parts if isinstance(p, Document)), None)
        pads = next((p for p in parts if isinstance(p, Padding) and p.lengths is not None), None)
        return MaskStructure(
            reach=self.spec.reach(), offsets=self.spec.offsets(),
            doc_ids=None if docs is None else docs.ids_for(self.ctx),
            key_lengths=None if pads is None else pads.lengths.to(self.device).expand(self.batch),
            chunk=next((p.chunk for p in parts if isinstance(p, Chunked)), None),
            stride=next((p.stride for p in parts if isinstance(p, Strided)), None),
            kinds=tuple(sorted(p.kind for p in parts)))

    @property
    def pure_causal(self) -> bool:
        """Exactly ``causal()`` on the default (bottom-right aligned) positions."""
        return is_plain_causal(self.spec) and self.default_positions

    def sdpa_flag(self, q_len: int, kv_len: int) -> str | None:
        """How SDPA can serve the mask without a tensor: ``"none"`` (a causal decode step: the last position
        sees every key), ``"causal"`` (``is_causal=True``: square, default positions), else None."""
        if not self.pure_causal:
            return None
        return "none" if q_len == 1 else "causal" if q_len == kv_len else None

    # ------------------------------------------------------------------ use in a call
    def check_call(self, batch: int, q_len: int, kv_len: int, device: torch.device) -> None:
        """Raise unless the call's batch, lengths and device are the ones the mask was prepared for."""
        if (self.q_len, self.kv_len) != (q_len, kv_len) or self.batch not in (1, batch) or self.device != device:
            raise AttnkitValueError(
                f"mask was prepared for batch {self.batch}, Lq={self.q_len}, Lk={self.kv_len} on {self.device}, but "
                f"the call has batch {batch}, Lq={q_len}, Lk={kv_len} on {device}; prepare it with this call's "
                "positions (ak.masks.prepare(mask, q_positions, kv_positions, batch)).")

    def same_positions(self, name: str, positions: torch.Tensor | None) -> torch.Tensor | None:
        """The call's ``positions (B|1, L)`` checked equal to the prepared ones (or the prepared ones when None)."""
        mine = self.ctx.q_positions if name == "q_positions" else self.ctx.kv_positions  # (B, L)
        if positions is None:
            return None if self.default_positions else mine
        if not torch.compiler.is_compiling() and not torch.equal(positions.expand_as(mine), mine):
            raise AttnkitValueError(
                f"{name} {describe(positions)} differ from the positions the mask was prepared with; pass the same "
                f"{name} to ak.masks.prepare and ak.attention (or omit them here: the prepared ones are used).")
        return positions

    def __repr__(self) -> str:
        return f"prepared({self.spec!r}, B={self.batch}, Lq={self.q_len}, Lk={self.kv_len})"


def _spec_of(mask: object) -> MaskSpec:
    """The :class:`MaskSpec` of an ``ak.masks`` mask or a bool tensor (wrapped as :class:`Dense`)."""
    if isinstance(mask, torch.Tensor):
        if mask.dtype != torch.bool or mask.dim() > 4:
            raise AttnkitTypeError(f"prepare expects an ak.masks mask or a bool tensor with at most 4 dims "
                                   f"(True = may attend), got {describe(mask)}; use tensor.bool().")
        return Dense(mask.reshape((1,) * max(0, 2 - mask.dim()) + tuple(mask.shape)))  # (.., Lq|1, Lk|1)
    if not isinstance(mask, MaskSpec):
        raise AttnkitTypeError(f"prepare expects an ak.masks mask or a bool tensor, got {describe(mask)}; build "
                               "one with ak.masks.causal(), ak.masks.padding(...), ... or wrap a tensor.")
    return mask


def _is_default(q_positions, kv_positions, ctx: MaskContext) -> bool:
    """Whether the positions are the defaults (lengths given, or tensors equal to the bottom-right aranges)."""
    if isinstance(q_positions, int) and (kv_positions is None or isinstance(kv_positions, int)):
        return True
    if torch.compiler.is_compiling():
        return False
    dq, dkv = default_positions(ctx.q_len, ctx.kv_len, ctx.device)  # (1, Lq), (1, Lk)
    return torch.equal(ctx.q_positions, dq.expand_as(ctx.q_positions)) and \
        torch.equal(ctx.kv_positions, dkv.expand_as(ctx.kv_positions))


def prepare(mask: MaskSpec | torch.Tensor | PreparedMask | None, q_positions: torch.Tensor | int,
            kv_positions: torch.Tensor | int | None = None, batch: int | None = None) -> PreparedMask | None:
    """Bind ``mask`` once for a forward: a :class:`PreparedMask` every layer's ``ak.attention`` can share.

    Args:
        mask: an ``ak.masks`` mask or a bool tensor broadcastable to ``(B, H, Lq, Lk)`` (True = may attend);
            None gives None, and a prepared mask is returned as it is.
        q_positions: absolute query positions, int ``(Lq,)`` or ``(B, Lq)``, or the length ``Lq`` (then the
            queries are the last Lq keys: bottom-right alignment).
        kv_positions: key positions ``(Lk,)``/``(B, Lk)`` or the length ``Lk``; default ``q_positions``.
        batch: B, when neither the positions nor the mask's data say it.

    Pass the same positions to ``ak.attention`` (or none: the prepared ones are used).
    """
    if mask is None or isinstance(mask, PreparedMask):
        return mask
    return PreparedMask(mask, q_positions, kv_positions, batch)

"""Masks that read token positions: a query at absolute position p against a key at position j (bottom-right
aligned by default; docs/conventions.md).

Shape legend: B batch, Lq/Lk query/key lengths, n global positions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from attnkit._checks import integer, positive_int
from attnkit.errors import AttnkitTypeError, AttnkitValueError, describe
from attnkit.masks.blocks import BlockCover, BlockGrid, cover, outer, overlap, single_equal
from attnkit.masks.dense import BoundMask, MaskContext
from attnkit.masks.spec import MaskSpec, _check_batch, _lookup


class Causal(MaskSpec):
    """Query at position p sees keys at positions <= p."""

    positional, kind = True, "causal"

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

    positional, kind = True, "sliding_window"

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

    positional, kind = True, "two_sided_window"

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
    positions, causally: ``j // C == p // C`` and ``j <= p``. With ``start`` int ``(B,)`` row b's chunks are
    counted from position ``start[b]``: ``(j - s) // C == (p - s) // C`` (transformers' chunked attention counts
    them from each row's first real token under left padding)."""

    positional, kind = True, "chunked"

    def __init__(self, chunk: int, start: torch.Tensor | Sequence[int] | None = None):
        self.chunk = positive_int(chunk, "chunk", "use chunk >= 1 (the number of positions per chunk, e.g. 8192).")
        self.start = None if start is None else _row_ints(start, "start", "the position each row's chunks start at")
        self.batch = 1 if self.start is None else self.start.shape[0]

    def bind(self, ctx: MaskContext) -> BoundMask:
        _check_batch(self, ctx)
        positions, chunk = _lookup(ctx), self.chunk
        start = None if self.start is None else self.start.to(ctx.device).expand(ctx.batch)  # (B,)

        def fn(b, h, q_idx, kv_idx):
            q_pos, kv_pos = positions(b, q_idx, kv_idx)
            q_rel, kv_rel = (q_pos, kv_pos) if start is None else (q_pos - start[b], kv_pos - start[b])
            return (kv_pos <= q_pos) & (torch.div(kv_rel, chunk, rounding_mode="floor")
                                        == torch.div(q_rel, chunk, rounding_mode="floor"))

        return fn

    def reach(self) -> tuple[int, int]:
        return 1 - self.chunk, 0  # the chunk's first key is at most C - 1 positions back

    def __repr__(self) -> str:
        return f"chunked({self.chunk})" if self.start is None else f"chunked({self.chunk}, start={_short(self.start)})"


class Strided(MaskSpec):
    """Sparse Transformer's strided pattern: keys whose distance is a multiple of ``stride`` (not causal by
    itself: combine with ``causal()``)."""

    positional, kind = True, "strided"

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

    positional, kind = True, "global_tokens"

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

    positional, kind = True, "custom"

    def __init__(self, fn: Callable[..., torch.Tensor], name: str | None = None):
        if not callable(fn):
            raise AttnkitTypeError(f"custom mask fn must be callable, got {describe(fn)}; pass a function "
                                   "fn(b, h, q_pos, kv_pos) -> bool tensor.")
        self.fn, self.name = fn, name or getattr(fn, "__name__", "fn")

    def bind(self, ctx: MaskContext) -> BoundMask:
        positions, user = _lookup(ctx), self.fn

        name = self.name

        def fn(b, h, q_idx, kv_idx):
            q_pos, kv_pos = positions(b, q_idx, kv_idx)
            allowed = user(b, h, q_pos, kv_pos)
            if not (isinstance(allowed, torch.Tensor) and allowed.dtype == torch.bool):
                # one meaning on every backend: a 0/1 float (or int) would be a bias to SDPA, a truth value to
                # the block cover and a bitwise ~ elsewhere
                raise AttnkitTypeError(f"custom mask fn {name!r} must return a bool tensor (True = may attend), got "
                                       f"{describe(allowed)}; return a comparison such as (kv_pos <= q_pos), "
                                       "or x.bool() / x > 0, and pass additive float scores as bias=.")
            return allowed

        return fn

    def __repr__(self) -> str:
        return f"custom({self.name})"


class PositionPadding(MaskSpec):
    """Padding read by key *position*: the key at position j of row b is real when ``j >= start[b]`` (``start``
    int ``(B,)``: left padding, real from position p on), or when ``key_is_real[b, j]`` (bool ``(B, N)`` indexed
    by position, every key's position in ``[0, N)``: transformers' ``padding_mask_function``). Unlike
    ``padding(key_is_real)`` (by key index) it does not depend on the order a cache keeps its slots in."""

    positional, kind = True, "padding_by_position"

    def __init__(self, start: torch.Tensor | Sequence[int] | None = None, key_is_real: torch.Tensor | None = None):
        if (start is None) == (key_is_real is None):
            raise AttnkitValueError("padding by position takes start=... (B,) or a key_is_real table (B, N), exactly "
                                    "one; e.g. ak.masks.padding(start=first_real_positions).")
        self.start = None if start is None else _row_ints(start, "start", "the position of each row's first real key")
        if key_is_real is not None and (not isinstance(key_is_real, torch.Tensor) or key_is_real.dtype != torch.bool
                                        or key_is_real.dim() != 2):
            raise AttnkitValueError(f"padding(key_is_real, by='position') expects a bool tensor (B, N) indexed by key "
                                    f"position, True = real, got {describe(key_is_real)}; pass attention_mask.bool().")
        self.key_is_real = key_is_real
        self.batch = (self.start if start is not None else key_is_real).shape[0]

    def real_keys(self, ctx: MaskContext) -> torch.Tensor:
        """Which keys of the call are real: bool ``(B, Lk)``."""
        kv = ctx.kv_positions  # (B, Lk)
        if self.start is not None:
            return kv >= self.start.to(ctx.device).expand(ctx.batch)[:, None]  # (B, Lk)
        table = self.key_is_real.to(ctx.device).expand(ctx.batch, -1)  # (B, N)
        if kv.numel() and not torch.compiler.is_compiling() and (int(kv.min()) < 0 or int(kv.max()) >= table.shape[1]):
            raise AttnkitValueError(
                f"padding(key_is_real, by='position') covers positions 0..{table.shape[1] - 1} but the call's keys sit "
                f"at positions {int(kv.min())}..{int(kv.max())}; pass a table with one entry per position.")
        return table.gather(1, kv)  # (B, Lk)

    def bind(self, ctx: MaskContext) -> BoundMask:
        _check_batch(self, ctx)
        real = self.real_keys(ctx)  # (B, Lk)
        return lambda b, h, q_idx, kv_idx: real[b, kv_idx]

    def __repr__(self) -> str:
        return f"padding(start={_short(self.start)})" if self.start is not None else "padding(key_is_real, by='position')"


def _row_ints(values: object, name: str, what: str) -> torch.Tensor:
    data = torch.as_tensor(values)
    if data.dtype.is_floating_point or data.dtype.is_complex or data.dtype == torch.bool or data.dim() != 1:
        raise AttnkitValueError(f"{name} must be ints (B,), {what}, got {describe(values)}.")
    return data.long()  # (B,)


def _short(values: torch.Tensor) -> str:
    text = str(values.tolist())
    return text if len(text) < 40 else "..."


def _rows_of(values: torch.Tensor, grid: BlockGrid) -> torch.Tensor:
    """Per-row ``values (B|1,)`` for the grid's rows ``(R,)``."""
    return values.to(grid.ctx.device).expand(grid.ctx.batch)[grid.rows]


def is_plain_causal(mask: object) -> bool:
    """Whether ``mask`` is exactly ``causal()``: the kind alone (no ``&``, no subclass), so it carries no data and
    its kind is the whole mask (a table of forms keyed on shapes alone may serve it)."""
    return type(mask) is Causal


# ---------------------------------------------------------------- block covers (masks.blocks)


@cover.register
def _(mask: Causal, grid: BlockGrid) -> BlockCover:
    (q_lo, q_hi), (kv_lo, kv_hi) = grid.q_pos, grid.kv_pos
    return BlockCover(outer(q_hi, kv_lo, torch.ge), outer(q_lo, kv_hi, torch.ge))


@cover.register
def _(mask: SlidingWindow, grid: BlockGrid) -> BlockCover:
    (q_lo, q_hi), (kv_lo, kv_hi) = grid.q_pos, grid.kv_pos
    d_lo, d_hi = outer(q_lo, kv_hi, torch.sub), outer(q_hi, kv_lo, torch.sub)  # range of p - j per tile
    w = mask.window
    return BlockCover((d_hi >= 0) & (d_lo < w), (d_lo >= 0) & (d_hi < w))


@cover.register
def _(mask: TwoSidedWindow, grid: BlockGrid) -> BlockCover:
    (q_lo, q_hi), (kv_lo, kv_hi) = grid.q_pos, grid.kv_pos
    d_lo, d_hi = outer(kv_lo, q_hi, torch.sub).T, outer(kv_hi, q_lo, torch.sub).T  # range of j - p per tile
    lo, hi = -mask.left, mask.right
    return BlockCover((d_hi >= lo) & (d_lo <= hi), (d_lo >= lo) & (d_hi <= hi))


@cover.register
def _(mask: Chunked, grid: BlockGrid) -> BlockCover:
    causal = cover(Causal(), grid)
    shift = 0 if mask.start is None else _rows_of(mask.start, grid)[:, None]  # (R, 1)
    q_chunk = grid.q_tiles(torch.div(grid.ctx.q_positions[grid.rows] - shift, mask.chunk, rounding_mode="floor"))
    kv_chunk = grid.kv_tiles(torch.div(grid.ctx.kv_positions[grid.rows] - shift, mask.chunk, rounding_mode="floor"))
    return BlockCover(causal.any & overlap(*q_chunk, *kv_chunk), causal.full & single_equal(*q_chunk, *kv_chunk))


@cover.register
def _(mask: Strided, grid: BlockGrid) -> BlockCover:
    s = mask.stride
    q_pos = torch.remainder(grid.ctx.q_positions[grid.rows], s)  # (R, Lq) residues
    kv_pos = torch.remainder(grid.ctx.kv_positions[grid.rows], s)  # (R, Lk)
    q_r, kv_r = grid.q_tiles(q_pos), grid.kv_tiles(kv_pos)
    return BlockCover(overlap(*q_r, *kv_r), single_equal(*q_r, *kv_r))


@cover.register
def _(mask: GlobalTokens, grid: BlockGrid) -> BlockCover:
    table = torch.tensor(mask.positions, device=grid.ctx.device)

    def is_global(pos):  # (R, L) -> (R, L) int
        return torch.isin(pos, table).to(torch.int8)

    q_lo, q_hi = grid.q_tiles(is_global(grid.ctx.q_positions[grid.rows]))
    kv_lo, kv_hi = grid.kv_tiles(is_global(grid.ctx.kv_positions[grid.rows]))
    any_ = (q_hi.bool()[:, None]) | (kv_hi.bool()[None, :])
    full = (q_lo.bool()[:, None]) | (kv_lo.bool()[None, :])
    return BlockCover(any_, full)


@cover.register
def _(mask: PositionPadding, grid: BlockGrid) -> BlockCover:
    real = mask.real_keys(grid.ctx)[grid.rows].to(torch.int8)  # (R, Lk)
    lo, hi = grid.kv_tiles(real)
    return BlockCover(hi.bool()[None, :].expand(grid.n_q, -1), lo.bool()[None, :].expand(grid.n_q, -1))

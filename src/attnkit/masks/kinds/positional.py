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
from attnkit.masks.spec import MaskSpec, _lookup


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
    positions, causally: ``j // C == p // C`` and ``j <= p``."""

    positional, kind = True, "chunked"

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

        def fn(b, h, q_idx, kv_idx):
            q_pos, kv_pos = positions(b, q_idx, kv_idx)
            return user(b, h, q_pos, kv_pos)

        return fn

    def __repr__(self) -> str:
        return f"custom({self.name})"


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
    q_chunk = grid.q_tiles(torch.div(grid.ctx.q_positions[grid.rows], mask.chunk, rounding_mode="floor"))
    kv_chunk = grid.kv_tiles(torch.div(grid.ctx.kv_positions[grid.rows], mask.chunk, rounding_mode="floor"))
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

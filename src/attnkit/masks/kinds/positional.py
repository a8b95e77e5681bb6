"""Masks that read token positions: a query at absolute position p against a key at position j (bottom-right
aligned by default; docs/conventions.md).

Shape legend: B batch, Lq/Lk query/key lengths, n global positions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from attnkit._checks import integer, positive_int
from attnkit.errors import AttnkitTypeError, AttnkitValueError, describe
from attnkit.masks.spec import BoundMask, MaskContext, MaskSpec, _lookup


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

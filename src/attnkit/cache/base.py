"""The KV-cache protocol and what every attnkit cache shares: input checks, position bookkeeping and the
mask rules that make cached decoding equal to the full forward.

A cache stores keys and values ``(B, Hkv, Lnew, D)`` of new tokens together with their absolute positions
``(B|1, Lnew)``, and returns every key the new queries may need with the absolute position of each. Masks are
then evaluated on those positions (bottom-right causality, windows, padding by position with
``ak.masks.padding(start=...)``), never on "the last n columns", so slot order, ring
wrap-around and left padding cannot shift a mask.

Rules enforced by every attnkit cache (typed errors, nothing silently dropped):

- tensors match the cache: batch B, Hkv heads (GQA caches store Hkv heads, not H), head dim D, dtype, device;
- positions continue the cached sequence row by row: each update's positions are consecutive and start one
  after the last cached position of that row (so a token fed twice, skipped or out of order is an error);
- a cache that is full says so (:class:`CacheFullError`) instead of dropping keys;
- parts of a mask defined on key indices (``padding``, ``document``, ``dense``: :func:`index_parts`) are served
  only where the returned keys are in written order: the sliding cache (a ring) refuses them, the static cache
  refuses a document mask without ``q_doc_ids`` (its queries are not its last slots).

Shape legend: B batch, Hkv key/value heads, W window, Lnew new tokens, Lk returned keys, D head dim.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from attnkit._checks import position_ids, positive_int
from attnkit.errors import AttnkitTypeError, AttnkitValueError, describe
from attnkit.masks import MaskSpec

#: position of an empty slot in a fixed-shape cache: later than any query, so every causal mask hides it
EMPTY_POSITION = 2**62

_UNREAD = -1  # CacheBase._host_next: known on the device, read back when first asked for


class CacheFullError(AttnkitValueError):
    """A cache with a fixed capacity was asked to store more tokens than it holds."""


@runtime_checkable
class KVCache(Protocol):
    """What :class:`attnkit.nn.MultiHeadAttention` needs from a cache."""

    def update(self, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Store new keys/values ``(B, Hkv, Lnew, D)`` at absolute positions ``(B|1, Lnew)`` int64; return ALL
        keys and values the new queries may need ``(B, Hkv, Lk, D)`` and their positions ``(B|1, Lk)``."""
        ...


def reach_of(mask: object) -> tuple[int | None, int | None]:
    """``mask.reach()`` (offset bounds ``kv_pos - q_pos`` of its allowed entries, see
    :meth:`attnkit.masks.MaskSpec.reach`); unbounded for no mask, a tensor or anything else."""
    mask = getattr(mask, "spec", mask)  # a prepared mask answers for its spec
    return mask.reach() if isinstance(mask, MaskSpec) else (None, None)


def index_parts(mask: object) -> list[MaskSpec]:
    """The leaves of ``mask`` defined on key/query *indices* rather than positions (``padding``, ``document``,
    ``dense``): right only where the cache returns keys in the order they were written."""
    mask = getattr(mask, "spec", mask)
    return [leaf for leaf in mask.leaves() if not leaf.positional] if isinstance(mask, MaskSpec) else []


def _covers(outer: tuple[int | None, int | None], inner: tuple[int | None, int | None]) -> bool:
    """Whether the offset interval ``outer`` contains ``inner`` (None = unbounded)."""
    (olo, ohi), (ilo, ihi) = outer, inner
    return (olo is None or (ilo is not None and olo <= ilo)) and (ohi is None or (ihi is not None and ohi >= ihi))


class CacheBase:
    """Shared state and checks of the attnkit caches. Subclasses implement ``_store``.

    Args:
        batch_size: B. num_kv_heads: Hkv. head_dim: D. dtype/device: of the stored tensors.
    """

    kind = "base"
    #: offsets ``kv_pos - q_pos`` of the keys returned after a one-token update, relative to that token
    #: (None = unbounded): what :meth:`decode_mask` must still mask
    returned_offsets: tuple[int | None, int | None] = (None, None)

    def __init__(self, batch_size: int, num_kv_heads: int, head_dim: int, *, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None):
        for name, value in (("batch_size", batch_size), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)):
            positive_int(value, name)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise AttnkitTypeError(f"dtype must be a floating-point torch.dtype, got {describe(dtype)}; pass the "
                                   "model's dtype, e.g. dtype=next(model.parameters()).dtype.")
        self.batch_size, self.num_kv_heads, self.head_dim = batch_size, num_kv_heads, head_dim
        self.dtype, self.device = dtype, torch.device(device if device is not None else "cpu")
        self._length = 0
        self._next: torch.Tensor | None = None  # (B, 1) next expected position per row
        self._issued: torch.Tensor | None = None  # what next_positions returned for the coming update
        self._host_next: int | None = None  # one past the largest stored position, on the host (None: unknown)

    def _allocate(self, slots: int, empty_position: int) -> None:
        """Preallocate ``slots`` key/value slots per row, ``(B, Hkv, slots, D)``, positions ``(B, slots)``."""
        shape = (self.batch_size, self.num_kv_heads, slots, self.head_dim)
        self.k = torch.zeros(shape, dtype=self.dtype, device=self.device)  # (B, Hkv, slots, D)
        self.v = torch.zeros(shape, dtype=self.dtype, device=self.device)  # (B, Hkv, slots, D)
        self.positions = torch.full((self.batch_size, slots), empty_position, dtype=torch.long,
                                    device=self.device)  # (B, slots)

    # ------------------------------------------------------------------ the protocol
    def update(self, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor):
        positions = self._check(k, v, positions)  # (B|1, Lnew) int64
        out = self._store(k, v, positions)
        n = k.shape[2]
        self._advance(n)
        if self._next is None:
            self._next = positions[:, -1:].expand(self.batch_size, 1) + 1  # (B, 1)
            self._host_next = None if torch.compiler.is_compiling() else _UNREAD  # read once, when first asked
        else:
            self._next = self._next + n  # the positions were checked to continue from it
            if torch.compiler.is_compiling():  # written, not read: reading it would guard the graph on its value
                self._host_next = None
            elif self._host_next is not None and self._host_next != _UNREAD:
                self._host_next += n
        self._issued = None
        return out

    def next_positions(self, n: int) -> torch.Tensor:
        """The absolute positions ``(B|1, n)`` int64 of the next ``n`` tokens of every row: one after the last
        cached position (``arange(n)`` on an empty cache), from the cache's own device-side bookkeeping (no host
        read). An update given this very tensor skips its position checks: there is nothing a user could have
        got wrong."""
        if self._next is None:
            positions = torch.arange(n, device=self.device)[None]  # (1, n)
        else:
            positions = self._next if n == 1 else self._next + torch.arange(n, device=self.device)  # (B, n)
        self._issued = positions
        return positions

    @property
    def position_bound(self) -> int | None:
        """One past the largest position stored so far, as a Python int (None: empty, or only known on the device
        after compiled steps): the next ``n`` tokens sit below ``position_bound + n``. Read from the device once
        per sequence, the first time it is asked for; kept on the host after that."""
        if self._host_next == _UNREAD:
            self._host_next = int(self._next.max())
        return self._host_next

    @property
    def length(self) -> int:
        """Tokens stored so far per row (columns of the batch, left padding included)."""
        return self._length

    def _advance(self, n: int) -> None:
        self._length += n

    def _store(self, k, v, positions):
        raise NotImplementedError

    # ------------------------------------------------------------------ mask rules (used by MultiHeadAttention)
    def check_mask(self, mask: object) -> None:
        """Raise unless ``mask`` keeps cached decoding equal to the full forward: it must never reach ahead
        (``mask.reach()[1] <= 0``, e.g. ``causal()``, ``sliding_window(W)``, ``chunked(C)`` among its ``&``
        parts), or later tokens would be visible in the full forward but absent from the cache (and empty
        slots of fixed-shape caches would be visible)."""
        ahead = reach_of(mask)[1]
        if ahead is None or ahead > 0:
            raise AttnkitValueError(
                f"with a KV cache the mask must be causal, got mask={mask!r}; pass ak.masks.causal() (or "
                "sliding_window(W)), combined with & for padding, e.g. causal() & padding(key_is_real).")

    def decode_mask(self, mask: MaskSpec | None, returned: tuple[int | None, int | None] | None = None
                    ) -> MaskSpec | None:
        """The mask a single newest query still needs after the last update: ``None`` when the mask allows
        exactly an offset interval (:meth:`~attnkit.masks.MaskSpec.offsets`) that contains every offset of the
        returned keys (``returned``, default :attr:`returned_offsets`), so every returned key is visible."""
        exact = getattr(mask, "spec", mask).offsets() if mask is not None else None
        returned = self.returned_offsets if returned is None else returned
        return None if exact is not None and _covers(exact, returned) else mask

    def decode_view(self, k: torch.Tensor, v: torch.Tensor, kv_positions: torch.Tensor, mask):
        """What a single newest query needs from the keys, values and positions the last update returned, and the
        mask it still needs (:meth:`decode_mask`); a cache may narrow them to the keys it can see."""
        return k, v, kv_positions, self.decode_mask(mask)

    # ------------------------------------------------------------------ checks
    def _check(self, k: object, v: object, positions: object) -> torch.Tensor:
        # the usual call passes in one test; anything else gets the detailed checks and their messages
        if not (type(k) is torch.Tensor and type(v) is torch.Tensor and k.dim() == 4 and k.shape == v.shape
                and k.shape[0] == self.batch_size and k.shape[1] == self.num_kv_heads and k.shape[3] == self.head_dim
                and k.dtype == self.dtype == v.dtype and k.device == self.device == v.device):
            self._check_kv(k, v)
        n = k.shape[2]
        if n == 0:
            raise AttnkitValueError("update got Lnew=0 new tokens; call the cache with at least one token.")
        if positions is self._issued and positions is not None and positions.shape[-1] == n:
            return positions  # the cache's own next_positions(n): continuing by construction
        return self._check_positions(positions, n, tuple(k.shape))

    def _check_kv(self, k: object, v: object) -> None:
        """Raise the typed error for keys/values that do not fit the cache."""
        for name, t in (("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor):
                raise AttnkitTypeError(f"{name} must be a torch.Tensor (B, Hkv, Lnew, D), got {describe(t)}.")
            want = (self.batch_size, self.num_kv_heads, t.shape[2] if t.dim() == 4 else "Lnew", self.head_dim)
            if t.dim() != 4 or t.shape[0] != self.batch_size or t.shape[1] != self.num_kv_heads \
                    or t.shape[3] != self.head_dim:
                raise AttnkitValueError(
                    f"{name} must have shape (B={self.batch_size}, Hkv={self.num_kv_heads}, Lnew, D={self.head_dim}) "
                    f"for this {self.kind} cache, got {describe(t)}; GQA caches store the Hkv key/value heads (not H), "
                    f"and the cache must be built for this batch and head_dim (expected {want}).")
            if t.dtype != self.dtype:
                raise AttnkitTypeError(f"{name} has dtype {t.dtype} but the cache stores {self.dtype}; build the cache "
                                       f"with dtype={t.dtype} (the model's dtype).")
            if t.device != self.device:
                raise AttnkitValueError(f"{name} is on {t.device} but the cache is on {self.device}; build the cache "
                                        f"with device={t.device}.")
        if k.shape != v.shape:
            raise AttnkitValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must have the same shape.")

    def _check_positions(self, positions: object, n: int, k_shape: tuple) -> torch.Tensor:
        """``positions`` given for an update of ``n`` tokens, as int64 ``(B|1, n)``, checked to continue the cache."""
        if not _ready(positions, n, self.batch_size, self.device):  # the one check, when not already in its form
            positions = position_ids(positions, length=n, batch=self.batch_size, device=self.device, owner="cache",
                                     two_dims=True, note=f" for k {k_shape}")  # (B|1, Lnew) int64
        if torch.compiler.is_compiling():
            return positions  # value checks need a host sync; eager calls check them
        if self._next is None:
            steps = torch.arange(n, device=positions.device)  # (Lnew,)
            if n > 1 and not torch.equal(positions - positions[:, :1], steps.expand_as(positions)):
                raise AttnkitValueError(f"positions must be consecutive within an update, got {_rows(positions)}; "
                                        "feed tokens in order, one position per token.")
        else:
            expected = self._next if n == 1 else self._next + torch.arange(n, device=positions.device)  # (B, Lnew)
            if not torch.equal(positions.expand_as(expected), expected):
                raise AttnkitValueError(
                    f"positions must continue the cached sequence: expected {_rows(expected)} (one after the last "
                    f"cached position of each row), got {_rows(positions)}. Feed every token once, in order; start a "
                    "new cache (or cache.reset()) for a new sequence.")
        return positions

    def reset(self) -> None:
        """Forget every stored token (buffers are kept and overwritten)."""
        self._length, self._next, self._issued, self._host_next = 0, None, None, None
        self._reset()

    def _reset(self) -> None:
        pass

    def memory_bytes(self) -> int:
        """Bytes held by the cache's stored tensors."""
        return sum(t.numel() * t.element_size() for t in self._buffers())

    def _buffers(self) -> list[torch.Tensor]:
        return []

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(batch_size={self.batch_size}, num_kv_heads={self.num_kv_heads}, "
                f"head_dim={self.head_dim}, length={self.length})")




def _ready(positions: object, n: int, batch: int, device: torch.device) -> bool:
    """Whether ``positions`` already is what :func:`~attnkit._checks.position_ids` returns for an update of ``n``
    tokens (int64 ``(1|B, n)`` on the cache's device), so its conversion can be skipped."""
    return isinstance(positions, torch.Tensor) and positions.dtype == torch.long and positions.dim() == 2 and \
        positions.shape[1] == n and positions.shape[0] in (1, batch) and positions.device == device


def _rows(positions: torch.Tensor, limit: int = 3) -> str:
    rows = [row[:6] for row in positions[:limit].tolist()]
    return f"{rows}{' ...' if positions.shape[0] > limit else ''}"

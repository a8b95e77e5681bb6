"""Hugging Face masks as attnkit masks: transformers' mask interface, answered with structure, not a 4-D tensor.

transformers builds every mask from a small vocabulary of index functions (``causal_mask_function``,
``sliding_window_overlay(W)``, ``chunked_overlay(C, left_padding)``, ``padding_mask_function``,
``packed_sequence_mask_function``, position remapping for packed rows) combined with ``and_masks``/``or_masks``,
plus a 2-D padding mask and the offsets of the queries and keys in the cache. :func:`mask_interface` is
registered as the ``"attnkit"`` entry of ``AttentionMaskInterface``: it reads that vocabulary back into an
``ak.masks`` expression with the positions it is evaluated on, so a sliding window reaches attnkit's router as a
window (block-skipping backends, an offset band for caches) and a padded batch as ``padding(key_is_real)``.

A function outside the vocabulary (a model's own ``or_mask_function``, image-token overlays) is evaluated by
transformers' own ``sdpa_mask`` into a dense boolean tensor — still exact, but without structure; ``HFMask.dense_reason``
says why, and ``ak.explain`` shows ``dense(...)`` for it.

Positions: HF masks are written on cache indices (``q_offset + i``, ``kv_offset + j``). attnkit evaluates
position masks on the positions it is given, so the queries and keys get those indices as positions (or, for
packed rows, the ``position_ids`` HF remaps them to); index-based parts (padding, documents) read the call's
own key and query indices, exactly as HF's do after its offsets.

Shape legend: B batch, Lq queries of this call, Lk keys of this call (cache included).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from attnkit import masks
from attnkit.errors import AttnkitValueError

_HF_MODULE = "transformers.masking_utils"


@dataclass(frozen=True)
class HFMask:
    """What the ``"attnkit"`` mask interface hands to the attention function of every layer.

    ``spec`` is an ``ak.masks`` expression (None: every key visible); ``q_positions`` ``(B|1, Lq)`` and
    ``kv_positions`` ``(B|1, Lk)`` are the positions it is evaluated on (None: attnkit's bottom-right defaults,
    which they equal). ``dense_reason`` is set when part of the mask had no structured form.
    """

    spec: masks.MaskSpec | None
    q_positions: torch.Tensor | None
    kv_positions: torch.Tensor | None
    q_len: int
    kv_len: int
    dense_reason: str | None = None
    #: set when the mask is ``causal()`` or ``sliding_window(W)`` (this positional part) & padding ``key_is_real``
    #: ``(B, Lk)`` (None: all real) on cache indices from 0 (``q_positions`` ``(1, Lq)``): :meth:`narrowed` may then
    #: drop the keys no query can reach
    positional: masks.MaskSpec | None = field(default=None, compare=False)
    key_is_real: torch.Tensor | None = field(default=None, compare=False, repr=False)
    _prepared: dict = field(default_factory=dict, compare=False, repr=False)  # batch -> PreparedMask
    _narrowed: list = field(default_factory=list, compare=False, repr=False)  # [the narrowed HFMask], once

    def for_layers(self, batch: int) -> masks.PreparedMask | masks.MaskSpec | None:
        """The mask every layer of this forward passes to ``ak.attention``: prepared once, on the first layer's
        call (bound to the positions, its dense form and plans built once, not once per layer), for ``batch`` rows.

        While torch.compile traces the forward this is the expression itself: the compiled graph binds it, and
        nothing is stored on an object the graph receives as an input."""
        if self.spec is None or torch.compiler.is_compiling():
            return self.spec
        if batch not in self._prepared:
            q_pos = self.q_len if self.q_positions is None else self.q_positions  # (B|1, Lq) or the length
            kv_pos = self.kv_len if self.kv_positions is None else self.kv_positions  # (B|1, Lk) or the length
            self._prepared[batch] = masks.prepare(self.spec, q_pos, kv_pos, batch)
        return self._prepared[batch]

    def narrowed(self) -> HFMask:
        """This mask over only the keys some query can reach, on attnkit's default positions: the first
        ``n`` keys, n - 1 the newest query's position (a causal query at p < n sees no key at j >= n), or ``self``.

        A static cache hands every layer all of its ``max_cache_len`` slots (a sliding layer: its window's) with the
        unfilled ones masked; run eagerly, the call then needs neither those keys nor explicit positions (a decode
        step: no mask at all; a prefill: plain causal with Lq == Lk, SDPA's ``is_causal``; a window that cuts
        stays). Found once per forward (one host read of the positions; not of the cache's offset tensor, which the
        first layer's cache update advances in place); while torch.compile (or torch.jit.trace) traces it is
        ``self``, so a traced graph keeps one structure at every step."""
        if self.positional is None or torch.compiler.is_compiling() or torch.jit.is_tracing():
            return self
        if not self._narrowed:
            n = int(self.q_positions[0, -1]) + 1
            narrow = self
            if n < self.kv_len:
                # on default positions (the queries: the last Lq of n keys); none when every query sees every key
                seen = _sees_every_key(self.positional, n - self.q_len, 0, self.q_len, n)
                spec = None if seen else self.positional
                real = None if self.key_is_real is None else self.key_is_real[:, :n]  # (B, n)
                if real is not None and not bool(real.all()):
                    spec = masks.padding(real) if spec is None else spec & masks.padding(real)
                narrow = HFMask(spec, None, None, self.q_len, n, self.dense_reason)
            self._narrowed.append(narrow)
        return self._narrowed[0]

    @property
    def narrowable(self) -> bool:
        return self.positional is not None

    # transformers' modeling code sometimes reads a mask's shape/device (e.g. to slice it); answer like a 4-D mask
    @property
    def shape(self) -> tuple[int, int, int, int]:
        batch = max(self.spec.batch if self.spec is not None else 1,
                    *(p.shape[0] for p in (self.q_positions, self.kv_positions) if p is not None))
        return (batch, 1, self.q_len, self.kv_len)

    @property
    def ndim(self) -> int:
        return 4

    def dim(self) -> int:
        return 4

    def __repr__(self) -> str:
        return f"HFMask({self.spec!r}, Lq={self.q_len}, Lk={self.kv_len})"


def mask_interface(batch_size: int, q_length: int, kv_length: int, q_offset=0, kv_offset=0,
                   mask_function: Callable = None, attention_mask: torch.Tensor | None = None,
                   device="cpu", use_vmap: bool = False, **_ignored) -> HFMask:
    """The ``"attnkit"`` entry of transformers' ``AttentionMaskInterface`` (same keyword arguments as
    ``sdpa_mask``); returns an :class:`HFMask` for :func:`attnkit.integrations.hf.attention_forward`."""
    from transformers.masking_utils import causal_mask_function, prepare_padding_mask, sdpa_mask

    if isinstance(attention_mask, HFMask):  # generate with a compileable (static) cache built it for this step
        if (attention_mask.q_len, attention_mask.kv_len) != (q_length, kv_length):
            raise AttnkitValueError(
                f"attention_mask is an attnkit mask built for Lq={attention_mask.q_len}, Lk={attention_mask.kv_len} "
                f"but this call has Lq={q_length}, Lk={kv_length}; pass the 2-D padding mask (B, L) instead and let "
                "the model build the mask.")
        return attention_mask
    kv_offset = int(kv_offset)
    mask_function = causal_mask_function if mask_function is None else mask_function
    reader = _Reader(device)
    spec = _alone(reader.read(mask_function))
    if reader.position_ids is not None:  # packed rows: HF remaps indices to position_ids (Lq == Lk, no cache)
        q_pos = kv_pos = reader.position_ids.to(device).long().expand(batch_size, -1)  # (B, L)
    elif _default_positions(q_offset, kv_offset, q_length, kv_length):
        q_pos = kv_pos = None  # attnkit's defaults: keys arange(Lk), queries the last Lq of them
    else:
        q_pos = (torch.arange(q_length, device=device) + q_offset)[None]  # (1, Lq) cache indices of the queries
        kv_pos = (torch.arange(kv_length, device=device) + kv_offset)[None]  # (1, Lk)
    exact = reader.position_ids is None and reader.unknown is None  # spec is the whole mask, on cache indices
    if exact and _sees_every_key(spec, q_offset, kv_offset, q_length, kv_length):
        spec = q_pos = kv_pos = None  # (a decode step) no mask to build, bind or check per layer, no positions
    # causal or a causal window on cache indices from 0 (a static cache): attention_forward may narrow it
    narrowable = exact and _causal_band(spec) is not None and q_pos is not None and kv_offset == 0
    positional = spec if narrowable else None
    why = None
    if reader.unknown:
        why = f"mask function {reader.unknown} has no attnkit form"
        dense = sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                          kv_offset=kv_offset, mask_function=mask_function, attention_mask=None,
                          allow_is_causal_skip=False, use_vmap=use_vmap, device=device)  # (B, 1, Lq, Lk) bool
        spec = masks.dense(dense)
    key_is_real = _key_is_real(attention_mask, kv_length, kv_offset, prepare_padding_mask)  # (B, Lk) or None
    if key_is_real is not None:
        pad = masks.padding(key_is_real)
        spec = pad if spec is None else spec & pad
    return HFMask(spec, q_pos, kv_pos, q_length, kv_length, why, positional=positional,
                  key_is_real=key_is_real if narrowable else None)


def _causal_band(spec) -> tuple[int | None, int] | None:
    """``(lo, 0)`` when ``spec`` allows exactly the offsets ``lo <= kv_pos - q_pos <= 0`` (``causal()``: lo None; a
    causal ``sliding_window(W)``: 1 - W), read from the mask's own offsets; None for anything else."""
    band = None if spec is None else spec.offsets()
    return band if band is not None and band[1] == 0 else None


def _sees_every_key(spec, q_offset, kv_offset: int, q_length: int, kv_length: int) -> bool:
    """Whether every query sees every key of the call under ``spec`` (a causal band: ``causal()`` or a causal
    ``sliding_window(W)``) on the cache indices ``q_offset + i``, ``kv_offset + j``: the first query sees the
    newest key, and (a window) the last query still sees the oldest. Then the call needs no positional mask: a
    decode step of a dynamic cache, full layers and sliding layers alike (a sliding cache keeps only the keys
    the window reaches). A static cache's tensor offset is not read here (no host sync; see HFMask.narrowed)."""
    band = _causal_band(spec)
    if isinstance(q_offset, torch.Tensor) or band is None:
        return False
    first_query, last_query = q_offset, q_offset + q_length - 1
    oldest_key, newest_key = kv_offset, kv_offset + kv_length - 1
    if newest_key > first_query:
        return False
    return band[0] is None or oldest_key - last_query >= band[0]  # window W: lo = 1 - W, p - W < j


def _default_positions(q_offset, kv_offset: int, q_length: int, kv_length: int) -> bool:
    """Whether the call's cache indices are attnkit's default positions, so none need passing.

    A compileable (static) cache passes ``q_offset`` as a 0-d tensor, so that reading it costs no host sync and
    no graph break: its calls always get explicit positions, and the mask keeps one structure at every decode
    step (it used to drop them at the step where the cache fills, and a compiled forward compiled again)."""
    if isinstance(q_offset, torch.Tensor):
        return False
    return kv_offset == 0 and q_offset == kv_length - q_length


def _key_is_real(attention_mask, kv_length: int, kv_offset: int, prepare) -> torch.Tensor | None:
    """The call's real keys ``(B, Lk)`` from HF's 2-D mask ``(B, seen + Lq)`` (True = real token); None when every
    key is real (no padding mask needed)."""
    if attention_mask is None:
        return None
    padded = prepare(attention_mask.bool(), kv_length, kv_offset)  # (B, >= kv_offset + Lk)
    key_is_real = padded[:, kv_offset:kv_offset + kv_length]  # (B, Lk) real keys of this call
    return None if bool(key_is_real.all()) else key_is_real


class _Reader:
    """Reads a transformers mask function back into an ``ak.masks`` expression (None = all visible)."""

    def __init__(self, device):
        self.device = device
        self.position_ids: torch.Tensor | None = None
        self.unknown: str | None = None

    def read(self, fn: Callable) -> masks.MaskSpec | _Overlay | None:
        """The expression of ``fn``; an overlay (not a mask by itself) stays an :class:`_Overlay` for ``_and``."""
        name = _name(fn)
        cells = _closure(fn)
        if name == "causal_mask_function":
            return masks.causal()
        if name == "bidirectional_mask_function":
            return None
        if name in ("and_masks.<locals>.and_mask", "or_masks.<locals>.or_mask"):
            parts = [self.read(f) for f in cells["mask_functions"]]
            return _and(parts) if name.startswith("and") else _or([_alone(p) for p in parts])
        if name == "sliding_window_overlay.<locals>.inner_mask":
            return _window_overlay(int(cells["sliding_window"]))
        if name == "sliding_window_bidirectional_overlay.<locals>.inner_mask":
            w = int(cells["sliding_window"])  # |q - kv| <= w: q - w <= kv <= q + w
            return masks.sliding_window(w, w)
        if name == "chunked_overlay.<locals>.inner_mask":
            return _chunk_overlay(int(cells["chunk_size"]), cells["left_padding"])
        if name == "padding_mask_function.<locals>.inner_mask":  # padding_mask[b, kv]: a table read by position
            return masks.padding(cells["padding_mask"].bool(), by="position")
        if name == "packed_sequence_mask_function.<locals>.inner_mask":
            return masks.document(cells["packed_sequence_mask"])
        if name == "remap_positions_for_packed_sequence.<locals>.inner_mask":
            self.position_ids = cells["position_ids"]
            return _alone(self.read(cells["mask_function"]))
        self.unknown = self.unknown or name
        return None


def _name(fn: Callable) -> str:
    if getattr(fn, "__module__", None) != _HF_MODULE:
        return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
    return fn.__qualname__


def _closure(fn: Callable) -> dict:
    code = getattr(fn, "__code__", None)
    if code is None or not fn.__closure__:
        return {}
    return {name: cell.cell_contents for name, cell in zip(code.co_freevars, fn.__closure__)}


@dataclass(frozen=True)
class _Overlay:
    """An HF overlay, not causal by itself: inside an ``and`` with ``causal()`` the two are ``with_causal`` (a mask
    kind); anywhere else ``alone``, a custom mask of HF's own formula."""

    name: str
    size: int
    with_causal: masks.MaskSpec
    alone: masks.MaskSpec


def _window_overlay(window: int) -> _Overlay:
    """HF's ``sliding_window_overlay(W)``: keys newer than ``q - W``; with causal, ``sliding_window(W)``."""
    alone = masks.custom(lambda b, h, q, kv: kv > q - window, name=f"window_overlay({window})")
    # W < 1 (Qwen2-MoE builds its unused sliding mask from sliding_window=0) sees nothing: the overlay & causal says so
    return _Overlay("window", window, masks.sliding_window(window) if window >= 1 else alone & masks.causal(), alone)


def _alone(part):
    return part.alone if isinstance(part, _Overlay) else part


def _and(parts: list) -> masks.MaskSpec | None:
    parts = [p for p in parts if p is not None]
    overlays = [p for p in parts if isinstance(p, _Overlay)]
    causal = [p for p in parts if masks.is_plain_causal(p)]
    if causal:  # sliding_window_causal_mask_function: overlay & causal == sliding_window(W) (the narrowest)
        windows = sorted((o for o in overlays if o.name == "window"), key=lambda o: o.size)[:1]
        merged = [o.with_causal for o in windows + [o for o in overlays if o.name != "window"]]
        if merged:
            parts = merged + [p for p in parts if not isinstance(p, _Overlay) and not masks.is_plain_causal(p)]
    parts = [_alone(p) for p in parts]
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else masks.And(*parts)


def _or(parts: list) -> masks.MaskSpec | None:
    if any(p is None for p in parts):
        return None  # one part lets everything through
    return parts[0] if len(parts) == 1 else masks.Or(*parts)


def _chunk_overlay(chunk: int, left_padding: torch.Tensor) -> _Overlay:
    """HF's ``chunked_overlay``: keys of the query's chunk, chunks counted from each row's first real token; with
    causal, ``chunked(C, start=left_padding)``."""
    lp = torch.as_tensor(left_padding).long().reshape(-1)  # (B,)

    def same_chunk(b, h, q, kv):
        shift = lp.to(q.device)[b]
        return torch.div(kv - shift, chunk, rounding_mode="floor") == torch.div(q - shift, chunk, rounding_mode="floor")

    return _Overlay("chunk", chunk, masks.chunked(chunk, start=lp), masks.custom(same_chunk, name=f"chunk_overlay({chunk})"))

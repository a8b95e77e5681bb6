"""The report's compact data: every array quantised to bytes, concatenated into one buffer, zlib-compressed and
base64-encoded into the page (the browser inflates it with its built-in ``DecompressionStream``).

- dense heads (L <= ``dense_max``): ``L * L`` uint8, probability ``p`` stored as ``round(255 p)``: the shown
  weight is within ``0.5 / 255`` of the computed one;
- sparse heads (longer sequences): per row the ``top_k`` largest probabilities (key index uint16, value uint8)
  and the remaining mass of the row (uint8, same step), so the page states what it leaves out;
- thumbnails: ``T x T`` (T <= 48) block maxima scaled to the head's largest, for the overview grid;
- a layer's heads are quantised / ranked in one call (:func:`encode_layer`), then laid out head by head;
- masks: one bit per (query, key), deduplicated across layers and heads.

:func:`decode_head` reads a dense or sparse head back (tests use it to check the page's numbers).
Shape legend: H heads, L tokens, k = top_k, T thumbnail side.
"""

from __future__ import annotations

import base64
import math
import zlib

import numpy as np
import torch

STEP = 1.0 / 255.0


class Buffer:
    """Append-only byte buffer; every array starts 4-byte aligned (for typed-array views in the page)."""

    def __init__(self):
        self.parts: list[bytes] = []
        self.size = 0

    def add(self, array: np.ndarray) -> list[int]:
        pad = -self.size % 4
        if pad:
            self.parts.append(b"\0" * pad)
            self.size += pad
        data = np.ascontiguousarray(array).tobytes()
        self.parts.append(data)
        offset, self.size = self.size, self.size + len(data)
        return [offset, len(data)]

    def encoded(self) -> str:
        return base64.b64encode(zlib.compress(b"".join(self.parts), 6)).decode("ascii")


def quantise(p: torch.Tensor) -> np.ndarray:
    """Probabilities -> ``round(255 p)`` as uint8 (computed in float64: the byte is the nearest step, exactly)."""
    return np.rint(p.clamp(0, 1).double().numpy() * 255).astype(np.uint8)


def thumbnails(w: torch.Tensor, side: int = 48) -> np.ndarray:
    """``(H, L, L) -> (H, T, T)`` uint8 block maxima, each head scaled so its largest pooled value is 255."""
    L = w.shape[-1]
    T = min(side, L)
    pooled = torch.nn.functional.adaptive_max_pool2d(w[:, None].float(), T)[:, 0]  # (H, T, T)
    top = pooled.amax(dim=(-2, -1), keepdim=True)  # (H, 1, 1)
    return quantise(torch.where(top > 0, pooled / torch.where(top > 0, top, 1), pooled))


def encode_layer(buf: Buffer, w: torch.Tensor, top_k: int | None) -> list[dict]:
    """One layer's heads ``(H, L, L)``: per head its dense bytes, or the top-k per row with the rest of each row's
    mass, then its thumbnail. The whole layer is quantised / ranked in one call, then laid out head by head."""
    H, L, _ = w.shape
    thumbs = thumbnails(w)  # (H, T, T)
    if top_k is None or top_k >= L:
        dense = quantise(w)  # (H, L, L)
        parts = [{"fmt": "dense", "w": dense[h]} for h in range(H)]
    else:
        values, index = w.topk(top_k, dim=-1)  # (H, L, k) each
        rest = quantise((1.0 - values.double().sum(-1)).clamp_min(0))  # (H, L): mass not shown
        index, values = index.numpy().astype("<u2"), quantise(values)
        parts = [{"fmt": "topk", "k": top_k, "idx": index[h], "val": values[h], "rest": rest[h]} for h in range(H)]
    heads = []
    for h, part in enumerate(parts):
        head = {k: buf.add(v) if isinstance(v, np.ndarray) else v for k, v in part.items()}  # arrays -> spans
        heads.append({**head, "thumb": buf.add(thumbs[h]), "T": thumbs.shape[-1]})
    return heads


def encode_mask(buf: Buffer, allowed: torch.Tensor) -> list[int]:
    """``(L, L)`` bool -> bits (big-endian bit order, row-major)."""
    return buf.add(np.packbits(allowed.numpy().astype(np.uint8).reshape(-1), bitorder="big"))


def decode_head(blob: bytes, head: dict, L: int) -> np.ndarray:
    """The ``(L, L)`` float probabilities a page shows for one head (sparse: zeros outside the top-k)."""
    def view(span, dtype):
        offset, n = span
        return np.frombuffer(blob[offset:offset + n], dtype=dtype)

    if head["fmt"] == "dense":
        return view(head["w"], np.uint8).reshape(L, L) * STEP
    k = head["k"]
    out = np.zeros((L, L))
    idx = view(head["idx"], "<u2").reshape(L, k).astype(np.int64)
    np.put_along_axis(out, idx, view(head["val"], np.uint8).reshape(L, k) * STEP, axis=-1)
    return out


def decode_blob(text: str) -> bytes:
    return zlib.decompress(base64.b64decode(text))


def human_bytes(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    exp = min(int(math.log(n, 1024)), 3)
    return f"{n / 1024 ** exp:.1f} {('B', 'KiB', 'MiB', 'GiB')[exp]}"

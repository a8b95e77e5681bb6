"""ASCII pictures of masks: rows are queries, columns are keys, ``#`` = may attend, ``.`` = masked."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from attnkit.errors import AttnkitValueError

if TYPE_CHECKING:
    from attnkit.masks.spec import MaskSpec

DEFAULT_SIZE = 8
MAX_SIZE = 32


def render(dense: torch.Tensor, max_size: int = MAX_SIZE) -> str:
    """Draw a 2-D boolean tensor ``(Lq, Lk)``, cropped to its top-left ``max_size`` square."""
    q_len, kv_len = dense.shape
    rows = [" ".join("#" if a else "." for a in row[:max_size]) for row in dense[:max_size].tolist()]
    if q_len > max_size or kv_len > max_size:
        rows.append(f"(top-left {min(q_len, max_size)}x{min(kv_len, max_size)} of {q_len}x{kv_len} shown)")
    return "\n".join(rows)


def draw(mask: MaskSpec, q_len: int | None = None, kv_len: int | None = None) -> str:
    for name, value in (("q_len", q_len), ("kv_len", kv_len)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise AttnkitValueError(f"picture: {name} must be an int >= 1 (the rows or columns to draw), got {value!r}; "
                                    f"omit it for {DEFAULT_SIZE} or the data's length.")
    kv_len = kv_len or mask.natural_length() or q_len or DEFAULT_SIZE
    q_len = q_len or kv_len
    return render(mask.to_dense(q_len, kv_len)[0, 0])  # (Lq, Lk) of batch row 0, head 0

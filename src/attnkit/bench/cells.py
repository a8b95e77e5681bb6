"""The attention calls users make, as benchmark cells: what ``attnkit tune`` calibrates on and ``attnkit bench
routing`` measures. A cell is a mask (or bias/softcap/sinks) kind, lengths, a head layout, a dtype and a
direction; :func:`make` builds its tensors and the mask prepared once, as a model does (``ak.masks.prepare``).

Shape legend: B batch, H query heads, Hkv key/value heads, Lq queries, L keys, D head dim.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

import attnkit as ak

M = ak.masks
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
HEADS = {"MHA": (8, 8), "GQA": (8, 2)}
D = 64


def _docs(L: int) -> torch.Tensor:
    """Four packed documents of uneven lengths: ``(1, L)`` ids."""
    cuts = [0, L * 3 // 16, L * 7 // 16, L * 12 // 16, L]
    ids = torch.zeros(L, dtype=torch.long)
    for i in range(4):
        ids[cuts[i]:cuts[i + 1]] = i
    return ids[None]


def _window(w: int) -> Callable[[int], object]:
    return lambda L: M.causal() & M.sliding_window(w)


#: kind -> (mask builder (L) -> mask, extra ak.attention kwargs builder (H) -> dict)
KINDS: dict[str, tuple[Callable[[int], object], Callable[[int], dict]]] = {
    "none": (lambda L: None, lambda H: {}),
    "causal": (lambda L: M.causal(), lambda H: {}),
    **{f"sliding{w}": (_window(w), lambda H: {}) for w in (64, 128, 256, 512, 1024)},
    "chunked256": (lambda L: M.chunked(256) & M.causal(), lambda H: {}),
    "documents": (lambda L: M.causal() & M.document(_docs(L)), lambda H: {}),
    "padding": (lambda L: M.padding([L * 3 // 4]), lambda H: {}),
    "causal_padding": (lambda L: M.causal() & M.padding([L * 3 // 4]), lambda H: {}),
    "strided64": (lambda L: M.causal() & M.strided(64), lambda H: {}),
    "global": (lambda L: (M.causal() & M.sliding_window(256)) | M.global_tokens([0, 1, 2, 3]), lambda H: {}),
    "alibi": (lambda L: M.causal(), lambda H: {"bias": ak.positions.ALiBi(H)}),
    "softcap": (lambda L: M.causal() & M.sliding_window(256), lambda H: {"softcap": 30.0}),
    "sinks": (lambda L: M.causal() & M.sliding_window(128), lambda H: {"sinks": torch.zeros(H)}),
}


@dataclass(frozen=True)
class Cell:
    kind: str
    L: int  # keys
    Lq: int  # queries (L for prefill, 1 for a decode step)
    heads: str  # "MHA" | "GQA"
    dtype: str  # "fp32" | "bf16"
    direction: str  # "forward" | "train" (forward + backward)

    @property
    def name(self) -> str:
        q = "" if self.Lq == self.L else f" Lq={self.Lq}"
        return f"{self.kind} L={self.L}{q} {self.heads} {self.dtype} {self.direction}"


def make(cell: Cell, seed: int = 0):
    """``(q, k, v, mask, kwargs)`` for ``cell``: q ``(1, H, Lq, D)``, k, v ``(1, Hkv, L, D)``, the mask prepared."""
    H, Hkv = HEADS[cell.heads]
    dtype = DTYPES[cell.dtype]
    g = torch.Generator().manual_seed(seed)
    grad = cell.direction == "train"
    q = torch.randn(1, H, cell.Lq, D, generator=g).to(dtype).requires_grad_(grad)
    k = torch.randn(1, Hkv, cell.L, D, generator=g).to(dtype).requires_grad_(grad)
    v = torch.randn(1, Hkv, cell.L, D, generator=g).to(dtype).requires_grad_(grad)
    build_mask, build_kwargs = KINDS[cell.kind]
    mask = build_mask(cell.L)
    if mask is not None:
        q_pos = torch.arange(cell.L - cell.Lq, cell.L)
        mask = M.prepare(mask, q_pos, torch.arange(cell.L))
    return q, k, v, mask, build_kwargs(H)


def runner(cell: Cell, backend: str, seed: int = 0) -> Callable[[], object]:
    """A function running ``cell`` once on ``backend`` (``"auto"`` too): forward, or forward + backward."""
    q, k, v, mask, kwargs = make(cell, seed)
    if cell.direction == "forward":
        def run():
            with torch.no_grad():
                return ak.attention(q, k, v, mask, backend=backend, **kwargs)
        return run
    grad_out = torch.randn(q.shape[:3] + (v.shape[-1],)).to(q.dtype)

    def run_train():
        out = ak.attention(q, k, v, mask, backend=backend, **kwargs)
        out.backward(grad_out)
        for t in (q, k, v):
            t.grad = None
    return run_train


def call_of(cell: Cell, seed: int = 0):
    """The validated :class:`AttentionCall` of ``cell`` (grad mode as its direction records it)."""
    from attnkit._validation import build_call

    q, k, v, mask, kwargs = make(cell, seed)
    with torch.set_grad_enabled(cell.direction == "train"):
        return build_call(q, k, v, mask, **kwargs)


def capable(cell: Cell) -> list[str]:
    """The registered backends that can serve ``cell`` (flex only where it runs without compiling on CPU)."""
    from attnkit.backends import registry

    call = call_of(cell)
    with torch.set_grad_enabled(cell.direction == "train"):
        return [name for name, rank in registry.ranking(call) if rank.score >= 0]

"""Attention weights from any backend: record what ``attnkit.attention`` computed, per layer, head and row.

>>> import torch, attnkit as ak
>>> from attnkit.diagnostics import capture
>>> mha = ak.nn.MultiHeadAttention(32, 4)
>>> with capture(mha, heads=[0, 1], rows=[-1]) as cap:
...     _ = mha(torch.randn(2, 8, 32), ak.masks.causal())
>>> cap.records[0].layer, tuple(cap.records[0].weights.shape)
('', (2, 2, 1, 8))

Fused backends (SDPA) never materialise the probabilities, so the observer recomputes them exactly with the
reference path (``functional.reference.scores_of`` + ``safe_softmax``) from the captured call: the same q, k,
scale, softcap, bias, positions and mask. When the call itself returned weights (``return_weights=True``)
those are recorded as they are. Nothing is registered outside the ``with`` block, so the cost is zero when
capture is off (``attnkit.attention`` checks one empty list).

Layer names come from forward pre-hooks on the attention modules of ``model`` (by default every
:class:`attnkit.nn.MultiHeadAttention`): a call made while such a module runs is named after it
(``"blocks.0.attn"``; ``""`` when the model *is* the module). Calls outside any named module are named
``"call<i>"`` in call order.

Shape legend: B batch, H query heads, Hkv key/value heads, Lq/Lk lengths, D head dim; h the selected heads,
r the selected query rows.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from attnkit import _hooks
from attnkit._validation import AttentionCall
from attnkit.diagnostics.layer_kinds import mask_kind
from attnkit.errors import AttnkitTypeError, AttnkitValueError, describe
from attnkit.functional.reference import safe_softmax, scores_of
from attnkit.masks import materialize


@dataclass
class Record:
    """One captured attention call (tensors detached, on the call's device).

    ``weights``: probabilities ``(B, h, r, Lk)`` (float32, or float64 for float64 inputs; what the backend
    returned when the call asked for weights); with attention sinks (gpt-oss) a row sums to less than 1, the rest
    being the sink's (``sinks`` True). ``allowed``: the boolean mask ``(B|1, 1|h, r, Lk)`` or None.
    ``q_positions``/``kv_positions``: ``(B|1, r)`` and ``(B|1, Lk)``. ``scores`` (pre-softmax, masked
    entries -inf) ``(B, h, r, Lk)``, ``q`` ``(B, h, r, D)`` and ``k`` ``(B, h, Lk, D)`` (KV heads expanded for
    GQA) only when asked for. ``kind``: the layer kind the call's mask says (``"sliding 4"``, ``"full (causal)"``:
    :func:`attnkit.diagnostics.layer_kinds.mask_kind`); ``kv_heads`` Hkv and ``v_head_dim`` Dv of the call (MLA:
    ``head_dim`` of q and k differs from Dv).
    """

    layer: str
    index: int
    heads: list[int]
    rows: list[int]
    weights: torch.Tensor
    allowed: torch.Tensor | None
    q_positions: torch.Tensor
    kv_positions: torch.Tensor
    scale: float
    head_dim: int
    scores: torch.Tensor | None = None
    kind: str = ""
    kv_heads: int = 0
    v_head_dim: int = 0
    sinks: bool = False
    q: torch.Tensor | None = None
    k: torch.Tensor | None = None


def _indices(selection: Sequence[int] | None, size: int, name: str) -> list[int]:
    if selection is None:
        return list(range(size))
    out = []
    for i in selection:
        if isinstance(i, bool) or not isinstance(i, int) or not -size <= i < size:
            raise AttnkitValueError(f"{name} selects index {describe(i)} but the call has {size}; pick indices in "
                                    f"[{-size}, {size}) (negative counts from the end), or None for all.")
        out.append(i % size)
    return out


def _probabilities(scores: torch.Tensor, sinks: torch.Tensor | None) -> torch.Tensor:
    """``(B, H, Lq, Lk)`` probabilities as the reference computes them: with ``sinks`` ``(H,)`` one extra logit
    per head joins each row's softmax and its mass is dropped (``functional.reference.reference_from_call``)."""
    if sinks is None:
        return safe_softmax(scores)
    B, H, Lq, _ = scores.shape
    sink = sinks.detach().to(scores.dtype).view(1, H, 1, 1).expand(B, H, Lq, 1)  # (B, H, Lq, 1)
    return safe_softmax(torch.cat([scores, sink], dim=-1))[..., :-1]  # (B, H, Lq, Lk)


class capture:  # noqa: N801 - used as a context manager, like torch.no_grad
    """Record attention probabilities (and optionally q, k, pre-softmax scores) of every attention call.

    Args:
        model: a module whose attention submodules name the calls (optional).
        layers: layer names or fnmatch patterns to keep (``["blocks.0.*"]``); None keeps all.
        heads: query-head indices to keep; None keeps all.
        rows: query-row indices to keep (negative from the end: ``[-1]`` = the newest token); None keeps all.
        scores: also record the pre-softmax scores (after scale, softcap, bias and mask).
        qk: also record q and k (KV heads expanded to the query heads).
        module_types: which modules name the calls (default ``(attnkit.nn.MultiHeadAttention,)``).

    ``records`` holds one :class:`Record` per kept call, in call order; :meth:`by_layer` groups them.
    """

    def __init__(self, model: nn.Module | None = None, *, layers: Sequence[str] | None = None,
                 heads: Sequence[int] | None = None, rows: Sequence[int] | None = None, scores: bool = False,
                 qk: bool = False, module_types: tuple[type, ...] | None = None):
        if model is not None and not isinstance(model, nn.Module):
            raise AttnkitTypeError(f"capture(model=...) must be a torch.nn.Module or None, got {describe(model)}; "
                                   "pass the model whose attention layers should name the records.")
        if isinstance(layers, str):
            layers = [layers]
        self.model, self.layers, self.heads, self.rows = model, layers, heads, rows
        self.want_scores, self.want_qk = scores, qk
        if module_types is None:
            from attnkit.nn import MultiHeadAttention

            module_types = (MultiHeadAttention,)
        self.module_types = module_types
        self.records: list[Record] = []
        self._stack: list[str] = []
        self._handles: list = []
        self._calls = 0

    # ----- context manager
    def __enter__(self) -> capture:
        if self.model is not None:
            for name, module in self.model.named_modules():
                if isinstance(module, self.module_types):
                    self._handles.append(module.register_forward_pre_hook(self._enter_layer(name)))
                    self._handles.append(module.register_forward_hook(self._leave_layer, always_call=True))
        _hooks.add_observer(self._observe)
        return self

    def __exit__(self, *exc) -> None:
        _hooks.remove_observer(self._observe)
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._stack.clear()

    def _enter_layer(self, name: str):
        def hook(module, args):
            self._stack.append(name)

        return hook

    def _leave_layer(self, module, args, output) -> None:
        if self._stack:
            self._stack.pop()

    # ----- the observer
    def _observe(self, call: AttentionCall, result) -> None:
        index, self._calls = self._calls, self._calls + 1
        layer = self._stack[-1] if self._stack else f"call{index}"
        if self.layers is not None and not any(fnmatch.fnmatchcase(layer, pat) for pat in self.layers):
            return
        heads = _indices(self.heads, call.num_heads, "heads")
        rows = _indices(self.rows, call.q_len, "rows")
        h_idx = torch.tensor(heads, device=call.q.device)
        r_idx = torch.tensor(rows, device=call.q.device)
        with torch.no_grad():
            q_pos, kv_pos = call.positions()  # (B|1, Lq), (B|1, Lk)
            every_head, every_row = self.heads is None, self.rows is None  # nothing to select: no copy
            scores = None
            if isinstance(result, tuple):  # the backend returned the probabilities itself
                weights = result[1].detach()
                if weights.dtype in (torch.float16, torch.bfloat16):
                    weights = weights.float()
                elif every_head and every_row:
                    weights = weights.clone()  # the caller's tensor: the record must not alias it
            if not isinstance(result, tuple) or self.want_scores:
                scores = scores_of(call)  # (B, H, Lq, Lk), masked entries -inf
            if not isinstance(result, tuple):
                weights = _probabilities(scores, call.sinks)  # exactly the reference path
            allowed = materialize(call.mask, q_pos, kv_pos)  # (B|1, 1|H, Lq, Lk) or None

            def pick(t: torch.Tensor | None) -> torch.Tensor | None:
                """(B, H, Lq, *) -> (B, h, r, *)"""
                if t is None:
                    return None
                t = t if every_head else t.index_select(1, h_idx)
                return t if every_row else t.index_select(2, r_idx)

            if allowed is not None:
                allowed = allowed.reshape((1,) * (4 - allowed.dim()) + tuple(allowed.shape))  # (B|1, 1|H, Lq|1, Lk)
                allowed = allowed if allowed.shape[1] == 1 or every_head else allowed.index_select(1, h_idx)
                allowed = allowed if allowed.shape[2] == 1 or every_row else allowed.index_select(2, r_idx)
            record = Record(
                layer=layer, index=index, heads=heads, rows=rows, weights=pick(weights), allowed=allowed,
                q_positions=q_pos if every_row else q_pos.index_select(1, r_idx), kv_positions=kv_pos, scale=call.scale,
                head_dim=call.q.shape[-1],
                scores=pick(scores) if self.want_scores else None, kind=mask_kind(call.mask),
                kv_heads=call.k.shape[1], v_head_dim=call.v.shape[-1], sinks=call.sinks is not None,
            )
            if self.want_qk:
                from attnkit.functional.reference import expand_kv

                record.q = pick(call.q.detach())  # (B, h, r, D)
                record.k = expand_kv(call.k.detach(), call.num_heads).index_select(1, h_idx)  # (B, h, Lk, D)
        self.records.append(record)

    # ----- results
    def by_layer(self) -> dict[str, list[Record]]:
        """Records grouped by layer name, in call order."""
        out: dict[str, list[Record]] = {}
        for r in self.records:
            out.setdefault(r.layer, []).append(r)
        return out

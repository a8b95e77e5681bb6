"""The ``sdpa`` backend: ``torch.nn.functional.scaled_dot_product_attention``.

It passes ``is_causal=True`` only when that is exactly right (pure causal mask, Lq == Lk, default
positions): SDPA's flag is top-left aligned and skips masked blocks. Otherwise the mask is materialised as a
dense boolean (or, with a bias, float) tensor, which SDPA can't use to skip work. GQA uses ``enable_gqa``.

Shape legend: B batch, H query heads, Hkv key/value heads, Lq/Lk lengths, D head dim.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnkit._bias import StructuredBias
from attnkit._validation import AttentionCall
from attnkit.masks import And, Causal, Combination, Custom, GlobalTokens, MaskSpec, Not, Or, SlidingWindow, Strided, materialize


class LastDenseMask:
    """The dense mask (and its empty rows) of the last call, reused while the same mask object meets the
    same positions: the layers of one model forward share both, so the mask is built once per forward
    instead of once per layer.

    A hit needs the same lengths, device and positions tensors (or both default), and either the identical
    mask object with unchanged versions of every tensor inside it (an in-place edit of mask data is never
    missed), or, for masks built only from position rules (causal, window, strided, global tokens and their
    ``& | ~``), an equal one: ``ak.attention(q, k, v, ak.masks.sliding_window(256))`` written inline in every
    layer builds its dense mask once, not once per call.
    Custom masks (arbitrary closures), masks over more than ``MAX_ENTRIES`` (Lq x Lk), inference tensors
    and calls under ``torch.compile`` are never memoised, so at most a 16 MiB mask stays alive between calls.
    """

    MAX_ENTRIES = 1 << 24

    def __init__(self):
        self.entry: tuple | None = None  # (key, tensors kept alive, versions, attn_mask, empty_rows)

    def get(self, call: AttentionCall) -> tuple[torch.Tensor, torch.Tensor | None]:
        tensors = _mask_tensors(call.mask)
        if tensors is None or call.q_len * call.kv_len > self.MAX_ENTRIES or torch.compiler.is_compiling() or any(
                t is not None and t.is_inference() for t in (*tensors, call.q_positions, call.kv_positions)):
            return _dense(call)  # inference tensors have no version counter to detect in-place edits
        rules = _rules_key(call.mask)  # equal position-rule masks share an entry, whatever the object
        held = (call.mask if rules is None else None, *tensors, call.q_positions, call.kv_positions)  # kept alive
        # positions are fresh views each call (validation reshapes them): compare their storage, not the object
        # inference-mode results can't enter autograd later: a mask built under inference_mode serves only there
        key = (rules, call.q_len, call.kv_len, call.q.device, torch.is_inference_mode_enabled(),
               _storage(call.q_positions), _storage(call.kv_positions))
        versions = tuple(t._version for t in tensors)
        entry = self.entry
        if entry is not None and entry[0] == key and entry[2] == versions and len(entry[1]) == len(held) \
                and all(a is b for a, b in zip(entry[1][:-2], held[:-2])):
            return entry[3], entry[4]
        attn_mask, empty_rows = _dense(call)
        self.entry = (key, held, versions, attn_mask, empty_rows)
        return attn_mask, empty_rows


_RULES = (Causal, SlidingWindow, Strided, GlobalTokens, And, Or, Not)


def _rules_key(mask: MaskSpec) -> str | None:
    """``repr(mask)`` when the mask is built only from built-in position rules (its repr then says all of
    it), else None."""
    stack = [mask]
    while stack:
        node = stack.pop()
        if type(node) not in _RULES:
            return None
        stack.extend(node.parts if isinstance(node, Combination) else [node.inner] if isinstance(node, Not) else [])
    return repr(mask)


def _storage(t: torch.Tensor | None) -> tuple | None:
    """What identifies a positions tensor's contents while a reference keeps its storage alive."""
    return None if t is None else (t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, t._version)


def _mask_tensors(mask) -> list[torch.Tensor] | None:
    """Every tensor held inside a mask tree; None when the mask can't be memoised (custom or a raw tensor)."""
    if not isinstance(mask, MaskSpec):
        return None
    found, stack = [], [mask]
    while stack:
        node = stack.pop()
        if isinstance(node, Custom):
            return None
        for value in vars(node).values():
            if isinstance(value, torch.Tensor):
                found.append(value)
            elif isinstance(value, MaskSpec):
                stack.append(value)
            elif isinstance(value, tuple):
                stack.extend(part for part in value if isinstance(part, MaskSpec))
    return found


def _dense(call: AttentionCall) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The call's dense bool mask with empty rows opened, and the empty-row mask ``(B|1, H|1, Lq, 1)`` (None
    when every row sees a key: no zeroing pass on the output).

    Rows with no visible key see every key and get their output zeroed afterwards: finite gradients on
    every kernel, whatever it does with an all-masked row."""
    attn_mask = materialize(call.mask, *call.positions())  # bool, broadcastable to (B, H, Lq, Lk)
    empty_rows = ~attn_mask.any(dim=-1, keepdim=True)  # (B|1, H|1, Lq, 1)
    if not torch.compiler.is_compiling() and not bool(empty_rows.any()):  # (a data-dependent branch breaks graphs)
        return attn_mask, None
    return attn_mask | empty_rows, empty_rows


class SDPABackend:
    name = "sdpa"

    def __init__(self):
        self.last_mask = LastDenseMask()

    def available(self) -> list[str]:
        return [] if hasattr(F, "scaled_dot_product_attention") else ["torch lacks scaled_dot_product_attention"]

    def supports(self, call: AttentionCall) -> list[str]:
        reasons = []
        if call.return_weights:
            reasons.append("SDPA does not return attention weights (use return_weights=False, or backend='math')")
        if call.softcap is not None:
            reasons.append("SDPA has no logit softcap")
        return reasons

    def _mode(self, call: AttentionCall) -> str:
        """'none', 'causal' (is_causal flag), or 'dense' (materialised mask)."""
        if call.mask is None:
            return "none"
        if isinstance(call.mask, Causal) and call.default_positions:
            if call.q_len == 1:
                return "none"  # the last position sees every key
            if call.q_len == call.kv_len and call.bias is None:
                return "causal"  # (with a bias the mask joins it: SDPA refuses is_causal plus a mask needing grad)
        return "dense"

    def plan(self, call: AttentionCall) -> str:
        mode = self._mode(call)
        parts = {
            "none": "no mask: fused kernel over all keys",
            "causal": "is_causal=True: fused kernel skips blocks above the diagonal",
            "dense": "dense mask tensor (Lq x Lk): fused kernel, but no block is skipped",
        }[mode]
        if mode == "dense" and isinstance(call.mask, Causal):
            parts += " (causal with explicit positions or Lq != Lk can't use SDPA's top-left is_causal)"
        if call.bias is not None:
            parts += "; bias materialised as a (B, H, Lq, Lk) float tensor"
        if call.dropout_p > 0 and call.q.device.type == "cpu":
            parts += "; dropout_p > 0 makes SDPA fall back to its math path on CPU"
        return parts

    def __call__(self, call: AttentionCall) -> torch.Tensor:
        mode = self._mode(call)
        attn_mask, is_causal, empty_rows = None, mode == "causal", None
        if mode == "dense":
            attn_mask, empty_rows = self.last_mask.get(call)
        if call.bias is not None:
            bias = call.bias.materialize(*call.positions()) if isinstance(call.bias, StructuredBias) else call.bias
            bias = bias.to(call.q.dtype)
            attn_mask = bias if attn_mask is None else bias.masked_fill(~attn_mask, float("-inf"))
        out = F.scaled_dot_product_attention(
            call.q, call.k, call.v, attn_mask=attn_mask, dropout_p=call.dropout_p, is_causal=is_causal,
            scale=call.scale, enable_gqa=call.num_kv_heads != call.num_heads,
        )  # (B, H, Lq, Dv)
        if empty_rows is not None:
            out = out.masked_fill(empty_rows, 0.0)
        return out

"""The ``flex`` backend: ``torch.nn.attention.flex_attention`` built from attnkit's own mask and bias functions.

The bound mask ``fn(b, h, q_idx, kv_idx)`` (:meth:`MaskSpec.bind`) is flex's ``mask_mod``; softcap and a
structured bias (ALiBi's ``score(h, q_pos, kv_pos)``) form the ``score_mod``. flex is imported lazily and
compiled on first use (never at import); the compiled function is shared and torch.compile caches one
kernel per shape. The block mask is built once per prepared mask (kept in its memo): a model that prepares
its mask once per forward builds it once; nothing is cached across calls.

On CPU flex has no backward, no float16/float64 kernel and compiling costs seconds, so it ranks itself first
for CPU calls only for inference when compiling is allowed (:func:`allow_cpu_compile` or
``ATTNKIT_FLEX_CPU=1``), and below math otherwise (``backend="flex"`` still runs it). It never runs a CPU call
that needs gradients: one failed call with ``requires_grad=True`` slows the compiled function for the rest
of the process (docs/backends.md).

Shape legend: B batch, H query heads, Hkv key/value heads, Lq/Lk lengths, D head dim.
"""

from __future__ import annotations

import os

import torch

from attnkit._bias import StructuredBias
from attnkit._validation import AttentionCall
from attnkit.backends.base import Rank, is_long, skippable_structure
from attnkit.functional.reference import propagate_nan_queries

_STATE: dict = {"compiled": None, "cpu_compile": None}
#: from this many keys (and ``MIN_QUERIES`` queries) skipping blocks of a structured mask or bias pays off
MIN_KEYS = 4096
MIN_QUERIES = 128


def allow_cpu_compile(enabled: bool = True) -> None:
    """Let ``backend='auto'`` use flex (compiled) for CPU inference. Default: ``ATTNKIT_FLEX_CPU=1`` or off."""
    _STATE["cpu_compile"] = bool(enabled)


def cpu_compile_allowed() -> bool:
    """:func:`allow_cpu_compile`'s setting, else ``ATTNKIT_FLEX_CPU=1`` (the environment is read once per process:
    ``auto`` asks on every call)."""
    if _STATE["cpu_compile"] is not None:
        return _STATE["cpu_compile"]
    if "env" not in _STATE:
        _STATE["env"] = os.environ.get("ATTNKIT_FLEX_CPU", "") == "1"
    return _STATE["env"]


def _flex_module():
    try:
        from torch.nn.attention import flex_attention as module
    except ImportError:
        return None
    return module


def _compiled():
    if _STATE["compiled"] is None:
        _STATE["compiled"] = torch.compile(_flex_module().flex_attention, dynamic=False)
    return _STATE["compiled"]


class FlexBackend:
    name = "flex"
    ranks_by_signature = True  # supports/rank read the call's signature, prepared mask and state()
    traceable = True

    #: what rank reads besides the call: whether compiling on CPU is allowed (asked on every routed call)
    state = staticmethod(cpu_compile_allowed)

    def available(self) -> list[str]:
        return [] if _flex_module() is not None else ["this torch has no torch.nn.attention.flex_attention"]

    def supports(self, call: AttentionCall) -> list[str]:
        reasons = []
        if call.return_weights:
            reasons.append("flex does not return attention weights (use backend='math')")
        if call.dropout_p > 0:
            reasons.append("flex has no attention dropout")
        if isinstance(call.bias, torch.Tensor):
            reasons.append("flex serves structured biases (ALiBi), not dense float bias tensors (use sdpa)")
        device = call.q.device.type
        if device == "cpu" and call.needs_grad:
            reasons.append("flex has no backward pass on CPU (run under torch.no_grad(), or use blocksparse)")
        if device == "cpu" and call.q.dtype in (torch.float16, torch.float64):
            reasons.append(f"flex on CPU has no {str(call.q.dtype).removeprefix('torch.')} kernel (use float32 or "
                           "bfloat16, or another backend)")
        if device not in ("cpu", "cuda"):
            reasons.append(f"flex runs on cpu and cuda, not {device}")
        return reasons

    def rank(self, call: AttentionCall) -> Rank:
        structure = skippable_structure(call)
        if call.q.device.type == "cpu" and not cpu_compile_allowed():
            return Rank(-10, "flex on CPU compiles for seconds per shape and compiling on CPU was not allowed "
                             "(ak.backends.flex.allow_cpu_compile())")
        where = " (CPU inference, compiling allowed)" if call.q.device.type == "cpu" else ""
        if structure is not None and is_long(call, MIN_KEYS, MIN_QUERIES):
            return Rank(40, f"{structure} on {call.kv_len} keys: flex skips empty blocks{where}")
        if call.softcap is not None:
            return Rank(25, f"softcap: flex applies it inside one fused kernel{where}")
        return Rank(1, "compiled flex kernel; nothing here for it to skip, or too short to pay off" + where)

    def plan(self, call: AttentionCall) -> str:
        how = "compiled flex_attention: mask_mod from the mask, skips empty blocks"
        if call.bias is not None or call.softcap is not None:
            how += "; score_mod applies " + " and ".join(
                n for n, on in (("softcap", call.softcap is not None), ("the bias", call.bias is not None)) if on)
        if call.q.device.type == "cpu":
            how += " (CPU: compiles on first call per shape, seconds)"
        return how

    def __call__(self, call: AttentionCall) -> torch.Tensor:
        out = _compiled()(call.q, call.k, call.v, score_mod=score_mod_for(call), block_mask=block_mask_for(call),
                          scale=call.scale, enable_gqa=call.num_kv_heads != call.num_heads)  # (B, H, Lq, Dv)
        return propagate_nan_queries(out, call.q)  # flex's online softmax gives 0 for a NaN query


def block_mask_for(call: AttentionCall):
    """The flex BlockMask of the call, built once per prepared mask (and per batch/head broadcast)."""
    prepared = call.prepared
    if prepared is None:
        return None
    batch = call.batch if (prepared.spec.batch > 1 or not prepared.default_positions) else None
    heads = call.num_heads if prepared.heads > 1 else None
    return prepared.memo(("flex", batch, heads), lambda: _flex_module().create_block_mask(
        prepared.fn, batch, heads, call.q_len, call.kv_len, device=call.q.device))


def score_mod_for(call: AttentionCall):
    """flex ``score_mod``: softcap, then the bias (the score order of docs/conventions.md), or None."""
    cap, bias = call.softcap, call.bias
    if cap is None and bias is None:
        return None
    q_pos, kv_pos = call.positions()

    def score_mod(score, b, h, q_idx, kv_idx):
        if cap is not None:
            score = cap * torch.tanh(score / cap)
        if isinstance(bias, StructuredBias):
            qb = b if q_pos.shape[0] > 1 else torch.zeros_like(b)
            kb = b if kv_pos.shape[0] > 1 else torch.zeros_like(b)
            score = score + bias.score(h, q_pos[qb, q_idx], kv_pos[kb, kv_idx], b=b).to(score.dtype)
        return score

    return score_mod

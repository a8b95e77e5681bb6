"""The plain lane: a call like an earlier one, but for its tensors' values, skips validation and routing.

Most calls in a model are *plain*: q, k, v plain tensors; no bias, softcap, dropout, positions, sinks or weights;
``backend="auto"``; a mask that is None, a ``causal()`` written in the call, or a prepared mask (every layer after
the first of a forward); and nothing compiling. For such a call, what :func:`~attnkit._validation.build_call`
checks and :func:`~attnkit.backends.registry.select` ranks is a function of exactly its **lane key**: q, k and v's
shapes, dtypes and devices, whether autograd records (grad mode, each ``requires_grad``), the mask's kind (none,
``causal()``, or this prepared mask: then the entry lives in the prepared mask's own memo, whose data is fixed),
and the registry's version, the calibration's (``backends.cost``) and the backend states. A registered backend that
does not rank by signature is asked on every lane call and takes it when it ranks higher
(:func:`~attnkit.backends.registry.overrule`). The first call of a key takes the full path and stores a
:class:`Lane`: the fields the full path derived (the prepared mask the call uses, its positions) and the chosen
backend's runner (``Backend.runner(call)``, optional: a callable that serves every call of the key exactly as
``backend(call)`` would; the backend itself when it has none). The next calls of the key build the
:class:`AttentionCall` from those fields and run it: only the scale is checked per call (its value is not in the
key). A memo serves only what it proves equal: anything outside the key makes the call take the full path.

Shape legend: B batch, H query heads, Hkv key/value heads, Lq/Lk lengths, D head dim.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnkit._memo import Memo
from attnkit._validation import AttentionCall, build_call
from attnkit.backends import registry
from attnkit.functional.reference import empty_result
from attnkit.masks import PreparedMask, is_plain_causal
from attnkit.masks.prepared import SHARED_MAX_ENTRIES

#: lanes of calls without a mask or with a ``causal()`` written in the call: ``{key: Lane}``
_LANES = Memo("plain lanes", 1024)


@dataclass(frozen=True, slots=True)
class Lane:
    """What the full path derived for one lane key, and the runner that serves its calls."""

    run: Callable[[AttentionCall], torch.Tensor]
    backend: object  # the backend auto chose among those that rank by signature
    score: float  # its rank score (a backend asked on every call takes the call only with a higher one)
    mask: object  # the call's ``mask`` (a prepared mask's source)
    prepared: PreparedMask | None  # None with a causal() too large to keep: prepared per call
    q_positions: torch.Tensor | None
    kv_positions: torch.Tensor | None
    default_scale: float  # 1 / sqrt(D)


def plain_call(q, k, v, mask, scale) -> tuple[AttentionCall, Callable[[AttentionCall], torch.Tensor]] | None:
    """``(call, run)`` for a plain call (see the module docstring), or None: take the full path.

    The caller has checked the options that make a call plain (no bias, softcap, dropout, positions, sinks or
    weights; backend "auto"); this checks the tensors, the mask and the scale, and keys the lane."""
    if type(q) is not torch.Tensor or type(k) is not torch.Tensor or type(v) is not torch.Tensor or \
            torch.compiler.is_compiling():
        return None
    if scale is not None and not (type(scale) is float and 0.0 < scale < math.inf):
        return None  # the full path checks it (and names it in the error)
    state = registry.routing_state()
    tensors_key = (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.device, k.device, v.device)
    grad = torch.is_grad_enabled() and (q.requires_grad, k.requires_grad, v.requires_grad)
    if mask is None or is_plain_causal(mask):  # the global table (no data: the kind is the whole mask)
        key = (mask is None, tensors_key, grad, state)
        lane = _LANES.get(key)
        if lane is None:
            lane = _LANES[key] = _lane(q, k, v, mask)
    elif type(mask) is PreparedMask:  # its own table (its data and positions are fixed)
        key = (tensors_key, grad, state)
        lane = mask.lanes.get(key)
        if lane is None:
            lane = mask.lanes[key] = _lane(q, k, v, mask)
    else:
        return None
    prepared = lane.prepared
    if prepared is None and mask is not None:  # a large causal(): prepared for this call (nothing built until asked)
        B, _, Lq, _ = q.shape
        prepared = PreparedMask.for_call(mask, None, None, B, Lq, k.shape[2], q.device)
    call = AttentionCall(q=q, k=k, v=v, mask=lane.mask, bias=None,
                         scale=lane.default_scale if scale is None else scale, softcap=None, dropout_p=0.0,
                         q_positions=lane.q_positions, kv_positions=lane.kv_positions, return_weights=False,
                         prepared=prepared, tensors_key=tensors_key)
    if registry.asked_per_call():  # a backend without ranks_by_signature: asked now (it may take the call)
        chosen = registry.overrule(call, lane.backend, lane.score)
        if chosen is not lane.backend:
            return call, empty_result if call.is_empty else chosen
    return call, lane.run


def _lane(q, k, v, mask) -> Lane:
    """The full path for the first call of a key (every check runs, and raises as usual), kept as a :class:`Lane`."""
    call = build_call(q, k, v, mask)
    chosen, score = registry.select_by_signature(call)
    runner = getattr(chosen, "runner", None)
    run = empty_result if call.is_empty else runner(call) if runner is not None else chosen
    small = call.prepared is None or call.q_len * call.kv_len <= SHARED_MAX_ENTRIES
    keep = call.prepared if (small or not is_plain_causal(mask)) else None  # a big causal()'s forms are not kept
    return Lane(run, chosen, score, call.mask, keep, call.q_positions, call.kv_positions, 1.0 / math.sqrt(q.shape[3]))

"""The backend protocol: one signature; every backend says whether it can serve a call (reasons when not),
how well (a :class:`Rank`) and, optionally, what it will compute (``work``, priced into a predicted time);
``backend="auto"`` takes the cheapest predicted capable backend (``backends.registry``).

Adding a backend is one file and one ``ak.backends.register(MyBackend())``: nothing else lists backends.

Shape legend: B batch, H query heads, Hkv key/value heads, Lq/Lk lengths, D head dim.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from attnkit._bias import StructuredBias
from attnkit._validation import AttentionCall


@dataclass(frozen=True)
class Rank:
    """How well a backend serves a call. ``auto`` takes the cheapest *predicted* backend
    (:mod:`attnkit.backends.cost`); the score decides for backends without a prediction (the highest wins, ties:
    registration order) and a score below 0 keeps a backend out of ``auto`` altogether.

    The built-in scale: 40 flex (compiled, skips blocks), 30 one fused SDPA kernel is best, 20 a
    block-skipping path pays off, 10 SDPA with a dense mask on a long call, 5 blocksparse where SDPA is as good,
    0 math (the fallback, serves everything), below 0 "can serve but should not unless asked" (flex compiling
    on CPU without permission). ``reason`` is one line: ``ak.explain`` prints it as the choice's why.
    """

    score: float
    reason: str


class Backend(Protocol):
    """An attention implementation. ``supports`` returns ``[]`` when it can serve the call.

    Optional declarations (read with ``getattr``; a backend without them still works, and
    :func:`~attnkit.backends.registry.register` says what each missing one costs):

    - ``ranks_by_signature = True``: ``available``, ``supports`` and ``rank`` read nothing but
      :meth:`AttentionCall.signature`, the call's prepared mask and ``state()``; ``auto`` memoises its choice among
      such backends on exactly those (``backends.registry``). A backend without it is asked on every call and
      takes the call when it ranks higher than the memoised choice (the memo and the plain lane stay on).
    - ``state() -> Hashable``: the environment settings ``rank`` reads (flex: whether CPU compiling is allowed).
    - ``runner(call) -> fn(call)``: a function that serves every plain call of ``call``'s lane key exactly as
      ``backend(call)`` would (``backends.lane``), with what can be decided once hoisted out (sdpa: the mask form
      and the GQA fold). Without it the lane runs ``backend(call)``.
    - ``traceable = False``: the backend can't run inside ``torch.compile``; ``auto`` skips it while compiling
      (a forced ``backend=`` name says why). Default: traceable.
    - ``serves_sinks = True``: it adds attention sinks to its softmax (others are refused calls with ``sinks=``).
    - ``work(call) -> dict[str, float]``: what it will compute for ``call`` as named amounts
      (:data:`attnkit.backends.cost.FEATURES`); ``auto`` prices them with the calibration in force and takes the
      cheapest predicted backend. Without it (or without coefficients for it) the backend competes by rank: it
      takes a call when its score is higher than the cheapest priced backend's.
    """

    name: str

    def available(self) -> list[str]:
        """Why the backend is unusable in this environment at all (empty when usable)."""
        ...

    def supports(self, call: AttentionCall) -> list[str]:
        """Why this backend can't serve ``call`` (empty when it can)."""
        ...

    def rank(self, call: AttentionCall) -> Rank:
        """How well it serves ``call`` (asked only when :meth:`supports` is empty)."""
        ...

    def plan(self, call: AttentionCall) -> str:
        """One line on how the call would run (kernel, mask form), for ``ak.explain``."""
        ...

    def __call__(self, call: AttentionCall) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``out (B, H, Lq, Dv)``, or ``(out, weights (B, H, Lq, Lk))`` when ``call.return_weights``."""
        ...


def skippable_structure(call: AttentionCall) -> str | None:
    """What in the call a block-skipping backend can exploit, in words (None when SDPA's own form is
    already best: no mask, a causal mask SDPA can flag or a one-row decode step, a dense tensor)."""
    if isinstance(call.bias, StructuredBias):
        return f"structured bias {type(call.bias).__name__}"
    if isinstance(call.bias, torch.Tensor):
        return None  # a dense bias is already Lq x Lk
    prepared = call.prepared
    if prepared is None or prepared.is_tensor or prepared.sdpa_flag(call.q_len, call.kv_len) is not None:
        return None
    return f"mask {prepared.spec!r}"


def is_long(call: AttentionCall, min_keys: int, min_queries: int) -> bool:
    """At least ``min_keys`` keys and ``min_queries`` queries (where skipping blocks starts to pay)."""
    return call.kv_len >= min_keys and call.q_len >= min_queries

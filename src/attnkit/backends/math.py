"""The ``math`` backend: the reference path in the inputs' dtype. Serves every request; returns weights."""

from __future__ import annotations

from attnkit._validation import AttentionCall
from attnkit.backends.base import Rank
from attnkit.functional.reference import reference_from_call


class MathBackend:
    name = "math"
    ranks_by_signature = True  # supports/rank read the call's signature only
    traceable = True
    serves_sinks = True  # the reference adds the sink column to the softmax
    # no ``work``: the fallback is never priced, so auto takes it only where no priced backend can serve (its
    # rank, 0, never beats a priced backend's); in ``attnkit bench routing`` it was the fastest in no cell but
    # the ones only it serves, and priced it was picked for short softcap calls at 1.7-2.3x the fastest's time

    def available(self) -> list[str]:
        return []

    def supports(self, call: AttentionCall) -> list[str]:
        return []

    def rank(self, call: AttentionCall) -> Rank:
        if call.return_weights:
            return Rank(0, "return_weights=True: only math returns the probabilities")
        return Rank(0, "the reference path, which serves every request (no faster backend can serve this call)")

    def plan(self, call: AttentionCall) -> str:
        return "materialises the (B, H, Lq, Lk) scores; O(Lq x Lk) memory"

    def __call__(self, call: AttentionCall):
        return reference_from_call(call)

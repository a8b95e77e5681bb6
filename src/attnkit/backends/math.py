"""The ``math`` backend: the reference path in the inputs' dtype. Serves every request; returns weights."""

from __future__ import annotations

from attnkit._validation import AttentionCall
from attnkit.backends.base import Rank
from attnkit.backends.cost import dense_work
from attnkit.functional.reference import reference_from_call


class MathBackend:
    name = "math"
    ranks_by_signature = True  # supports/rank read the call's signature only
    traceable = True
    serves_sinks = True  # the reference adds the sink column to the softmax

    def available(self) -> list[str]:
        return []

    def supports(self, call: AttentionCall) -> list[str]:
        return []

    def rank(self, call: AttentionCall) -> Rank:
        if call.return_weights:
            return Rank(0, "return_weights=True: only math returns the probabilities")
        return Rank(0, "the reference path, which serves every request (no faster backend can serve this call)")

    def work(self, call: AttentionCall) -> dict[str, float] | None:
        """What it computes (``backends.cost``): the (B, H, Lq, Lk) scores, materialised, and a bias."""
        return dense_work(call, scores=True, bias=call.bias is not None)

    def plan(self, call: AttentionCall) -> str:
        return "materialises the (B, H, Lq, Lk) scores; O(Lq x Lk) memory"

    def __call__(self, call: AttentionCall):
        return reference_from_call(call)

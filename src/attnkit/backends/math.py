"""The ``math`` backend: the reference path in the inputs' dtype. Serves every request; returns weights."""

from __future__ import annotations

from attnkit._validation import AttentionCall
from attnkit.functional.reference import reference_from_call


class MathBackend:
    name = "math"

    def available(self) -> list[str]:
        return []

    def supports(self, call: AttentionCall) -> list[str]:
        return []

    def plan(self, call: AttentionCall) -> str:
        return "materialises the (B, H, Lq, Lk) scores; O(Lq x Lk) memory"

    def __call__(self, call: AttentionCall):
        return reference_from_call(call)

"""The backend protocol: one signature, and a list of reasons for every request a backend can't serve.

Shape legend: B batch, H query heads, Hkv key/value heads, Lq/Lk lengths, D head dim.
"""

from __future__ import annotations

from typing import Protocol

import torch

from attnkit._validation import AttentionCall


class Backend(Protocol):
    """An attention implementation. ``supports`` returns ``[]`` when it can serve the call."""

    name: str

    def supports(self, call: AttentionCall) -> list[str]:
        """Why this backend can't serve ``call`` (empty when it can)."""
        ...

    def plan(self, call: AttentionCall) -> str:
        """One line on how the call would run (kernel, mask form), for ``ak.explain``."""
        ...

    def available(self) -> list[str]:
        """Why the backend is unusable in this environment at all (empty when usable)."""
        ...

    def __call__(self, call: AttentionCall) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``out (B, H, Lq, Dv)``, or ``(out, weights (B, H, Lq, Lk))`` when ``call.return_weights``."""
        ...

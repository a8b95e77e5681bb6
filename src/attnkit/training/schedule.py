"""The learning-rate schedule: linear warmup, then cosine decay to ``min_lr_ratio * lr``.

A pure function of the step, so the schedule's state in a checkpoint is just the step number.
"""

from __future__ import annotations

import math


def lr_at(step: int, *, lr: float, warmup: int, total: int, min_lr_ratio: float = 0.1) -> float:
    """Learning rate of optimizer step ``step`` (1-based): ``lr * step / warmup`` during warmup, then cosine."""
    if warmup > 0 and step <= warmup:
        return lr * step / warmup
    span = max(1, total - warmup)
    progress = min(1.0, (step - warmup) / span)
    return lr * (min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress)))

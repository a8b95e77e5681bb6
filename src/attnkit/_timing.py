"""Side-by-side timing (level 0): what a benchmark and the trainer's precision choice both need.

Timings are medians over rounds in which the contenders run in a fresh random order, so machine noise and
cache pollution hit all of them alike; read ratios, not absolute numbers, on shared machines.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable

import torch


def sync(device: torch.device | str | None = None) -> None:
    """Wait for queued device work (CUDA) so wall-clock timings are honest."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


#: timed calls since the process started (every contender's call in every round): what a benchmark's heartbeat
#: (:func:`attnkit.bench.common.begin`) reports while a suite runs
CALLS = [0]


def round_robin(fns: dict[str, Callable[[], object]], repeats: int, warmup: int = 2,
                device: torch.device | str | None = None, seed: int = 0,
                samples: dict[str, list[float]] | None = None) -> dict[str, float]:
    """Median seconds per contender; each round runs every contender once in a random order. ``samples``, when
    given, receives every contender's timings (seconds, in the order they ran) appended to its list."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    sync(device)
    order, rng = list(fns), random.Random(seed)
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        rng.shuffle(order)
        for name in order:
            start = time.perf_counter()
            fns[name]()
            sync(device)
            times[name].append(time.perf_counter() - start)
            CALLS[0] += 1
    if samples is not None:
        for name, ts in times.items():
            samples.setdefault(name, []).extend(ts)
    return {name: statistics.median(ts) for name, ts in times.items()}

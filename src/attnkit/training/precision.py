"""Mixed precision: is bf16 autocast supported here, and is it faster than fp32 for this model?

On CPUs with AVX512-BF16/AMX a training step under bf16 autocast can be 2x faster than fp32; on others it is
slower. :func:`choose_precision` measures both on the real model and batch, interleaved, and keeps fp32 unless
bf16 is clearly and consistently faster; the run records the choice with its evidence and keeps it on resume.
"""

from __future__ import annotations

import contextlib
import statistics
import time

import torch

from attnkit._timing import sync


def bf16_supported(device: torch.device) -> bool:
    """Whether bf16 matmuls have a native path on ``device`` (CUDA: compute capability check; CPU: oneDNN)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        mkldnn = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
        return bool(mkldnn()) if mkldnn is not None else False
    return False


def autocast(precision: str, device: torch.device):
    """``torch.autocast`` to bf16 for ``precision == "bf16"``, a no-op context for ``"fp32"``."""
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def choose_precision(step_fn, device: torch.device, repeats: int = 7, margin: float = 0.10
                     ) -> tuple[str, dict]:
    """Time ``step_fn(precision)`` (forward + backward, no optimizer step) in fp32 and bf16 and decide.

    The two run interleaved (each round runs both, in alternating order) after one warm-up each, so load on a
    shared machine hits both alike. bf16 is chosen only when its median is at least ``margin`` below fp32's
    **and** it is faster in at least ``repeats - 1`` of the rounds; anything closer keeps fp32 (the safer
    default), so a noisy machine cannot flip the choice run to run. Returns the choice and its evidence
    (every round's seconds, the medians, the ratio and the rule), which the trainer records in the run.
    """
    if not bf16_supported(device):
        return "fp32", {"rule": "bf16 has no native path on this device", "summary": "bf16 not supported here"}
    for p in ("fp32", "bf16"):
        step_fn(p)
    rounds: dict[str, list[float]] = {"fp32": [], "bf16": []}
    for i in range(repeats):
        for p in (("fp32", "bf16") if i % 2 == 0 else ("bf16", "fp32")):
            sync(device)
            start = time.perf_counter()
            step_fn(p)
            sync(device)
            rounds[p].append(time.perf_counter() - start)
    median = {p: statistics.median(ts) for p, ts in rounds.items()}
    wins = sum(b < f for f, b in zip(rounds["fp32"], rounds["bf16"]))
    ratio = median["bf16"] / median["fp32"]
    choice = "bf16" if ratio <= 1.0 - margin and wins >= repeats - 1 else "fp32"
    return choice, {
        "rounds_s": rounds, "median_s": median, "bf16_over_fp32": ratio, "bf16_wins": wins, "repeats": repeats,
        "rule": f"bf16 when its median is >= {margin:.0%} below fp32's and it wins >= {repeats - 1} of {repeats} rounds",
        "summary": (f"measured fwd+bwd fp32 {median['fp32'] * 1e3:.0f} ms, bf16 {median['bf16'] * 1e3:.0f} ms "
                    f"(ratio {ratio:.2f}, bf16 faster in {wins}/{repeats} interleaved rounds; bf16 needs <= "
                    f"{1 - margin:.2f} and {repeats - 1}/{repeats})"),
    }

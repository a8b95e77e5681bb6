"""Mixed precision: is bf16 autocast supported here, and is it faster than fp32 for this model?

On CPUs with AVX512-BF16/AMX a training step under bf16 autocast can be 2x faster than fp32; on others it is
slower. :func:`choose_precision` measures both on the real model and batch and picks the faster one.
"""

from __future__ import annotations

import contextlib

import torch

from attnkit._timing import round_robin


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


def choose_precision(step_fn, device: torch.device, repeats: int = 3) -> tuple[str, dict[str, float]]:
    """Time ``step_fn(precision)`` (forward + backward, no optimizer step) in fp32 and bf16; return the faster
    and the median seconds of each. bf16 must win by 5% to be chosen (fp32 is the safer default)."""
    if not bf16_supported(device):
        return "fp32", {}
    times = round_robin({p: (lambda p=p: step_fn(p)) for p in ("fp32", "bf16")}, repeats, warmup=1, device=device)
    return ("bf16" if times["bf16"] < 0.95 * times["fp32"] else "fp32"), times

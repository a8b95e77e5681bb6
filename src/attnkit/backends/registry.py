"""The backend registry and the router: ``select`` picks the backend for a call, ``explain`` says why.

``backend="auto"`` ranks the backends for each call (:func:`route`) by device, mask kind, sequence length,
need for gradients and for weights, then takes the first that can serve it:

- weights asked for: ``math`` (the only backend that returns them);
- no mask, or a plain causal mask SDPA can flag (``is_causal``), or short sequences: ``sdpa`` (one fused
  kernel; a dense mask of a short call costs little);
- a structured mask or bias (window, documents, strided, padding, global tokens, ALiBi) on long sequences:
  ``flex`` on CUDA (forward and backward), and on CPU for inference when compiling is allowed
  (``ak.backends.flex.allow_cpu_compile()``); otherwise ``blocksparse`` (any device, with backward);
- everything else: ``sdpa``, then ``math``, which serves every request.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from attnkit._bias import StructuredBias
from attnkit._validation import AttentionCall
from attnkit.backends.base import Backend
from attnkit.backends.blocksparse import BlockSparseBackend
from attnkit.backends.flex import FlexBackend, cpu_compile_allowed
from attnkit.backends.math import MathBackend
from attnkit.backends.sdpa import SDPABackend
from attnkit.errors import AttnkitValueError, BackendUnsupportedError
from attnkit.masks import Causal, MaskSpec

#: from this many keys (and ``SPARSE_MIN_QUERIES`` queries) a structured mask goes to a block-skipping backend
SPARSE_MIN_KEYS = 4096  # below, one SDPA call with a dense mask was as fast or faster in our runs
#: from this many keys a structured bias (ALiBi) goes to blocksparse's tiled kernel: SDPA with the dense bias
#: was 2.0x slower forward and 2.3x forward+backward at 2048 (its far-key exponentials turn subnormal)
BIAS_MIN_KEYS = 2048
SPARSE_MIN_QUERIES = 128

_REGISTRY: dict[str, Backend] = {}


def register(backend: Backend) -> None:
    """Add a backend; registration order is priority order (fastest first), ``math`` always last."""
    _REGISTRY[backend.name] = backend
    if "math" in _REGISTRY:
        _REGISTRY["math"] = _REGISTRY.pop("math")


for _backend in (SDPABackend(), BlockSparseBackend(), FlexBackend(), MathBackend()):
    register(_backend)


def available() -> list[str]:
    """Names of the backends usable in this environment, in priority order."""
    return [name for name, b in _REGISTRY.items() if not b.available()]


def get(name: str) -> Backend:
    if not isinstance(name, str) or name not in _REGISTRY:
        raise AttnkitValueError(f"unknown backend {name!r}; choose 'auto' or one of {list(_REGISTRY)}.")
    return _REGISTRY[name]


def reasons_against(backend: Backend, call: AttentionCall) -> list[str]:
    return backend.available() or backend.supports(call)


@dataclass
class Explanation:
    """Which backend serves a call, how, and why every other one can't."""

    chosen: str
    plan: str
    reasons: dict[str, list[str]] = field(default_factory=dict)
    why: list[str] = field(default_factory=list)  # why the router ranked the chosen backend first

    def __str__(self) -> str:
        lines = [f"backend: {self.chosen} - {self.plan}"]
        lines += [f"  why: {w}" for w in self.why]
        for name, why in self.reasons.items():
            if name == self.chosen:
                continue
            lines.append(f"  {name}: " + ("could serve, but has lower priority" if not why else "; ".join(why)))
        return "\n".join(lines)


def _structured(call: AttentionCall) -> str | None:
    """What in the call a block-skipping backend can exploit (None when SDPA's own form is already best)."""
    if isinstance(call.bias, StructuredBias):
        return f"structured bias {type(call.bias).__name__}"
    if isinstance(call.bias, torch.Tensor):
        return None  # a dense bias is already Lq x Lk: SDPA
    if isinstance(call.mask, MaskSpec) and not (isinstance(call.mask, Causal) and call.default_positions
                                                and call.q_len in (1, call.kv_len)):
        return f"mask {call.mask!r}"
    return None


def route(call: AttentionCall) -> tuple[list[str], list[str]]:
    """Backend names in the order ``auto`` tries them for this call, and the reasons for that order."""
    device, why = call.q.device.type, []
    if call.return_weights:
        return ["math"], ["return_weights=True: only math returns the probabilities"]
    structured = _structured(call)
    min_keys = BIAS_MIN_KEYS if isinstance(call.bias, StructuredBias) else SPARSE_MIN_KEYS
    long = call.kv_len >= min_keys and call.q_len >= SPARSE_MIN_QUERIES
    if structured is None:
        why.append("no mask, a causal mask SDPA can flag, or a dense tensor: one fused SDPA kernel")
        return ["sdpa", "blocksparse", "flex", "math"], why
    if not long:
        why.append(f"{structured}, but short (Lq={call.q_len}, Lk={call.kv_len} < {SPARSE_MIN_QUERIES}/"
                   f"{min_keys}): a dense mask costs little, one SDPA call")
        return ["sdpa", "blocksparse", "flex", "math"], why
    flex_ok = device == "cuda" or (device == "cpu" and not call.needs_grad and cpu_compile_allowed())
    if flex_ok:
        why.append(f"{structured} on {call.kv_len} keys: flex skips empty blocks"
                   + (" (CPU inference, compiling allowed)" if device == "cpu" else ""))
        return ["flex", "blocksparse", "sdpa", "math"], why
    why.append(f"{structured} on {call.kv_len} keys: blocksparse computes only reachable key blocks"
               + (" (flex on CPU: no backward" + ("" if call.needs_grad else ", compiling not allowed") + ")"
                  if device == "cpu" else ""))
    return ["blocksparse", "sdpa", "math"], why


def select(call: AttentionCall, backend: str = "auto") -> Backend:
    """The backend that will serve ``call``: the first capable one in :func:`route`'s order for 'auto',
    else the named one."""
    if backend == "auto":
        for name in route(call)[0]:
            b = _REGISTRY.get(name)
            if b is not None and not reasons_against(b, call):
                return b
        return _REGISTRY["math"]  # math serves every request
    chosen = get(backend)
    why = reasons_against(chosen, call)
    if why:
        raise BackendUnsupportedError(
            f"backend {backend!r} can't serve this call: {'; '.join(why)}. Use backend='auto' (picks one that "
            "can), or change the request.", why)
    return chosen


def explain_call(call: AttentionCall, backend: str = "auto") -> Explanation:
    reasons = {name: reasons_against(b, call) for name, b in _REGISTRY.items()}
    if backend != "auto":
        get(backend)
        if reasons[backend]:
            return Explanation(backend, "can't serve this call: " + "; ".join(reasons[backend]), reasons)
    chosen = select(call, backend)
    why = route(call)[1] if backend == "auto" else [f"backend={backend!r} asked for"]
    return Explanation(chosen.name, chosen.plan(call), reasons, why)

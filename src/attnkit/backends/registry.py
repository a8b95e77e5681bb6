"""The backend registry and the router: ``select`` picks the fastest backend that can serve a call,
``explain`` says why each other one can't.

Backends are kept fastest-first; ``math`` (the reference path) serves everything and comes last.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from attnkit._validation import AttentionCall
from attnkit.backends.base import Backend
from attnkit.backends.math import MathBackend
from attnkit.backends.sdpa import SDPABackend
from attnkit.errors import AttnkitValueError, BackendUnsupportedError

_REGISTRY: dict[str, Backend] = {}


def register(backend: Backend) -> None:
    """Add a backend; registration order is priority order (fastest first), ``math`` always last."""
    _REGISTRY[backend.name] = backend
    if "math" in _REGISTRY:
        _REGISTRY["math"] = _REGISTRY.pop("math")


for _backend in (SDPABackend(), MathBackend()):
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

    def __str__(self) -> str:
        lines = [f"backend: {self.chosen} - {self.plan}"]
        for name, why in self.reasons.items():
            if name == self.chosen:
                continue
            lines.append(f"  {name}: " + ("could serve, but has lower priority" if not why else "; ".join(why)))
        return "\n".join(lines)


def select(call: AttentionCall, backend: str = "auto") -> Backend:
    """The backend that will serve ``call``: the first capable one for 'auto', else the named one."""
    if backend == "auto":
        for b in _REGISTRY.values():
            if not reasons_against(b, call):
                return b
        raise BackendUnsupportedError("no backend can serve this call", [])  # math serves all: unreachable
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
    return Explanation(chosen.name, chosen.plan(call), reasons)

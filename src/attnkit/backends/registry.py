"""The backend registry and the router: ``select`` picks the backend for a call, ``explain`` says why.

``backend="auto"`` asks every registered, available backend whether it can serve the call
(:meth:`Backend.supports`) and how well (:meth:`Backend.rank`, a score and a one-line reason), and takes
the best; ties go to the backend registered first. The thresholds behind the scores live in the backends
that use them (``blocksparse.SPARSE_MIN_KEYS``, ...). ``math`` serves every request, so there is always a
choice. A backend registered with :func:`register` takes part at once: nothing else lists backends.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from attnkit._validation import AttentionCall
from attnkit.backends.base import Backend, Rank
from attnkit.backends.blocksparse import BlockSparseBackend
from attnkit.backends.flex import FlexBackend
from attnkit.backends.math import MathBackend
from attnkit.backends.sdpa import SDPABackend
from attnkit.errors import AttnkitTypeError, AttnkitValueError, BackendUnsupportedError, describe

_REGISTRY: dict[str, Backend] = {}
_PROTOCOL = ("available", "supports", "rank", "plan", "__call__")


def register(backend: Backend) -> None:
    """Add (or replace, by ``backend.name``) a backend; ``auto`` ranks it with the others from now on."""
    name = getattr(backend, "name", None)
    missing = [m for m in _PROTOCOL if not callable(getattr(backend, m, None))]
    if not isinstance(name, str) or not name or name == "auto" or missing:
        raise AttnkitTypeError(
            f"register expects a backend with a str name (not 'auto') and methods {', '.join(_PROTOCOL)}, got "
            f"{describe(backend)} (name={name!r}, missing {missing}); see attnkit.backends.base.Backend.")
    _REGISTRY[name] = backend


def unregister(name: str) -> Backend:
    """Remove a registered backend and return it (``math``, the fallback of every call, stays)."""
    if name == "math":
        raise AttnkitValueError("backend 'math' can't be unregistered: it is the fallback that serves every call.")
    get(name)
    return _REGISTRY.pop(name)


for _backend in (SDPABackend(), BlockSparseBackend(), FlexBackend(), MathBackend()):
    register(_backend)


def available() -> list[str]:
    """Names of the backends usable in this environment, in registration order."""
    return [name for name, b in _REGISTRY.items() if not b.available()]


def get(name: str) -> Backend:
    if not isinstance(name, str) or name not in _REGISTRY:
        raise AttnkitValueError(f"unknown backend {name!r}; choose 'auto' or one of {list(_REGISTRY)}.")
    return _REGISTRY[name]


def reasons_against(backend: Backend, call: AttentionCall) -> list[str]:
    why = backend.available() or backend.supports(call)
    if call.sinks is not None and not getattr(backend, "serves_sinks", False):  # opt-in: a backend must say so
        why = [*why, "attention sinks (sinks=): this backend does not declare serves_sinks = True"]
    return why


def ranking(call: AttentionCall) -> list[tuple[str, Rank]]:
    """The backends that can serve ``call``, best first: ``(name, Rank)``."""
    capable = [(name, b.rank(call)) for name, b in _REGISTRY.items() if not reasons_against(b, call)]
    return sorted(capable, key=lambda item: -item[1].score)  # stable: ties keep registration order


@dataclass
class Explanation:
    """Which backend serves a call, how, and why every other one can't (or ranks lower)."""

    chosen: str
    plan: str
    reasons: dict[str, list[str]] = field(default_factory=dict)
    why: list[str] = field(default_factory=list)  # the chosen backend's own reason for its rank
    ranks: dict[str, Rank] = field(default_factory=dict)  # every capable backend's rank

    def __str__(self) -> str:
        lines = [f"backend: {self.chosen} - {self.plan}"]
        lines += [f"  why: {w}" for w in self.why]
        for name, why in self.reasons.items():
            if name == self.chosen:
                continue
            if why:
                lines.append(f"  {name}: " + "; ".join(why))
            else:
                rank = self.ranks.get(name)
                lines.append(f"  {name}: could serve, ranks lower" + (f" ({rank.score:g}: {rank.reason})" if rank else ""))
        return "\n".join(lines)


def select(call: AttentionCall, backend: str = "auto") -> Backend:
    """The backend that will serve ``call``: the best ranked capable one for 'auto', else the named one."""
    if backend == "auto":
        best = ranking(call)
        return _REGISTRY[best[0][0]] if best else _REGISTRY["math"]
    chosen = get(backend)
    why = reasons_against(chosen, call)
    if why:
        raise BackendUnsupportedError(
            f"backend {backend!r} can't serve this call: {'; '.join(why)}. Use backend='auto' (picks one that "
            "can), or change the request.", why)
    return chosen


def explain_call(call: AttentionCall, backend: str = "auto") -> Explanation:
    reasons = {name: reasons_against(b, call) for name, b in _REGISTRY.items()}
    ranks = dict(ranking(call))
    if backend != "auto":
        get(backend)
        if reasons[backend]:
            return Explanation(backend, "can't serve this call: " + "; ".join(reasons[backend]), reasons, [], ranks)
    chosen = select(call, backend)
    why = [ranks[chosen.name].reason] if backend == "auto" else [f"backend={backend!r} asked for"]
    return Explanation(chosen.name, chosen.plan(call), reasons, why, ranks)

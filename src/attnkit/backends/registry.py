"""The backend registry and the router: ``select`` picks the backend for a call, ``explain`` says why.

``backend="auto"`` asks every registered, available backend whether it can serve the call
(:meth:`Backend.supports`) and how well (:meth:`Backend.rank`, a score and a one-line reason), and takes
the best; ties go to the backend registered first. The thresholds behind the scores live in the backends
that use them (``blocksparse.SPARSE_MIN_KEYS``, ...). ``math`` serves every request, so there is always a
choice. A backend registered with :func:`register` takes part at once: nothing else lists backends.

``auto``'s choice is memoised when every registered backend declares ``ranks_by_signature = True`` (its
``supports`` and ``rank`` read nothing of a call but :meth:`AttentionCall.signature`, its prepared mask and the
backend's ``state()``): keyed on exactly those, globally for calls without a mask or with a pure causal one,
in the prepared mask's memo otherwise (its data, e.g. document ids, then counts too). ``register`` and
``unregister`` invalidate it. While ``torch.compile`` traces, nothing is memoised and backends that declare
``traceable = False`` are skipped by ``auto``.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

import torch

from attnkit._validation import AttentionCall
from attnkit.backends.base import Backend, Rank
from attnkit.backends.blocksparse import BlockSparseBackend
from attnkit.backends.flex import FlexBackend
from attnkit.backends.math import MathBackend
from attnkit.backends.sdpa import SDPABackend
from attnkit.errors import AttnkitTypeError, AttnkitValueError, BackendUnsupportedError, describe

_REGISTRY: dict[str, Backend] = {}
_PROTOCOL = ("available", "supports", "rank", "plan", "__call__")
#: auto's choices for calls without a mask or with a pure causal one: ``{key: backend}`` (see _choice_key)
_CHOICES: dict[Hashable, Backend] = {}
_CHOICES_MAX = 1024
#: bumped by register/unregister: part of the keys kept in prepared masks' memos
_VERSION = [0]
#: ``(every backend ranks by signature, their state() methods)``, worked out again after register/unregister
_STATES: list = [None]


def register(backend: Backend) -> None:
    """Add (or replace, by ``backend.name``) a backend; ``auto`` ranks it with the others from now on."""
    name = getattr(backend, "name", None)
    missing = [m for m in _PROTOCOL if not callable(getattr(backend, m, None))]
    if not isinstance(name, str) or not name or name == "auto" or missing:
        raise AttnkitTypeError(
            f"register expects a backend with a str name (not 'auto') and methods {', '.join(_PROTOCOL)}, got "
            f"{describe(backend)} (name={name!r}, missing {missing}); see attnkit.backends.base.Backend.")
    _REGISTRY[name] = backend
    _invalidate()


def _invalidate() -> None:
    _CHOICES.clear()
    _VERSION[0] += 1
    _STATES[0] = None


def unregister(name: str) -> Backend:
    """Remove a registered backend and return it (``math``, the fallback of every call, stays)."""
    if name == "math":
        raise AttnkitValueError("backend 'math' can't be unregistered: it is the fallback that serves every call.")
    get(name)
    backend = _REGISTRY.pop(name)
    _invalidate()
    return backend


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
    if not getattr(backend, "traceable", True) and torch.compiler.is_compiling():
        why = [*why, "does not trace under torch.compile (the backend declares traceable = False)"]
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
        key = _choice_key(call)
        if key is None:
            return _best(call)
        if call.prepared is not None and not call.prepared.pure_causal:  # its data may count: its own memo
            return call.prepared.memo(("auto", key), lambda: _best(call))
        chosen = _CHOICES.get(key)
        if chosen is None:
            if len(_CHOICES) >= _CHOICES_MAX:
                _CHOICES.clear()
            chosen = _CHOICES[key] = _best(call)
        return chosen
    chosen = get(backend)
    why = reasons_against(chosen, call)
    if why:
        raise BackendUnsupportedError(
            f"backend {backend!r} can't serve this call: {'; '.join(why)}. Use backend='auto' (picks one that "
            "can), or change the request.", why)
    return chosen


def _best(call: AttentionCall) -> Backend:
    best = ranking(call)
    return _REGISTRY[best[0][0]] if best else _REGISTRY["math"]


def routing_state() -> Hashable | None:
    """What auto's choice reads besides the call: the registry's version and every backend's ``state()``; None
    when a registered backend does not rank by signature alone (then nothing may be memoised)."""
    states = _STATES[0]
    if states is None:  # the registry changed: which backends rank by signature, and which have a state
        backends = list(_REGISTRY.values())
        memoisable = all(getattr(b, "ranks_by_signature", False) for b in backends)
        states = _STATES[0] = (memoisable, tuple(b.state for b in backends if callable(getattr(b, "state", None))))
    memoisable, state_fns = states
    if not memoisable:
        return None
    if len(state_fns) == 1:  # (the built-in registry: flex's; no comprehension frame on every call)
        return _VERSION[0], state_fns[0]()
    return _VERSION[0], tuple([state() for state in state_fns])


def _choice_key(call: AttentionCall) -> Hashable | None:
    """What auto's choice depends on: the call's signature, whether its mask is pure causal, the routing state;
    None (no memo) while compiling or when a registered backend does not rank by signature alone."""
    state = routing_state()
    if state is None or torch.compiler.is_compiling():
        return None
    return (call.signature(), None if call.prepared is None else call.prepared.pure_causal, state)


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

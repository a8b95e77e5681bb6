"""The backend registry and the router: ``select`` picks the backend for a call, ``explain`` says why.

``backend="auto"`` asks every registered, available backend whether it can serve the call
(:meth:`Backend.supports`) and how well (:meth:`Backend.rank`, a score and a one-line reason), then takes the
one with the cheapest **predicted time** (:mod:`attnkit.backends.cost`: the backend's ``work(call)``, what it
will compute, priced by this machine's calibration). A rank below 0 means "can serve, but not unless asked"
(flex compiling on CPU without permission): auto never takes it. A backend without a prediction (no ``work``,
or no coefficients for it) competes by rank: it takes the call when its score is higher than the cheapest
backend's; with no prediction at all the highest rank wins, ties going to the backend registered first.
``math`` serves every request, so there is always a choice. A backend registered with :func:`register` takes
part at once: nothing else lists backends.

``auto``'s choice is memoised among the backends that declare ``ranks_by_signature = True`` (their ``supports``
and ``rank`` read nothing of a call but :meth:`AttentionCall.signature`, its prepared mask and the backend's
``state()``): keyed on exactly those, globally for calls without a mask or with a pure causal one, in the
prepared mask's memo otherwise (its data, e.g. document ids, then counts too). A backend without the
declaration costs only its own asking: it is asked on every call (``supports`` and ``rank``) and takes the call
from the memoised choice when its score is higher; the memo and the plain lane stay on for everything else.
``register`` and ``unregister`` invalidate the memo. While ``torch.compile`` traces, nothing is memoised and
backends that declare ``traceable = False`` are skipped by ``auto``.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

import torch

from attnkit._memo import Memo
from attnkit._validation import AttentionCall
from attnkit.backends import cost
from attnkit.backends.base import Backend, Rank
from attnkit.backends.blocksparse import BlockSparseBackend
from attnkit.backends.eager import EagerBackend
from attnkit.backends.flex import FlexBackend
from attnkit.backends.math import MathBackend
from attnkit.backends.sdpa import SDPABackend
from attnkit.errors import AttnkitTypeError, AttnkitValueError, BackendUnsupportedError, describe

_REGISTRY: dict[str, Backend] = {}
_PROTOCOL = ("available", "supports", "rank", "plan", "__call__")
#: auto's choices for calls without a mask or with a pure causal one: ``{key: backend}`` (see _choice_key)
_CHOICES = Memo("auto choices", 1024)
#: bumped by register/unregister: part of the keys kept in prepared masks' memos
_VERSION = [0]
#: ``(backends asked on every call (no ranks_by_signature), the others' state() methods)``, worked out again after
#: register/unregister
_STATES: list = [None]


def register(backend: Backend) -> None:
    """Add (or replace, by ``backend.name``) a backend; ``auto`` ranks it with the others from now on.

    ``name``, ``available``, ``supports``, ``rank``, ``plan`` and ``__call__`` are required. What a missing optional
    declaration (:class:`~attnkit.backends.base.Backend`) costs:

    - no ``ranks_by_signature = True``: this backend is asked (``supports``, ``rank``) on every call ``auto``
      routes, and serves a call when its score beats the memoised choice's; the other backends' choice stays
      memoised and plain calls keep their lane, paying one ``rank`` call of this backend each.
    - no ``state()``: ``auto`` assumes its answers depend on nothing outside the call (changing a setting they
      read would not be seen by the memo).
    - no ``runner``: plain calls of a lane run ``backend(call)`` itself (nothing hoisted out of the call).
    - no ``work``: no predicted time; it takes a call only when its rank score beats the cheapest priced
      backend's (see the module docstring).
    - no ``traceable``: traceable assumed; no ``serves_sinks``: calls with ``sinks=`` are refused.
    """
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


for _backend in (SDPABackend(), BlockSparseBackend(), FlexBackend(), EagerBackend(), MathBackend()):
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
    why: list[str] = field(default_factory=list)  # the chosen backend's own reason for its rank, its prediction
    ranks: dict[str, Rank] = field(default_factory=dict)  # every capable backend's rank
    costs: dict[str, cost.Cost] = field(default_factory=dict)  # every capable backend's predicted time and parts
    calibration: str = ""  # where the coefficients came from (a cache file, the built-in defaults, pinned)

    def __str__(self) -> str:
        lines = [f"backend: {self.chosen} - {self.plan}"]
        lines += [f"  why: {w}" for w in self.why]
        for name, why in self.reasons.items():
            if name == self.chosen:
                continue
            if why:
                lines.append(f"  {name}: " + "; ".join(why))
            else:
                rank, predicted = self.ranks.get(name), self.costs.get(name)
                how = f"predicted {predicted}" if predicted is not None else "ranks lower"
                lines.append(f"  {name}: could serve, {how}" + (f" ({rank.score:g}: {rank.reason})" if rank else ""))
        if self.costs:
            lines.append(f"  (predicted times from {self.calibration})")
        return "\n".join(lines)


def select(call: AttentionCall, backend: str = "auto") -> Backend:
    """The backend that will serve ``call``: the best ranked capable one for 'auto', else the named one."""
    if backend == "auto":
        chosen, score = select_by_signature(call)
        return overrule(call, chosen, score)
    chosen = get(backend)
    why = reasons_against(chosen, call)
    if why:
        raise BackendUnsupportedError(
            f"backend {backend!r} can't serve this call: {'; '.join(why)}. Use backend='auto' (picks one that "
            "can), or change the request.", why)
    return chosen


def select_by_signature(call: AttentionCall) -> tuple[Backend, float]:
    """auto's choice among the backends that rank by signature, and its score: memoised (see the module
    docstring); :func:`overrule` then asks the others."""
    key = _choice_key(call)
    if key is None:
        return _best(call, _by_signature())
    if call.prepared is not None and not call.prepared.pure_causal:  # its data may count: its own memo
        return call.prepared.memo(("auto", key), lambda: _best(call, _by_signature()))
    chosen = _CHOICES.get(key)
    if chosen is None:
        chosen = _CHOICES[key] = _best(call, _by_signature())
    return chosen


def overrule(call: AttentionCall, chosen: Backend, score: float) -> Backend:
    """``chosen``, unless a backend asked on every call (no ``ranks_by_signature``) can serve ``call`` and ranks
    higher than ``score``: the best of those then."""
    per_call = _routing_states()[0]
    if not per_call:
        return chosen
    best, best_score = _best(call, per_call)
    return best if best is not _REGISTRY["math"] and best_score > score else chosen


def _best(call: AttentionCall, backends: dict[str, Backend]) -> tuple[Backend, float]:
    """The cheapest predicted of the capable backends with a rank of at least 0 (negative: "can serve, but not
    unless asked"), unless one without a prediction (no ``work``, or no coefficients for it) ranks higher than
    it; by rank alone when none is priced. Returns the backend and its rank score."""
    calibration = cost.active(call.q.device)
    priced: tuple[float, Backend, float] | None = None
    unpriced: tuple[float, Backend] | None = None
    for b in backends.values():
        if reasons_against(b, call):
            continue
        score = b.rank(call).score
        predicted = predict(b, call, calibration) if score >= 0 else None
        if predicted is not None:
            if priced is None or predicted.seconds < priced[0]:  # (ties keep the first registered)
                priced = (predicted.seconds, b, score)
        elif unpriced is None or score > unpriced[0]:
            unpriced = (score, b)
    if priced is not None and (unpriced is None or unpriced[0] <= priced[2]):
        return priced[1], priced[2]
    if unpriced is not None:
        return unpriced[1], unpriced[0]
    return _REGISTRY["math"], float("-inf")


def predict(backend: Backend, call: AttentionCall, calibration: cost.Calibration | None = None) -> cost.Cost | None:
    """``backend``'s predicted time for ``call`` (None: it declares no ``work``, or the calibration has no
    coefficients for it, its dtype and direction)."""
    work = getattr(backend, "work", None)
    calibration = cost.active(call.q.device) if calibration is None else calibration
    if work is None or calibration is None or call.is_empty:  # (an empty call runs no kernel: any backend will do)
        return None
    coefficients = calibration.coefficients(backend.name, call.q.dtype, cost.direction(call))
    if coefficients is None:  # (asked first: a plan is built only for a backend that can be priced)
        return None
    amounts = work(call)
    return None if amounts is None else cost.price(amounts, coefficients)


def _by_signature() -> dict[str, Backend]:
    return {name: b for name, b in _REGISTRY.items() if getattr(b, "ranks_by_signature", False)}


def _routing_states() -> tuple:
    states = _STATES[0]
    if states is None:  # the registry changed: which backends are asked per call, which have a state
        per_call = {n: b for n, b in _REGISTRY.items() if not getattr(b, "ranks_by_signature", False)}
        state_fns = tuple(b.state for n, b in _REGISTRY.items()
                          if n not in per_call and callable(getattr(b, "state", None)))
        states = _STATES[0] = (per_call, state_fns)
    return states


def asked_per_call() -> bool:
    """Whether a registered backend does not rank by signature (then :func:`overrule` asks it on every call)."""
    return bool(_routing_states()[0])


def routing_state() -> Hashable:
    """What auto's memoised choice reads besides the call: the registry's version, the calibration's
    (:mod:`attnkit.backends.cost`) and the ``state()`` of every backend that ranks by signature."""
    state_fns = _routing_states()[1]
    if len(state_fns) == 1:  # (the built-in registry: flex's; no comprehension frame on every call)
        return _VERSION[0], cost._VERSION[0], state_fns[0]()
    return _VERSION[0], cost._VERSION[0], tuple([state() for state in state_fns])


def _choice_key(call: AttentionCall) -> Hashable | None:
    """What auto's choice depends on: the call's signature, whether its mask is pure causal, the routing state;
    None (no memo) while compiling."""
    if torch.compiler.is_compiling():
        return None
    state = routing_state()
    return (call.signature(), None if call.prepared is None else call.prepared.pure_causal, state)


def explain_call(call: AttentionCall, backend: str = "auto") -> Explanation:
    reasons = {name: reasons_against(b, call) for name, b in _REGISTRY.items()}
    ranks = dict(ranking(call))
    calibration = cost.active(call.q.device)
    costs = {name: c for name in ranks if (c := predict(_REGISTRY[name], call, calibration)) is not None}
    source = calibration.source if calibration is not None else ""
    if backend != "auto":
        get(backend)
        if reasons[backend]:
            return Explanation(backend, "can't serve this call: " + "; ".join(reasons[backend]), reasons, [], ranks,
                               costs, source)
    chosen = select(call, backend)
    if backend != "auto":
        why = [f"backend={backend!r} asked for"]
    else:
        why = [ranks[chosen.name].reason] if chosen.name in ranks else []
        if chosen.name in costs:
            others = len([n for n in costs if ranks[n].score >= 0])
            why.append(f"predicted {costs[chosen.name]}: the cheapest of {others} priced backends" if others > 1
                       else f"predicted {costs[chosen.name]}: the only priced backend that can serve it")
        elif costs:
            why.append("no predicted time: it ranks above the cheapest priced backend")
    return Explanation(chosen.name, chosen.plan(call), reasons, why, ranks, costs, source)

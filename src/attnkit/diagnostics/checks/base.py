"""The check protocol, the registry, and the helpers every check shares (inputs, comparisons).

A check is a function ``run(subject, options) -> Outcome`` registered with :func:`check` under a stable name
and the fix from the pitfall checklist. It raises :class:`Skip` with the reason when the subject lacks what it
needs. Comparisons run in float64 so that a leak (changed outputs) is told apart from rounding noise; a model
that refuses float64 (a layer's kernel takes float32 / bfloat16 / float16 only) is compared in the most precise
dtype it runs (:func:`precise`), by that dtype's tolerance (:func:`tolerance`), and the evidence says so.

Shape legend: B batch, H heads, L length, E embed_dim, D head_dim, V vocab size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from attnkit._tolerance import floor_for
from attnkit.errors import AttnkitValueError

PASS, WARN, FAIL, SKIP = "PASS", "WARN", "FAIL", "SKIP"
INFO = "INFO"  # a fact worth knowing that is not a bug (the evidence behind a warning does not hold)


class Skip(Exception):
    """The subject does not support what the check needs; the message says what is missing."""


@dataclass
class Outcome:
    status: str
    evidence: str
    details: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Options:
    """Sizes and switches of one examination (all small: the doctor must stay fast on CPU)."""

    batch: int = 2
    seq_len: int = 8
    heads: int = 2
    head_dim: int = 16
    seed: int = 0
    fresh: bool | None = None  # freshly initialised model? None = unknown
    #: why ``fresh`` is False (e.g. "weights loaded from a Hugging Face folder"), said by the checks that skip
    not_fresh_because: str = "the subject is trained or loaded, not fresh (fresh=False)"
    overfit: bool = False
    overfit_steps: int = 150
    #: the user's tokens ``(1, L)`` (the report's text): attention health is measured on them when given
    text: torch.Tensor | None = None
    #: what ``text`` is, for the evidence ("the report's text, 14 tokens")
    text_note: str = ""
    thresholds: object = None  # HealthThresholds for attention-health (None = the defaults)


@dataclass(frozen=True)
class Check:
    name: str
    title: str
    fix: str
    run: Callable
    order: float = 1000.0  # the report's position: lower runs first; equal orders keep registration order


REGISTRY: dict[str, Check] = {}


def check(name: str, title: str, fix: str, *, order: float = 1000.0):
    """Register ``run(subject, options) -> Outcome`` as the check ``name``.

    Registration is the single source of what runs: the doctor runs every registered check, sorted by
    ``order`` (the built-ins use 10..120; the default 1000 puts a new check after them), ties in registration
    order. A module under ``attnkit.diagnostics.checks`` is imported (and so registered) automatically.
    """
    if not isinstance(name, str) or not name:
        raise AttnkitValueError(f"check name must be a non-empty string, got {name!r}.")
    if isinstance(order, bool) or not isinstance(order, (int, float)) or order != order:
        raise AttnkitValueError(f"check {name!r}: order must be a number (lower runs first), got {order!r}.")

    def register(fn: Callable) -> Callable:
        old = REGISTRY.get(name)
        if old is not None and _origin(old.run) != _origin(fn):
            raise AttnkitValueError(f"check name {name!r} is already registered by {_origin(old.run)}; give "
                                    f"{_origin(fn)} another name.")
        REGISTRY[name] = Check(name, title, fix, fn, float(order))
        return fn

    return register


def _origin(fn: Callable) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def names() -> list[str]:
    """Every registered check's name, in the order the doctor runs them."""
    position = {n: i for i, n in enumerate(REGISTRY)}
    return sorted(REGISTRY, key=lambda n: (REGISTRY[n].order, position[n]))


# ------------------------------------------------------------------------------------------ shared helpers

def gen(options: Options, offset: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(options.seed + offset)


def randn(shape, g: torch.Generator, dtype=torch.float64, device="cpu") -> torch.Tensor:
    return torch.randn(shape, generator=g, dtype=torch.float64).to(device=device, dtype=dtype)


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0


#: a float64 comparison allows this much relative change: user code may compute in float32 inside
F64_RELATIVE = 2e-5
#: in another dtype a change of up to this many rounding floors (``attnkit._tolerance.floor_for``: 4 eps(T)
#: max(1, |ref|)) counts as unchanged: ~1e-4 relative in float32, the rounding a deep model's layers compound when a
#: kernel regroups rows (a mixture of experts routes other tokens with them)
NOISE_FLOORS = 200


def tolerance(ref: torch.Tensor) -> float:
    """What counts as "unchanged" when comparing outputs of different shapes/kernels, by ``ref``'s dtype."""
    if ref.dtype == torch.float64:
        return F64_RELATIVE * max(1.0, float(ref.detach().abs().max()) if ref.numel() else 1.0)
    return NOISE_FLOORS * floor_for(ref.dtype, ref)


def all_finite(t: torch.Tensor) -> bool:
    """No NaN or inf in ``t``: its min and max are finite (min/max propagate NaN; 10x faster than isfinite().all()
    on a large gradient in float16 on CPU)."""
    if t.numel() == 0:
        return True
    low, high = torch.aminmax(t.detach().reshape(-1))
    return bool(torch.isfinite(low)) and bool(torch.isfinite(high))


def causal_mask(L: int, device="cpu") -> torch.Tensor:
    """(L, L) bool, True = may attend: query i sees keys j <= i."""
    return torch.ones(L, L, dtype=torch.bool, device=device).tril()


def fn_inputs(options: Options, *, L: int | None = None, dtype=torch.float64, offset: int = 0):
    """Random q, k, v ``(B, H, L, D)`` for function-level checks."""
    g = gen(options, offset)
    L = L or options.seq_len
    shape = (options.batch, options.heads, L, options.head_dim)
    return randn(shape, g, dtype), randn(shape, g, dtype), randn(shape, g, dtype)


def tokens_for(vocab: int, batch: int, length: int, g: torch.Generator, device="cpu") -> torch.Tensor:
    """Random token ids ``(B, L)`` int64 (avoiding id 0, often a special token)."""
    return torch.randint(1, vocab, (batch, length), generator=g).to(device)


def model_device(subject) -> torch.device:
    module = subject.module
    p = next(module.parameters(), None) if module is not None else None
    return p.device if p is not None else torch.device("cpu")


def x_inputs(subject, options: Options, length: int, offset: int = 0, dtype=torch.float64) -> torch.Tensor:
    """Random module input ``(B, L, E)``."""
    return randn((options.batch, length, subject.embed_dim), gen(options, offset), dtype, model_device(subject))


def first_bad_position(a: torch.Tensor, b: torch.Tensor, dim: int, tol: float) -> int | None:
    """The first index along ``dim`` where ``a`` and ``b`` differ by more than ``tol`` (None if none)."""
    diff = (a.double() - b.double()).abs()
    diff = diff.movedim(dim, 0).reshape(diff.shape[dim], -1).amax(dim=1)
    bad = (diff > tol).nonzero()
    return int(bad[0]) if bad.numel() else None


def sample_inputs(subject, options: Options, dtype=torch.float32, offset: int = 7):
    """Fixed sample input of the subject's main level: tokens ``(B, L)`` or x ``(B, L, E)`` (None for fn)."""
    if subject.lm is not None:
        return tokens_for(subject.lm.vocab_size, options.batch, options.seq_len, gen(options, offset),
                          model_device(subject))
    if subject.seq is not None:
        return x_inputs(subject, options, options.seq_len, offset=offset, dtype=dtype)
    return None


def run_main(subject, inputs, *, causal: bool = True) -> torch.Tensor:
    """Forward ``inputs`` through the subject's main level (a causal mask for modules when ``causal``)."""
    if subject.lm is not None:
        return subject.lm.per_position(inputs)  # (B, L, E|V): the head adds nothing these checks look at
    L = inputs.shape[1]
    return subject.seq(inputs, causal_mask(L, inputs.device) if causal else None)


# ------------------------------------------------------------------------------------------ probe precision

#: the dtypes a model-level probe tries, most precise first (then the model's own, when it is another)
PRECISIONS = (torch.float64, torch.float32)


@dataclass(frozen=True)
class Probe:
    """The subject cast to the dtype the checks compare in, and what the evidence says about it."""

    subject: object
    dtype: torch.dtype
    #: "" in float64; else which dtypes the model refused and why (appended to the evidence)
    note: str = ""


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def own_dtype(subject) -> torch.dtype:
    module = subject.module
    p = next((t for t in module.parameters() if t.is_floating_point()), None) if module is not None else None
    return p.dtype if p is not None else torch.float32


def precise(subject, options: Options) -> Probe:
    """The subject in the most precise dtype it runs a plain forward in: float64, else float32, else its own dtype
    (memoised on the subject). A subject without a module (a bare function) is probed in float64 as it is. When
    every dtype raises, the last one's error propagates: the subject does not run at all."""
    memo = subject.notes.setdefault("precise", {})
    if "probe" not in memo:
        memo["probe"] = _first_that_runs(subject, options)
    return memo["probe"]


def _first_that_runs(subject, options: Options) -> Probe:
    if subject.module is None or subject.rebuild is None:
        return Probe(subject, torch.float64)
    refused: list[str] = []
    *others, last = list(PRECISIONS) + [d for d in (own_dtype(subject),) if d not in PRECISIONS]
    for dtype in others:
        try:
            s = _runs_in(subject, dtype, options)
        except Exception as exc:  # noqa: BLE001 - a layer that refuses this dtype: try the next one
            subject._casts.pop(dtype, None)  # don't keep a copy the checks can't use
            refused.append(f"{dtype_name(dtype)} refused: {type(exc).__name__}: {str(exc).splitlines()[0][:80]}")
            continue
        return Probe(s, dtype, f" (compared in {dtype_name(dtype)}: {'; '.join(refused)})" if refused else "")
    return Probe(_runs_in(subject, last, options), last, f" (compared in {dtype_name(last)}: {'; '.join(refused)})")


def _runs_in(subject, dtype: torch.dtype, options: Options):
    """The subject cast to ``dtype`` after a plain forward in it ran (raises what the forward raised)."""
    s = subject.cast(dtype)
    with torch.no_grad():
        run_main(s, sample_inputs(s, options, dtype=dtype))
    return s


def plain_call_error(subject, options: Options) -> str | None:
    """None when the subject runs a plain call (its own dtype, no mask, no cache, no padding); else the error."""
    try:
        with torch.no_grad():
            if subject.lm is not None or subject.seq is not None:
                run_main(subject, sample_inputs(subject, options, dtype=own_dtype(subject)))
            elif subject.fn is not None:
                subject.fn(*fn_inputs(options, dtype=torch.float32), None)
    except Exception as exc:  # noqa: BLE001 - the answer is the error
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
    return None

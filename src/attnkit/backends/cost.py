"""Routing by predicted cost: what a backend will compute for a call, priced by a per-machine calibration.

A backend that declares ``work(call) -> dict[str, float]`` says what it will actually compute for ``call`` as
named amounts (:data:`FEATURES`): kernel calls, query x key entries times the head dim (those its mask's block
cover leaves, for a block-skipping backend), mask entries read, rows gathered, ... A :class:`Calibration` holds,
per ``(backend, dtype, direction)``, the seconds each unit costs; direction is ``"forward"`` or ``"train"``
(forward plus backward, when autograd records). The predicted time is the sum of amount x coefficient, and
:class:`Cost` keeps the parts, so ``ak.explain`` can say what the time is made of.

The coefficients are measured per machine by ``attnkit tune`` (:mod:`attnkit.bench.tune`: a short calibration
that times every backend on a few calls and fits the coefficients, non-negative least squares) and cached in
the user's cache folder (``$ATTNKIT_CACHE_DIR`` or ``$XDG_CACHE_HOME/attnkit`` or ``~/.cache/attnkit``), one
file per device and torch version, a table per dtype; never in the repository. Without a calibration file the
built-in defaults (:data:`DEFAULTS`, measured on the development machine) price CPU calls; on another device type
without a calibration ``auto`` routes by rank alone. Nothing is timed on first use: routing reads the cache file
once per process (``ATTNKIT_CALIBRATION=builtin`` skips it). Decisions are deterministic for a given
calibration: tests pin one with :func:`use`.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from attnkit._validation import AttentionCall

#: the named amounts a backend's ``work(call)`` may report, with what each counts
FEATURES = {
    "call": "the call itself (its fixed overhead: checks, views, output)",
    "kernels": "kernel launches (one per stacked group of pieces, per document bucket)",
    "entries": "query x key entries computed, times the head dim (a causal square counts half)",
    "kv": "key and value elements read (B x Hkv x keys x 2D): what a decode step's time follows",
    "rows": "query and output elements (B x H x Lq x 2D)",
    "decode": "a call with fewer than FEW_QUERIES queries (its own fixed cost)",
    "mask": "mask entries the kernel reads (a dense bool mask over the computed entries)",
    "mask_eval": "mask entries evaluated from the mask's function (per piece, per batch row with data)",
    "gather": "rows of q, k, v copied into stacked pieces, times the head dim",
    "scores": "scores materialised (softmax and where over a (B, H, Lq, Lk) tensor)",
    "bias": "bias entries materialised (a structured bias as a (B, H, Lq, Lk) tensor)",
    "tiled": "entries the tiled kernel computes (a bias or softcap), times the head dim",
    "table": "entries computed on SDPA pieces with an offset table's bias slice (ALiBi inference), times the head dim",
}
DIRECTIONS = ("forward", "train")
#: backends that materialise every score (eager, math) are priced up to this many query x key entries per head,
#: the range ``attnkit tune`` times them in: beyond it their time grows faster than their entries (the scores
#: leave the caches; math at L = 1024 ran 4-6x its linear prediction), so they compete by rank there
DENSE_PRICED_MAX_ENTRIES = 512 * 512
#: calls with fewer queries (decode steps, short chunks) get an intercept of their own (feature ``decode``): their
#: kernels take other paths, whose fixed cost differs from a prefill's
FEW_QUERIES = 128


def direction(call: AttentionCall) -> str:
    """``"train"`` when autograd records the call (its backward follows), else ``"forward"``."""
    return "train" if call.needs_grad else "forward"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class Cost:
    """A predicted time in seconds and its parts ``((feature, amount, seconds), ...)`` (they sum to it)."""

    seconds: float
    parts: tuple[tuple[str, float, float], ...]

    def __str__(self) -> str:
        parts = " + ".join(f"{name} {_ms(s)}" for name, _, s in self.parts if s > 0)
        return f"{_ms(self.seconds)}" + (f" = {parts}" if parts else "")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


@dataclass(frozen=True)
class Calibration:
    """Seconds per unit of each :data:`FEATURES` amount, per ``"backend/dtype/direction"`` (see the module
    docstring). ``source`` says where it came from (``"built-in defaults"``, a file, ``"pinned"``)."""

    table: Mapping[str, Mapping[str, float]]
    source: str = "pinned"
    device: str = "cpu"
    meta: Mapping[str, object] = field(default_factory=dict)

    def coefficients(self, backend: str, dtype: torch.dtype, direction: str) -> Mapping[str, float] | None:
        """The coefficients for one backend, dtype and direction; another dtype's when this one was not
        measured (half precision: the other half dtype, then float32; float64: float32); None when the backend
        has none (it then competes by rank)."""
        for name in _dtype_fallbacks(dtype_name(dtype)):
            found = self.table.get(f"{backend}/{name}/{direction}")
            if found is not None:
                return found
        return None

    def predict(self, backend: str, call: AttentionCall, work: Mapping[str, float]) -> Cost | None:
        coefficients = self.coefficients(backend, call.q.dtype, direction(call))
        return None if coefficients is None else price(work, coefficients)

    def to_json(self) -> dict:
        return {"device": self.device, "source": self.source, "meta": dict(self.meta),
                "table": {k: dict(v) for k, v in self.table.items()}}


def price(work: Mapping[str, float], coefficients: Mapping[str, float]) -> Cost:
    """``work``'s amounts times their coefficients (an amount without one costs nothing)."""
    parts = tuple((name, float(amount), float(amount) * coefficients.get(name, 0.0)) for name, amount in work.items())
    return Cost(sum(s for _, _, s in parts), parts)


def _dtype_fallbacks(name: str) -> tuple[str, ...]:
    return {"bfloat16": ("bfloat16", "float16", "float32"), "float16": ("float16", "bfloat16", "float32"),
            "float64": ("float64", "float32")}.get(name, (name, "float32"))


# ------------------------------------------------------------------------------------------ where it lives
def cache_dir() -> Path:
    """The user's cache folder for attnkit (``$ATTNKIT_CACHE_DIR``, ``$XDG_CACHE_HOME/attnkit``, ``~/.cache/attnkit``)."""
    if os.environ.get("ATTNKIT_CACHE_DIR"):
        return Path(os.environ["ATTNKIT_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "attnkit"


def device_name(device: torch.device | str) -> str:
    """What a calibration is keyed by: the device type and its model (CPU model name, CUDA device name)."""
    device = torch.device(device)
    if device.type == "cuda":
        return f"cuda-{torch.cuda.get_device_name(device)}"
    if device.type == "cpu":
        return f"cpu-{_cpu_model()}-{os.cpu_count()}cores"
    return device.type


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def calibration_path(device: torch.device | str) -> Path:
    """The calibration file for ``device`` and this torch version (one table per dtype inside)."""
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", f"{device_name(device)}-torch{torch.__version__}").strip("-")
    return cache_dir() / "calibration" / f"{slug}.json"


def save(calibration: Calibration, device: torch.device | str) -> Path:
    """Write ``calibration`` to the cache file of ``device`` (merged over the tables already there)."""
    path = calibration_path(device)
    old = _read(path)
    table = {**(old.table if old else {}), **calibration.table}
    meta = {**(old.meta if old else {}), **calibration.meta}
    path.parent.mkdir(parents=True, exist_ok=True)
    merged = Calibration(table, str(path), device_name(device), meta)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(merged.to_json(), indent=1, sort_keys=True))
    tmp.replace(path)
    _LOADED.pop(torch.device(device).type, None)
    _VERSION[0] += 1
    return path


def _read(path: Path) -> Calibration | None:
    try:
        data = json.loads(path.read_text())
        table = {str(k): {str(f): float(c) for f, c in v.items()} for k, v in data["table"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # no file, or one this version can't read: the defaults serve
    return Calibration(table, str(path), str(data.get("device", "")), dict(data.get("meta", {})))


# ------------------------------------------------------------------------------------------ the active one
#: bumped whenever the calibration in force may change (use, save): part of auto's memo key
_VERSION = [0]
_PINNED: list[Calibration] = []
_LOADED: dict[str, Calibration | None] = {}


def version() -> int:
    return _VERSION[0]


def active(device: torch.device) -> Calibration | None:
    """The calibration that prices calls on ``device``: a pinned one (:func:`use`), else the cache file, else
    the built-in defaults for CPU; None on another device without a file (auto then routes by rank)."""
    if _PINNED:
        return _PINNED[-1]
    kind = device.type
    if kind not in _LOADED:
        found = None
        if os.environ.get("ATTNKIT_CALIBRATION", "") != "builtin" and not torch.compiler.is_compiling():
            found = _read(calibration_path(device))
        _LOADED[kind] = found or (DEFAULT_CALIBRATION if kind == "cpu" else None)
    return _LOADED[kind]


@contextlib.contextmanager
def use(calibration: Calibration | None) -> Iterator[Calibration | None]:
    """Route with ``calibration`` inside the block (tests pin a fake one; None: by rank alone)."""
    _PINNED.append(calibration if calibration is not None else Calibration({}, "none"))
    _VERSION[0] += 1
    try:
        yield calibration
    finally:
        _PINNED.pop()
        _VERSION[0] += 1


# ------------------------------------------------------------------------------------------ built-in work
def blocksparse_work(call: AttentionCall) -> dict[str, float]:
    """blocksparse's ``work``: a few queries (below ``SPARSE_MIN_QUERIES``) as one piece over the mask's reach;
    packed documents as their runs; else its plans' pieces (the mask's block cover), stacked per shape; with a bias
    or softcap on the tiled kernel or, for ALiBi inference, as SDPA pieces against the offset table. (Its helpers
    are imported here, when asked: blocksparse imports this module.)"""
    from attnkit.backends.blocksparse import (
        SPARSE_MIN_QUERIES as min_queries,
    )
    from attnkit.backends.blocksparse import (
        _allow_causal,
        _offset_pieces_on_sdpa,
        document_runs,
        make_plans,
    )

    tiled, on_sdpa = not _allow_causal(call), _offset_pieces_on_sdpa(call)
    prepared = call.prepared
    if call.q_len < min_queries and not tiled and prepared is not None and not prepared.is_tensor:
        return reach_work(call, prepared.spec.reach(), prepared.spec.offsets() is not None)
    runs = document_runs(call)
    if runs is not None:
        return runs_work(call, runs)
    work = plans_work(call, make_plans(call), per_row_mask=prepared is not None and prepared.spec.batch > 1)
    return tiled_work(work, on_sdpa=on_sdpa) if tiled else work


def dense_work(call: AttentionCall, *, causal: bool = False, mask: bool = False, scores: bool = False,
               bias: bool = False) -> dict[str, float] | None:
    """One kernel over every ``Lq x Lk`` entry (half with a causal flag): SDPA, eager, math (``scores``: None
    past :data:`DENSE_PRICED_MAX_ENTRIES`)."""
    B, H, Lq, D = call.q.shape
    if scores and Lq * call.kv_len > DENSE_PRICED_MAX_ENTRIES:
        return None
    pairs = B * H * Lq * call.kv_len
    work = {"call": 1.0, "kernels": 1.0, "entries": pairs * D / (2 if causal else 1),
            "kv": 2.0 * B * call.num_kv_heads * call.kv_len * D, "rows": 2.0 * B * H * Lq * D}
    if Lq < FEW_QUERIES:
        work["decode"] = 1.0
    if mask:
        work["mask"] = float(pairs)
    if scores:
        work["scores"] = float(pairs)
    if bias:
        work["bias"] = float(pairs)
    return work


def plans_work(call: AttentionCall, plans, *, per_row_mask: bool) -> dict[str, float]:
    """Block-sparse plans (``backends.block_plan.Plan``): what their stacked piece groups compute."""
    H, Hkv, D = call.num_heads, call.num_kv_heads, call.q.shape[3]
    work = {"call": 1.0, "kernels": 0.0, "entries": 0.0, "mask": 0.0, "mask_eval": 0.0, "gather": 0.0, "kv": 0.0,
            "rows": 2.0 * call.batch * H * call.q_len * D}
    if call.q_len < FEW_QUERIES:
        work["decode"] = 1.0
    for plan in plans:
        R = plan.rows.numel()
        if plan.q_perm is not None:  # regrouped by residue: q, k, v permuted once
            work["gather"] += R * (H * plan.q_len + 2 * Hkv * plan.kv_len) * D
        for (lq, lk, mode), ids in plan.groups().items():
            T = len(ids)
            work["kernels"] += 1
            work["entries"] += T * R * H * lq * lk * D / (2 if mode == "causal" else 1)
            work["kv"] += 2.0 * T * R * Hkv * lk * D
            if T > 1 or len(plan.pieces[ids[0]].kv) > 1:
                work["gather"] += T * R * (H * lq + 2 * Hkv * lk) * D
            if mode == "mask":
                work["mask"] += T * R * H * lq * lk
                work["mask_eval"] += T * (R if per_row_mask else 1) * lq * lk
    return work


def reach_work(call: AttentionCall, reach: tuple[int | None, int | None], exact: bool) -> dict[str, float]:
    """A few queries (a decode step, a short chunk) as one piece over the keys the mask's reach lets the last
    ``Lq`` positions see, told without building a plan (a plan costs a millisecond: more than such a call).
    ``exact``: the mask is nothing but its offsets (no mask tensor inside the piece)."""
    B, H, Lq, D = call.q.shape
    Lk = call.kv_len
    lo, hi = reach
    first = 0 if lo is None else max(0, Lk - Lq + lo)
    last = Lk - 1 if hi is None else min(Lk - 1, Lk - 1 + hi)
    keys = max(0, last - first + 1)
    work = {"call": 1.0, "kernels": 1.0, "entries": float(B * H * Lq * keys * D),
            "kv": 2.0 * B * call.num_kv_heads * keys * D, "rows": 2.0 * B * H * Lq * D, "decode": 1.0}
    if not exact:
        work["mask"] = float(B * H * Lq * keys)
        work["mask_eval"] = float(Lq * keys)
    return work


def tiled_work(work: dict[str, float], *, on_sdpa: bool) -> dict[str, float]:
    """Plans whose pieces carry a bias or softcap: the tiled kernel's entries, or SDPA pieces against the
    offset table (``on_sdpa``)."""
    return {"call": 1.0, "kernels": work["kernels"], "table" if on_sdpa else "tiled": work["entries"],
            "gather": work["gather"], "kv": work["kv"], "rows": work["rows"]}


def runs_work(call: AttentionCall, runs) -> dict[str, float]:
    """Packed causal documents (``backends.varlen.Runs``): one causal kernel per bucket of similar runs."""
    B, H, L, D = call.q.shape
    buckets = max(1, len(runs.buckets))
    return {"call": 1.0, "kernels": float(buckets), "entries": runs.density() * B * H * L * L * D,
            "gather": 0.0 if runs.whole_rows else 3.0 * B * L * H * D, "kv": 2.0 * B * call.num_kv_heads * L * D,
            "rows": 2.0 * B * H * L * D}


# ------------------------------------------------------------------------------------------ built-in defaults
#: measured with ``attnkit tune --repeats 2`` on the development machine (2-core AMD EPYC, torch 2.13.0+cpu, one
#: thread, 2026-12-06 21:56 UTC, shared: 1-minute load 4-7); seconds per unit of each feature (zeros left out)
DEFAULTS: dict[str, dict[str, float]] = {
    "blocksparse/bfloat16/forward": {
        "decode": 0.0002, "entries": 4.97e-11, "gather": 3.45e-10, "kv": 8.04e-10, "mask": 4.44e-10,
        "rows": 3.64e-09, "table": 4.47e-11, "tiled": 1.21e-10
    },
    "blocksparse/bfloat16/train": {
        "entries": 1.32e-10, "gather": 3.99e-09, "kernels": 0.000369, "kv": 1.82e-09, "rows": 1.6e-08,
        "tiled": 1.71e-10
    },
    "blocksparse/float32/forward": {
        "decode": 0.000138, "entries": 8.76e-11, "gather": 5.18e-09, "kv": 1.42e-10, "rows": 2.13e-09,
        "table": 2.26e-10, "tiled": 4.38e-10
    },
    "blocksparse/float32/train": {"entries": 2.16e-10, "gather": 2.67e-10, "rows": 1.92e-08, "tiled": 2.92e-10},
    "sdpa/bfloat16/forward": {
        "bias": 3.03e-09, "decode": 0.000809, "entries": 5.39e-11, "kv": 6.32e-10, "rows": 1.3e-09
    },
    "sdpa/bfloat16/train": {"bias": 4.11e-09, "entries": 1.42e-10, "kv": 2.14e-09, "rows": 1.12e-08},
    "sdpa/float32/forward": {"bias": 2.74e-08, "decode": 2.68e-05, "entries": 8.64e-11, "kv": 2.81e-10},
    "sdpa/float32/train": {"bias": 4.21e-09, "entries": 2.27e-10, "mask": 9.82e-10, "rows": 9.92e-09},
}
DEFAULT_CALIBRATION = Calibration(DEFAULTS, "built-in defaults", "cpu")

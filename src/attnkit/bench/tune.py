"""``attnkit tune``: measure this machine's cost coefficients for routing (:mod:`attnkit.backends.cost`).

Every priced backend (one that declares ``work``) is timed side by side on a short grid of calls
(:mod:`attnkit.bench.cells`: masks of every structure, lengths 256-2048, decode steps, MHA and GQA) per dtype and
direction; then, per ``(backend, dtype, direction)``, the coefficients that make ``work(call) . coefficients``
closest to the measured times in relative error are fitted (non-negative least squares), so no part can
price negatively. The result is written to the user's cache folder (:func:`attnkit.backends.cost.save`), keyed by
device, dtype and torch version; ``auto`` reads it from the next process on (or at once, in this one).

Timing is a calibration, not a benchmark: run it on a machine as quiet as the ones you will train on.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import numpy as np
import torch

from attnkit._timing import round_robin
from attnkit.backends import cost, registry
from attnkit.bench import cells
from attnkit.bench.cells import Cell

#: the calibration grid: kinds x lengths (plus decode steps); ``quick`` keeps a third of it
KINDS = ("none", "causal", "sliding128", "sliding512", "chunked256", "documents", "padding", "strided64", "global",
         "alibi", "softcap")
LENGTHS = (256, 1024, 2048)
DECODE = (("causal", 1024), ("causal", 4096), ("sliding128", 4096), ("padding", 2048))
#: dense backends (every Lq x Lk score materialised) are timed up to this many entries per head: they grow as L^2
DENSE_MAX_ENTRIES = cost.DENSE_PRICED_MAX_ENTRIES
DENSE = ("eager", "math")


def grid(dtypes: Iterable[str], directions: Iterable[str], quick: bool = False) -> list[Cell]:
    lengths = LENGTHS[::2] if quick else LENGTHS
    kinds = KINDS[::2] if quick else KINDS
    out = []
    for dtype in dtypes:
        for direction in directions:
            out += [Cell(kind, L, L, "GQA", dtype, direction) for kind in kinds for L in lengths]
            out += [Cell(kind, L, L, "MHA", dtype, direction) for kind in kinds[:4] for L in lengths[-2:]]
            if direction == "forward":
                out += [Cell(kind, L, 1, heads, dtype, direction) for kind, L in DECODE for heads in ("GQA", "MHA")]
    return out


def measure(cell: Cell, repeats: int) -> dict[str, tuple[dict[str, float], float]]:
    """``{backend: (work, seconds)}`` for every priced backend that can serve ``cell``, timed side by side."""
    call = cells.call_of(cell)
    fns: dict[str, Callable[[], object]] = {}
    works = {}
    with torch.set_grad_enabled(cell.direction == "train"):
        for name in cells.capable(cell):
            backend = registry.get(name)
            if getattr(backend, "work", None) is None:
                continue
            if name in DENSE and cell.Lq * cell.L > DENSE_MAX_ENTRIES:
                continue
            work = backend.work(call)
            if work is not None:
                works[name], fns[name] = work, cells.runner(cell, name)
    if not fns:
        return {}
    times = round_robin(fns, repeats, warmup=1)
    return {name: (works[name], times[name]) for name in fns}


def fit(samples: list[tuple[dict[str, float], float]]) -> dict[str, float]:
    """Non-negative coefficients minimising the relative error of ``sum(work * coef)`` against the times."""
    from scipy.optimize import nnls

    names = sorted({n for work, _ in samples for n, a in work.items() if a})
    A = np.array([[work.get(n, 0.0) / t for n in names] for work, t in samples])  # rows scaled: relative error
    scale = np.maximum(np.abs(A).max(axis=0), 1e-300)
    coef, _ = nnls(A / scale, np.ones(len(samples)), maxiter=50 * len(names))
    return {n: float(c / s) for n, c, s in zip(names, coef, scale)}


def calibrate(dtypes: Iterable[str] = ("fp32", "bf16"), directions: Iterable[str] = cost.DIRECTIONS,
              quick: bool = False, repeats: int = 3, log: Callable[[str], None] = print) -> cost.Calibration:
    """Time the grid and fit a :class:`~attnkit.backends.cost.Calibration` (see the module docstring)."""
    samples: dict[str, list[tuple[dict[str, float], float]]] = {}
    names: dict[str, list[str]] = {}
    todo = grid(dtypes, directions, quick)
    with cost.use(None):  # (routing is not under test here: every backend is forced by name)
        for i, cell in enumerate(todo):
            for name, (work, seconds) in measure(cell, repeats).items():
                key = f"{name}/{cost.dtype_name(cells.DTYPES[cell.dtype])}/{cell.direction}"
                samples.setdefault(key, []).append((work, seconds))
                names.setdefault(key, []).append(cell.name)
            if log and (i + 1) % 20 == 0:
                log(f"  {i + 1}/{len(todo)} calls timed")
    table = {key: fit(rows) for key, rows in sorted(samples.items())}
    errors = {key: _worst_error(table[key], rows) for key, rows in samples.items()}
    worst = {key: _worst_cells(table[key], rows, names[key]) for key, rows in samples.items()}
    meta = {"cells": len(todo), "repeats": repeats, "quick": quick, "threads": torch.get_num_threads(),
            "worst_relative_error": errors, "worst_cells": worst}
    return cost.Calibration(table, "attnkit tune", cost.device_name("cpu"), meta)


def _worst_cells(coef: dict[str, float], rows, names: list[str], n: int = 4) -> list[str]:
    """The ``n`` worst fitted calls: ``"cell: predicted/measured"``."""
    ratios = [(sum(a * coef.get(k, 0.0) for k, a in work.items()) / t, name) for (work, t), name in zip(rows, names)]
    ratios.sort(key=lambda r: -abs(math.log(max(r[0], 1e-12))))
    return [f"{name}: {r:.2f}x" for r, name in ratios[:n]]


def _worst_error(coef: dict[str, float], rows) -> float:
    worst = 0.0
    for work, t in rows:
        predicted = sum(a * coef.get(n, 0.0) for n, a in work.items())
        worst = max(worst, abs(math.log(max(predicted, 1e-12) / t)))
    return math.exp(worst)

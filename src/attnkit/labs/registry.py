"""The lab registry: ``@lab(name, title, sizes=..., claims=...)`` on a ``measure(params, plots) -> dict``.

A lab has two sizes: ``"default"`` (minutes on 2 CPU cores) and ``"quick"`` (seconds, for CI). ``measure``
returns its measurements (JSON-able; an optional ``"notes"`` list of sentences goes under the table);
:func:`run_lab` judges the lab's claims on them and writes ``results.json``, ``summary.md`` and the plots.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from attnkit._checks import integer
from attnkit.errors import AttnkitValueError
from attnkit.labs.harness import WHO
from attnkit.labs.report import Claim, Plots, check_out_folder, summary_markdown, write_outputs


@dataclass(frozen=True)
class Lab:
    name: str
    title: str
    sizes: dict[str, dict]
    claims: tuple[Claim, ...]
    measure: Callable[[dict, Plots], dict]


LABS: dict[str, Lab] = {}


def lab(name: str, title: str, *, sizes: dict[str, dict], claims: list[Claim]):
    """Register ``measure(params, plots) -> measurements`` as the lab ``name``."""
    if set(sizes) != {"default", "quick"}:
        raise AttnkitValueError(f"lab {name!r} sizes must be exactly 'default' and 'quick', got {sorted(sizes)}.")

    def register(fn: Callable[[dict, Plots], dict]) -> Callable:
        LABS[name] = Lab(name, title, sizes, tuple(claims), fn)
        return fn

    return register


def get_lab(name: str) -> Lab:
    if name not in LABS:
        raise AttnkitValueError(f"unknown lab {name!r}; choose one of {sorted(LABS)} (or 'all').")
    return LABS[name]


def run_lab(name: str, *, quick: bool = False, out: str | Path | None = None, seed: int = 0,
            threads: int = 1, overwrite: bool = False) -> dict:
    """Run one lab; returns the payload written to ``out/results.json`` (default ``runs/labs/NAME``).

    ``out`` must be absent, empty or an earlier output of this lab unless ``overwrite``
    (:func:`attnkit.labs.report.check_out_folder`: a user's folder is never written into by accident).

    ``threads``: torch CPU threads while it runs (1 by default: tiny models gain nothing from more, and on a
    shared machine more threads spin against each other; the previous setting is restored)."""
    cpus = os.cpu_count() or 1
    integer(threads, "threads", low=1, fix="pass threads=1 (the default) or up to the number of cores.")
    if threads > cpus:
        raise AttnkitValueError(f"threads must be an int from 1 to this machine's {cpus} CPUs, got {threads!r}; "
                                "pass threads=1 (the default) or up to the number of cores.")
    spec = get_lab(name)
    size = "quick" if quick else "default"
    out = check_out_folder(Path(out) if out is not None else Path("runs") / "labs" / name, name, overwrite)
    out.mkdir(parents=True, exist_ok=True)
    params = {**spec.sizes[size], "seed": seed}
    plots = Plots(out)
    torch.manual_seed(seed)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    who = WHO.set(f"lab {name}")  # progress lines name the lab
    try:
        start = time.perf_counter()
        measurements = spec.measure(params, plots)
        seconds = time.perf_counter() - start
    finally:
        WHO.reset(who)
        torch.set_num_threads(previous)
    verdicts = [c.verdict(measurements) for c in spec.claims]
    command = f"attnkit lab {name}" + (" --quick" if quick else "")
    payload = {"lab": name, "title": spec.title, "size": size, "params": params, "command": command,
               "seconds": round(seconds, 1), "torch": torch.__version__, "threads": threads,
               "verdicts": verdicts, "measurements": measurements, "figures": plots.files}
    notes = list(measurements.get("notes", []))
    write_outputs(out, payload, summary_markdown(name, spec.title, size, verdicts, notes, plots.files, seconds,
                                                 command))
    return payload

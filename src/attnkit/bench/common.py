"""What every benchmark suite shares: side-by-side timing, peak memory, the machine's matmul peak, and
recording results as JSON with the machine, versions and command.

Timings are medians over rounds in which the contenders run in a fresh random order, so machine noise and
cache pollution hit all of them alike; read ratios, not absolute numbers, on shared machines.

Every suite runs under :func:`begin` (``attnkit bench`` calls it): torch's threads pinned to 1 unless the suite
or the user chose (a suite's ``--threads``, ``OMP_NUM_THREADS``) -- by default torch takes every core, and on a
busy machine its threads then spin against the other work (decode cells 70x slower, ratios off by 10x) -- the
thread count and the 1-minute load printed, a warning when the load leaves this benchmark less than its threads'
worth of CPUs, and a heartbeat line on stderr every :data:`HEARTBEAT_S` seconds (timed calls so far). Every
results file records them (``conditions``: threads and why, CPUs, load at the start and at the end, busy or not).
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

from attnkit import _timing
from attnkit._timing import round_robin
from attnkit.errors import AttnkitValueError

RESULTS_DIR = Path("benchmarks") / "results"
#: seconds between two heartbeat lines of a running suite
HEARTBEAT_S = 30.0
#: the conditions of the suite running in this process (:func:`begin`), recorded by :func:`write_results`
CONDITIONS: dict = {}


def load_1min() -> float | None:
    """The 1-minute load average (runnable processes, ours included), None where the OS has none."""
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


def busy_warning(load: float | None, threads: int, cpus: int) -> str | None:
    """Why timings taken now are unreliable, or None: the load of other work leaves fewer than ``threads`` CPUs
    free (``load + threads > cpus``: some of this benchmark's threads wait for a core, in bursts)."""
    if load is None or load + threads <= cpus:
        return None
    return (f"the 1-minute load is {load:.1f} on {cpus} CPUs: other work leaves this benchmark's {threads} thread(s) "
            f"less than a core each, so absolute times are inflated and vary in bursts; ratios of contenders timed "
            "side by side are more robust but not exact (each cell's spread is recorded). Re-run on a quiet machine "
            "for figures to publish.")


def begin(suite: str, *, threads_flag: bool = False, stream=None) -> dict:
    """Start a suite in this process: pin torch's threads (1, unless the suite has a ``--threads`` of its own
    (``threads_flag``) or ``OMP_NUM_THREADS`` is set), print the threads and the load, warn when the machine is
    busy, start the heartbeat. Returns the conditions :func:`write_results` records; :func:`end` stops it."""
    stream = sys.stderr if stream is None else stream
    end()
    cpus, previous = os.cpu_count() or 1, torch.get_num_threads()
    if threads_flag:
        why = "the suite's --threads"
    elif os.environ.get("OMP_NUM_THREADS"):
        why = f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}"
    else:
        torch.set_num_threads(1)
        why = "pinned by attnkit bench (set OMP_NUM_THREADS=N to choose)"
    threads = torch.get_num_threads()
    load = load_1min()
    warning = busy_warning(load, threads, cpus)
    CONDITIONS.clear()
    CONDITIONS.update({"suite": suite, "threads": threads, "threads_set_by": why, "cpus": cpus,
                       "load_1min_start": load, "busy": warning is not None, "warning": warning})
    print(f"bench {suite}: {threads} torch thread(s) ({why}); 1-minute load {load} on {cpus} CPUs", file=stream,
          flush=True)
    if warning:
        print(f"bench {suite}: warning: {warning}", file=stream, flush=True)
    stop = threading.Event()
    start, calls = time.monotonic(), _timing.CALLS[0]

    def beat() -> None:
        while not stop.wait(HEARTBEAT_S):
            print(f"bench {suite}: running, {_timing.CALLS[0] - calls} timed calls so far "
                  f"({time.monotonic() - start:.0f} s, load {load_1min()})", file=stream, flush=True)

    thread = threading.Thread(target=beat, name=f"bench {suite} heartbeat", daemon=True)
    CONDITIONS["_stop"], CONDITIONS["_thread"], CONDITIONS["_previous_threads"] = stop, thread, previous
    thread.start()
    return CONDITIONS


def end() -> None:
    """Stop the running suite's heartbeat (if any) and give torch back the threads it had before :func:`begin`."""
    stop, thread = CONDITIONS.pop("_stop", None), CONDITIONS.pop("_thread", None)
    previous = CONDITIONS.pop("_previous_threads", None)
    if stop is not None:
        stop.set()
    if thread is not None:
        thread.join()  # a line it was printing lands before end() returns, never after
    if previous is not None:
        torch.set_num_threads(previous)


def conditions() -> dict:
    """What a results file records of the conditions it was measured in (the load read now is the end's)."""
    if not CONDITIONS:
        return {"threads": torch.get_num_threads(), "cpus": os.cpu_count() or 1, "load_1min_end": load_1min(),
                "threads_set_by": "not run through attnkit bench"}
    load = load_1min()
    record = {k: v for k, v in CONDITIONS.items() if not k.startswith("_")}
    return {**record, "load_1min_end": load,
            "busy": record["busy"] or busy_warning(load, record["threads"], record["cpus"]) is not None}


def peak_memory_bytes(fn: Callable[[], object], device: torch.device | str | None = None) -> int:
    """Peak memory allocated while ``fn`` runs: CUDA allocator stats on GPU; on CPU the peak of tensor
    allocations and frees recorded by PyTorch's profiler (tensor memory only)."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    current = peak = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        # ops report what they allocated themselves; "[memory]" events report frees (negative)
        current += event.cpu_memory_usage if event.name == "[memory]" else event.self_cpu_memory_usage
        peak = max(peak, current)
    return peak


def matmul_peak_gflops(dtype: torch.dtype = torch.float32, n: int = 1024, repeats: int = 5,
                       device: torch.device | str = "cpu") -> dict[str, float]:
    """Achieved GFLOP/s of ``torch.mm`` and of ``F.linear`` (oneDNN on CPU) on n x n matrices, measured now."""
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    t = round_robin({"mm": lambda: torch.mm(a, b), "linear": lambda: torch.nn.functional.linear(a, b)},
                    repeats, device=device)
    flops = 2 * n**3
    return {name: flops / seconds / 1e9 for name, seconds in t.items()}


def machine_info() -> dict:
    info = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "threads": torch.get_num_threads(), "cpu_capability": torch.backends.cpu.get_cpu_capability()}
    if torch.cuda.is_available():
        info["cuda_device"] = torch.cuda.get_device_name(0)
    return info


def versions() -> dict:
    import attnkit

    out = {"python": sys.version.split()[0], "torch": torch.__version__, "attnkit": attnkit.__version__}
    try:
        import transformers

        out["transformers"] = transformers.__version__
    except ImportError:
        pass
    return out


def check_name(name: str) -> str:
    """A results name is a plain file name (it never leaves the results folder): letters, digits, ``.``, ``_``, ``-``,
    starting with a letter or digit."""
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,100}", name) or ".." in name:
        raise AttnkitValueError(f"--name {name!r} must be a plain file name (letters, digits, '.', '_', '-'; no '/' or "
                                "'..'): the results are written as benchmarks/results/NAME.json; e.g. --name my_run.")
    return name


def write_results(name: str, payload: dict, results_dir: Path | str = RESULTS_DIR) -> Path:
    """Write ``{results_dir}/{name}.json`` with machine, versions and the command line added."""
    path = Path(results_dir) / f"{check_name(name)}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    program = "attnkit" if Path(sys.argv[0]).name in ("__main__.py", "attnkit") else Path(sys.argv[0]).name
    record = {"benchmark": name, "command": " ".join([program] + sys.argv[1:]) if sys.argv else "",
              "machine": machine_info(), "conditions": conditions(), "versions": versions(), **payload}
    path.write_text(json.dumps(record, indent=2))
    return path


def src_dir() -> Path:
    """The ``src/`` folder this attnkit is imported from (what a fresh process puts on PYTHONPATH to run it)."""
    import attnkit

    return Path(attnkit.__file__).resolve().parents[1]


def export_revision(rev: str, into: Path) -> Path:
    """``git archive REV src/attnkit`` of the checkout this attnkit comes from, unpacked into ``into``; returns the
    ``src/`` folder to put on PYTHONPATH (suites with ``--baseline REV`` run the old code beside the current one)."""
    archive = subprocess.run(["git", "-C", str(src_dir().parent), "archive", rev, "src/attnkit"], check=True,
                             capture_output=True).stdout
    Path(into).mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return Path(into) / "src"

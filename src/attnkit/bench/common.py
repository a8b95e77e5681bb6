"""What every benchmark suite shares: side-by-side timing, peak memory, the machine's matmul peak, and
recording results as JSON with the machine, versions and command.

Timings are medians over rounds in which the contenders run in a fresh random order, so machine noise and
cache pollution hit all of them alike; read ratios, not absolute numbers, on shared machines.
"""

from __future__ import annotations

import json
import platform
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from attnkit._timing import round_robin
from attnkit.errors import AttnkitValueError

RESULTS_DIR = Path("benchmarks") / "results"


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
              "machine": machine_info(), "versions": versions(), **payload}
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

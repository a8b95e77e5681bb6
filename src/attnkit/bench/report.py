"""``attnkit bench report``: size and time to interactive of the HTML report at 12 layers x 12 heads.

For each length N a 12-layer, 12-head model (the ``medium`` preset) writes its report on N random tokens (no
doctor), once with fresh weights (near-uniform attention: every weight a small non-zero byte, the hardest case
to compress) and once with the query/key projections scaled by ``--sharpen`` (peaked heads, like a trained model:
mostly zero bytes). Headless Chromium
opens each file from disk ``--loads`` times: time to interactive is the page's own ``performance.now()`` when it
has decoded its data and drawn the grid, the table and the first heatmap (from navigation start), median of the
loads. Also timed: writing the report in Python (``write_s``, ``report()`` alone: the model is built before),
each in a fresh process (median of ``--repeats``), and with ``--baseline REV`` the same call of attnkit as
committed at ``REV`` (its ``src/`` exported from git into a temporary folder), the two alternating in the same
run (``baseline_write_s``, ``speedup``); and the per-head metrics of one layer (``head_metrics``, float32
slabs) against the all-float64 path (``head_metrics_reference``) in this process, with their largest difference.
Results: ``benchmarks/results/report.json``. Needs selenium and Debian's chromium + chromium-driver
(``--no-browser`` times the writing only).
"""


from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from attnkit._progress import progress
from attnkit.bench.common import RESULTS_DIR, export_revision, src_dir, write_results

SUMMARY = "size and time to interactive of the HTML report in headless Chromium (12 layers x 12 heads)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--n", type=int, nargs="+", default=[128, 512, 2048])
    parser.add_argument("--preset", default="medium", help="12 layers x 12 heads by default")
    parser.add_argument("--loads", type=int, default=3, help="page loads per length (median)")
    parser.add_argument("--top-k", type=int, default=32)
    parser.add_argument("--dense-max", type=int, default=512)
    parser.add_argument("--sharpen", type=float, nargs="+", default=[1.0, 8.0],
                        help="scale factors of the q/k projections (1 = fresh weights)")
    parser.add_argument("--baseline", default=None, metavar="REV",
                        help="also time report() of attnkit at this git revision (e.g. main before a change)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="writes per length and code (median; baseline and current alternate)")
    parser.add_argument("--repeats-long", type=int, default=1, help="the same past --dense-max (minutes each)")
    parser.add_argument("--threads", type=int, nargs="+", default=[0],
                        help="torch threads of the writing processes (0: torch's default); 1 shows the work itself "
                             "on a loaded machine, where each parallel operation waits for its slowest thread")
    parser.add_argument("--no-browser", action="store_true", help="time the writing only (no page loads)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)


#: run in a fresh process with PYTHONPATH at one attnkit src/: build the model, time report() alone, print JSON
CHILD = """
import json, sys, time, torch
from attnkit.diagnostics.report import report
from attnkit.models.builders import build_lm
preset, n, sharpen, top_k, dense_max, max_len, threads, out = sys.argv[1:]
n, sharpen, top_k, dense_max, max_len, threads = int(n), float(sharpen), int(top_k), int(dense_max), int(max_len), int(threads)
if threads:
    torch.set_num_threads(threads)
torch.manual_seed(0)
model = build_lm(preset, max_seq_len=max_len).eval()
with torch.no_grad():
    for block in model.blocks:
        E = block.attn.num_heads * block.attn.head_dim
        block.attn.qkv_proj.weight[:2 * E].mul_(sharpen)  # q and k rows (MHA: Hkv = H)
tokens = torch.randint(0, 256, (1, n), generator=torch.Generator().manual_seed(n))
extra = {"max_tokens": n} if "max_tokens" in report.__code__.co_varnames else {}
report(model, tokens[:, :8], out=out, doctor=False)  # warm-up: first-call costs are not the report's
start, cpu = time.perf_counter(), time.process_time()
path = report(model, tokens, out=out, doctor=False, top_k=top_k, dense_max=dense_max, **extra)
print(json.dumps({"write_s": time.perf_counter() - start, "cpu_s": time.process_time() - cpu,
                  "bytes": path.stat().st_size}))
"""


def time_write(src: Path, args, n: int, sharpen: float, out: Path, threads: int = 0) -> dict:
    """``{"write_s", "bytes"}`` of report() on ``n`` tokens with attnkit from ``src``, in a fresh process."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    proc = subprocess.run([sys.executable, "-c", CHILD, args.preset, str(n), str(sharpen), str(args.top_k),
                           str(args.dense_max), str(max(args.n)), str(threads), str(out)], env=env, capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"report() with attnkit from {src} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _summary(runs: list[dict]) -> dict | None:
    """Medians of the runs of one code at one length (None when there are none)."""
    if not runs:
        return None
    return {"write_s": statistics.median(r["write_s"] for r in runs), "cpu_s": statistics.median(r["cpu_s"] for r in runs),
            "bytes": runs[-1]["bytes"], "runs": [r["write_s"] for r in runs]}


def time_metrics(n: int, heads: int = 12, repeats: int = 3) -> dict:
    """One causal layer ``(1, heads, n, n)``: head_metrics (float32 slabs) vs head_metrics_reference (float64),
    interleaved, medians; and the largest difference of any metric."""
    from attnkit.diagnostics.metrics import head_metrics, head_metrics_reference

    g = torch.Generator().manual_seed(0)
    allowed = torch.ones(n, n, dtype=torch.bool).tril()
    w = torch.softmax((torch.randn(1, heads, n, n, generator=g) * 3).masked_fill(~allowed, float("-inf")), -1)
    times: dict[str, list[float]] = {"fast": [], "reference": []}
    for _ in range(repeats):
        for name, fn in (("fast", head_metrics), ("reference", head_metrics_reference)):
            start = time.perf_counter()
            result = fn(w, allowed)
            times[name].append(time.perf_counter() - start)
            if name == "fast":
                fast = result
            else:
                ref = result
    diff = max(abs(a - b) for k in ("entropy", "norm_entropy", "max_prob", "sink_mass", "distance", "masked_mass")
               for a, b in zip(getattr(fast, k), getattr(ref, k)))
    fast_s, ref_s = statistics.median(times["fast"]), statistics.median(times["reference"])
    return {"n": n, "heads": heads, "head_metrics_s": fast_s, "head_metrics_reference_s": ref_s,
            "speedup": ref_s / fast_s, "max_abs_diff": diff}


def open_browser():
    import shutil

    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1500,1200"):
        options.add_argument(arg)
    options.binary_location = shutil.which("chromium") or shutil.which("chromium-browser") or ""
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    driver.set_page_load_timeout(600)
    return driver


def time_to_interactive(driver, path: Path) -> float:
    """Milliseconds from navigation start to the page's ready signal (``window.attnkit.tti_ms``)."""
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get("about:blank")
    driver.get(path.resolve().as_uri())
    WebDriverWait(driver, 600, poll_frequency=0.05).until(lambda d: d.execute_script("return document.body.dataset.ready"))
    if driver.execute_script("return document.body.dataset.ready") != "1":
        raise RuntimeError(driver.find_element("id", "error").text)
    return float(driver.execute_script("return window.attnkit.tti_ms"))


def run(args: argparse.Namespace) -> int:
    from attnkit.models.builders import build_lm

    rows, metric_rows = [], []
    config = build_lm(args.preset).config
    driver = None if args.no_browser else open_browser()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            baseline = export_revision(args.baseline, tmp) if args.baseline else None
            for threads, sharpen, n in progress([(t, s, n) for t in args.threads for s in args.sharpen for n in args.n],
                                                desc="bench report", unit="case"):
                path = tmp / f"report_{n}.html"
                olds, news = [], []
                for _ in range(args.repeats if n <= args.dense_max else args.repeats_long):
                    if baseline is not None:
                        olds.append(time_write(baseline, args, n, sharpen, tmp / f"baseline_{n}.html", threads))
                    news.append(time_write(src_dir(), args, n, sharpen, path, threads))
                new, old = _summary(news), _summary(olds)
                pages = driver is not None and threads == args.threads[0]  # the page does not depend on the threads
                ttis = [time_to_interactive(driver, path) for _ in range(args.loads)] if pages else []
                row = {"n": n, "threads": threads or torch.get_num_threads(), "layers": config.num_layers,
                       "heads": config.num_heads, "qk_scale": sharpen, "bytes": new["bytes"],
                       "rows": "dense" if n <= args.dense_max else f"top-{args.top_k} per row",
                       "tti_ms_median": statistics.median(ttis) if ttis else None, "tti_ms": ttis,
                       "write_s": new["write_s"], "write_s_runs": new["runs"], "cpu_s": new["cpu_s"]}
                line = (f"N={n:5d} q/k x{sharpen:g} threads {row['threads']}: {row['bytes'] / 2**20:7.2f} MiB, "
                        f"{row['rows']}, written in {new['write_s']:.1f} s (median of {len(news)})")
                if baseline is not None:
                    row.update(baseline=args.baseline, baseline_write_s=old["write_s"],
                               baseline_write_s_runs=old["runs"], baseline_cpu_s=old["cpu_s"], baseline_bytes=old["bytes"],
                               speedup=old["write_s"] / new["write_s"], cpu_speedup=old["cpu_s"] / new["cpu_s"])
                    line += (f" (baseline {args.baseline}: {old['write_s']:.1f} s, {row['speedup']:.1f}x faster; "
                             f"CPU time {row['cpu_speedup']:.1f}x less)")
                if ttis:
                    line += f", time to interactive {row['tti_ms_median']:.0f} ms (median of {args.loads})"
                rows.append(row)
                print(line, flush=True)
        for n in args.n:
            metric_rows.append(time_metrics(n, heads=config.num_heads))
            m = metric_rows[-1]
            print(f"metrics of one layer ({m['heads']} heads, N={n}): {m['head_metrics_s']:.2f} s vs float64 "
                  f"{m['head_metrics_reference_s']:.2f} s ({m['speedup']:.1f}x), max difference {m['max_abs_diff']:.1e}",
                  flush=True)
    finally:
        if driver is not None:
            driver.quit()
    browser = None if driver is None else "headless Chromium " + (driver.capabilities.get("browserVersion", "?")
                                                                  if driver.capabilities else "?")
    path = write_results("report", {"preset": args.preset, "browser": browser, "top_k": args.top_k,
                                    "dense_max": args.dense_max, "baseline": args.baseline, "rows": rows,
                                    "metrics": metric_rows,
                                    "note": "shared 2-core machine (other agents running): compare the ratios. "
                                            "write_s / baseline_write_s: report() alone in a fresh process each, "
                                            "alternating; time to interactive = the page's performance.now() when "
                                            "decoded and drawn, from navigation start, median of the loads."},
                         args.out)
    print(f"wrote {path}")
    return 0

"""``attnkit bench report``: size and time to interactive of the HTML report at 12 layers x 12 heads.

For each length N a 12-layer, 12-head model (the ``medium`` preset) writes its report on N random tokens (no
doctor), once with fresh weights (near-uniform attention: every weight a small non-zero byte, the hardest case
to compress) and once with the query/key projections scaled by ``--sharpen`` (peaked heads, like a trained model:
mostly zero bytes). Headless Chromium
opens each file from disk ``--loads`` times: time to interactive is the page's own ``performance.now()`` when it
has decoded its data and drawn the grid, the table and the first heatmap (from navigation start), median of the
loads. Also timed: writing the report in Python.
Results: ``benchmarks/results/report.json``. Needs selenium and Debian's chromium + chromium-driver.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from attnkit.bench.common import RESULTS_DIR, write_results


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--n", type=int, nargs="+", default=[128, 512, 2048])
    parser.add_argument("--preset", default="medium", help="12 layers x 12 heads by default")
    parser.add_argument("--loads", type=int, default=3, help="page loads per length (median)")
    parser.add_argument("--top-k", type=int, default=32)
    parser.add_argument("--dense-max", type=int, default=512)
    parser.add_argument("--sharpen", type=float, nargs="+", default=[1.0, 8.0],
                        help="scale factors of the q/k projections (1 = fresh weights)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)


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
    from attnkit.diagnostics.report import report
    from attnkit.models.builders import build_lm

    rows = []
    driver = open_browser()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for sharpen in args.sharpen:
                torch.manual_seed(0)
                model = build_lm(args.preset, max_seq_len=max(args.n)).eval()
                config = model.config
                with torch.no_grad():
                    for block in model.blocks:
                        E = block.attn.num_heads * block.attn.head_dim
                        block.attn.qkv_proj.weight[:2 * E].mul_(sharpen)  # q and k rows (MHA: Hkv = H)
                for n in args.n:
                    tokens = torch.randint(0, 256, (1, n))
                    start = time.perf_counter()
                    path = report(model, tokens, out=Path(tmp) / f"report_{n}.html", doctor=False, top_k=args.top_k,
                                  dense_max=args.dense_max)
                    write_s = time.perf_counter() - start
                    ttis = [time_to_interactive(driver, path) for _ in range(args.loads)]
                    row = {"n": n, "layers": config.n_layers, "heads": config.n_heads, "qk_scale": sharpen,
                           "bytes": path.stat().st_size,
                           "rows": "dense" if n <= args.dense_max else f"top-{args.top_k} per row",
                           "tti_ms_median": statistics.median(ttis), "tti_ms": ttis, "write_s": write_s}
                    rows.append(row)
                    print(f"N={n:5d} q/k x{sharpen:g}: {row['bytes'] / 2**20:7.2f} MiB, {row['rows']}, time to "
                          f"interactive {row['tti_ms_median']:.0f} ms (median of {args.loads}), written in "
                          f"{write_s:.1f} s", flush=True)
                del model
    finally:
        driver.quit()
    browser = "headless Chromium " + (driver.capabilities.get("browserVersion", "?") if driver.capabilities else "?")
    path = write_results("report", {"preset": args.preset, "browser": browser, "top_k": args.top_k,
                                    "dense_max": args.dense_max, "rows": rows,
                                    "note": "shared 2-core machine; time to interactive = the page's performance.now() "
                                            "when decoded and drawn, from navigation start, median of the loads."},
                         args.out)
    print(f"wrote {path}")
    return 0

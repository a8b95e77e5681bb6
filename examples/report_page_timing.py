"""Time the report page in headless Chromium against another attnkit checkout, side by side in one browser.

    PYTHONPATH=src python examples/report_page_timing.py --baseline-src /path/to/other/attnkit/src [--tokens 2048]

Writes the report of the same model (the `nano` preset widened to 4 layers x 12 heads, fresh weights, seed 0) on the
same text with each checkout's code (each in its own process), then opens the two pages alternately (5 rounds) and
prints, per page, the median time to interactive (data decoded, grid, table and first heatmap drawn) and the median
time to open a head (decode + heatmap + head view).
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

WRITE = """
import sys, warnings, torch, attnkit as ak
from attnkit.models.lm import LMConfig, TransformerLM
warnings.simplefilter("ignore")
torch.manual_seed(0)
# the old field names: from_dict reads them on both sides (a baseline from before the LMConfig rename included)
config = LMConfig.from_dict({"dim": 96, "n_layers": 4, "n_heads": 12, "max_seq_len": 4096})  # rename-lmconfig: skip
model = TransformerLM(config).eval()
text = ("The quick brown fox jumps over the lazy dog. " * 100)[:int(sys.argv[1])]
ak.diagnostics.report(model, text, out=sys.argv[2], doctor=False)
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline-src", required=True)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    folder = Path(tempfile.mkdtemp())
    here = str(Path(__file__).resolve().parents[1] / "src")
    pages = {}
    for name, src in (("baseline", args.baseline_src), ("this", here)):
        pages[name] = folder / f"{name}.html"
        subprocess.run([sys.executable, "-c", WRITE, str(args.tokens), str(pages[name])], check=True,
                       env={**os.environ, "PYTHONPATH": src, "OMP_NUM_THREADS": "1"})
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait

    options = Options()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000"):
        options.add_argument(arg)
    options.binary_location = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    times = {name: {"tti": [], "open": []} for name in pages}
    try:
        for _ in range(args.rounds):
            for name, page in pages.items():
                driver.get("about:blank")
                driver.get(page.resolve().as_uri())
                WebDriverWait(driver, 120, poll_frequency=0.02).until(
                    lambda d: d.execute_script("return document.body.dataset.ready || null"))
                times[name]["tti"].append(driver.execute_script("return window.attnkit.tti_ms"))
                times[name]["open"].append(driver.execute_script(
                    "const t = performance.now(); for (let h = 0; h < 4; h++) window.attnkit.open(1, h);"
                    "return (performance.now() - t) / 4;"))
    finally:
        driver.quit()
    for name, t in times.items():
        print(f"{name}: {args.tokens} tokens, {pages[name].stat().st_size / 2**20:.2f} MiB, time to interactive "
              f"{statistics.median(t['tti']):.0f} ms, open a head {statistics.median(t['open']):.0f} ms "
              f"(medians of {args.rounds})")


if __name__ == "__main__":
    main()

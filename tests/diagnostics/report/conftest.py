"""Shared fixtures of the report tests: a small GQA model, its report, the math-backend oracle, a headless browser."""

import json
import os
import re
import shutil
from pathlib import Path

import pytest
import torch

import attnkit as ak
from attnkit.diagnostics.report.encode import decode_blob
from attnkit.models.builders import build_lm

TEXT = "Attention, please: look here!"
ARTIFACTS = Path(os.environ.get("ATTNKIT_ARTIFACTS", Path(__file__).resolve().parents[3] / "build" / "test-artifacts"))


def small_model(**overrides):
    """3 layers, 4 query heads sharing 2 KV heads (GQA), auto backend (SDPA: the weights are recomputed)."""
    torch.manual_seed(0)
    model = build_lm("nano", num_layers=3, num_heads=4, num_kv_heads=2, **overrides).eval()
    with torch.no_grad():  # sharper than init so the heads differ visibly
        for block in model.blocks:
            block.attn.qkv_proj.weight.mul_(12)
    return model


def math_weights(model, tokens) -> list[torch.Tensor]:
    """The oracle: each attention module re-run on its own inputs with backend="math", return_weights=True.
    Returns one ``(H, L, L)`` tensor per layer."""
    calls = []

    def hook(module, args, kwargs, output):
        calls.append((module, args, kwargs))

    handles = [b.attn.register_forward_hook(hook, with_kwargs=True) for b in model.blocks]
    with torch.no_grad():
        model(tokens)
    for h in handles:
        h.remove()
    out = []
    with torch.no_grad():
        for module, args, kwargs in calls:
            saved, module.backend = module.backend, "math"
            try:
                _, weights = module(*args, **kwargs, return_weights=True)
            finally:
                module.backend = saved
            out.append(weights[0].double())  # (H, L, L)
    return out


def read_page(page: str) -> tuple[dict, bytes]:
    meta = json.loads(re.search(r'id="ak-meta">(.*?)</script>', page, re.S).group(1).replace("<\\/", "</"))
    blob = decode_blob(re.search(r'id="ak-blob">(.*?)</script>', page, re.S).group(1))
    return meta, blob


@pytest.fixture(scope="session")
def small_report(tmp_path_factory):
    model = small_model()
    doctor = ak.doctor.examine(model, checks=["scale", "causal-leak"], fresh=True).to_dict()
    path = ak.diagnostics.report(model, TEXT, out=tmp_path_factory.mktemp("report") / "small.html", doctor=doctor)
    return model, path


def _browser_missing() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    if shutil.which("chromedriver") is None:
        return ("chromedriver is not on PATH: install Debian's chromium and chromium-driver "
                "(scripts/install-test-browser.sh, run by `make test` as root)")
    if shutil.which("chromium") is None and shutil.which("chromium-browser") is None:
        return "chromium is not on PATH: install Debian's chromium package"
    return None


@pytest.fixture(scope="session")
def browser():
    why = _browser_missing()
    if why:
        pytest.skip(f"no headless browser: {why}")
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1500,1200",
                "--disable-background-networking", "--disable-component-update", "--no-first-run"):
        options.add_argument(arg)
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    options.binary_location = binary
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    driver.set_page_load_timeout(120)
    yield driver
    driver.quit()


def load(driver, path, timeout: float = 120.0) -> None:
    """Open a report from disk and wait until its script says it is ready (or failed)."""
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get_log("browser")  # drop earlier messages
    driver.get_log("performance")
    driver.get(Path(path).resolve().as_uri())
    WebDriverWait(driver, timeout, poll_frequency=0.05).until(
        lambda d: d.execute_script("return document.body.dataset.ready || null"))
    assert driver.execute_script("return document.body.dataset.ready") == "1", driver.find_element("id", "error").text

"""Issue 22 item 3: the report where people look. ``report(...)`` returns an object Jupyter displays inline (the same
self-contained page in a sandboxed iframe), and examples/report_in_jupyter.ipynb runs in a real Jupyter kernel
(nbclient + ipykernel) with its output page checked in headless Chromium."""

import html
import re
from pathlib import Path

import pytest

import attnkit as ak
from attnkit.diagnostics.report.display import ReportFile, ReportPage
from attnkit.models.builders import build_lm
from conftest import ARTIFACTS

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")
NOTEBOOK = Path(__file__).resolve().parents[3] / "examples" / "report_in_jupyter.ipynb"


def _srcdoc(output_html: str) -> str:
    frame = re.fullmatch(r'<iframe class="attnkit-report" sandbox="allow-scripts" [^>]*srcdoc="([^"]*)"></iframe>',
                         output_html)
    assert frame, output_html[:300]
    return html.unescape(frame.group(1))


def test_the_returned_path_and_page_display_the_same_page_inline(tmp_path):
    model = build_lm("nano").eval()
    path = ak.diagnostics.report(model, "hello", out=tmp_path / "r.html", doctor=False)
    assert isinstance(path, ReportFile) and isinstance(path, Path) and path == tmp_path / "r.html"
    assert _srcdoc(path._repr_html_()) == path.read_text()
    page = ak.diagnostics.report(model, "hello", out=None, doctor=False)
    assert isinstance(page, ReportPage) and isinstance(page, str) and page.startswith("<!DOCTYPE html>")
    assert _srcdoc(page._repr_html_()) == page
    assert "allow-same-origin" not in page._repr_html_()  # the page's script cannot reach the notebook


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """The example notebook run top to bottom in a real kernel: ``(notebook, its folder)``."""
    nbformat = pytest.importorskip("nbformat", reason="pip install -e '.[test]' (nbformat, nbclient, ipykernel)")
    nbclient = pytest.importorskip("nbclient", reason="pip install -e '.[test]' (nbclient, ipykernel)")
    pytest.importorskip("ipykernel", reason="pip install -e '.[test]' (ipykernel)")
    folder = tmp_path_factory.mktemp("notebook")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(folder)}}).execute()
    return nb, folder


def _shown(nb) -> list[str]:
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    return [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})]


def test_the_example_notebook_runs_in_a_kernel_and_displays_the_page(executed):
    nb, folder = executed
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    shown = _shown(nb)
    assert len(shown) == 1
    assert _srcdoc(shown[0]) == (folder / "notebook_report.html").read_text()
    printed = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    loss = float(re.search(r"loss after 40 steps: (\d+\.\d+)", printed).group(1))
    assert loss < 2.0  # the sentence was learned: the comparison shows a trained vs an untrained model


def test_the_notebooks_output_page_works_in_chromium(executed, browser, tmp_path):
    shown = _shown(executed[0])
    # the output as a notebook shows it: the iframe inside a host page
    host = tmp_path / "notebook_output.html"
    host.write_text(f"<!DOCTYPE html><html><head><meta charset='utf-8'></head><body>{shown[0]}</body></html>")
    browser.set_window_size(1400, 1000)
    browser.get_log("browser")  # drop earlier tests' messages
    browser.get(host.resolve().as_uri())
    from selenium.webdriver.support.ui import WebDriverWait

    browser.switch_to.frame(browser.find_element("css selector", "iframe.attnkit-report"))
    try:
        WebDriverWait(browser, 120, poll_frequency=0.05).until(
            lambda d: d.execute_script("return document.body && document.body.dataset.ready || null"))
        assert browser.execute_script("return document.body.dataset.ready") == "1", \
            browser.find_element("id", "error").text
        assert len(browser.find_elements("css selector", "canvas.thumb")) == 2 * 2
        assert browser.find_element("css selector", "#compare-section h2").text == \
            "Comparison: after 40 steps vs before training"
        assert browser.find_elements("css selector", "#headview line")
        assert len(browser.find_elements("css selector", "#importance td[data-score]")) == 2 * 2
        assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0
    finally:
        browser.switch_to.default_content()
    severe = [m for m in browser.get_log("browser") if m["level"] in ("SEVERE", "ERROR")]
    assert severe == []
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "report_notebook.png"))

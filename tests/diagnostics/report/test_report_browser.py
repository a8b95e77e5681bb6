"""The HTML report in a real headless browser (Debian chromium + chromedriver through Selenium): it loads from disk
with no console errors and no network request, shows every head, opens the clicked head, highlights the hovered
token's row and column, sorts the metrics table, and shows the weights of the math backend to the quantisation step.
A screenshot is saved under build/test-artifacts/ (or $ATTNKIT_ARTIFACTS)."""

import json

import numpy as np
import pytest

from attnkit.diagnostics.report import tokenize
from attnkit.diagnostics.report.encode import STEP
from conftest import ARTIFACTS, TEXT, load, math_weights

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")


@pytest.fixture
def page(browser, small_report):
    _, path = small_report
    load(browser, path)
    return browser


def _severe(logs):
    return [m for m in logs if m["level"] in ("SEVERE", "ERROR")]


def test_loads_without_console_errors_or_network(page, small_report):
    _, path = small_report
    assert _severe(page.get_log("browser")) == []
    requests = [json.loads(e["message"])["message"] for e in page.get_log("performance")]
    urls = [m["params"]["request"]["url"] for m in requests if m["method"] == "Network.requestWillBeSent"]
    assert all(u.startswith("file://") and u.endswith(path.name) for u in urls), urls
    assert page.execute_script("return performance.getEntriesByType('resource').length") == 0
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.save_screenshot(str(ARTIFACTS / "report_small.png"))
    assert (ARTIFACTS / "report_small.png").stat().st_size > 10_000


def test_grid_shows_every_head_grouped_by_kv_head(page):
    thumbs = page.find_elements("css selector", "canvas.thumb")
    seen = {(int(t.get_attribute("data-layer")), int(t.get_attribute("data-head"))) for t in thumbs if t.is_displayed()}
    assert seen == {(l, h) for l in range(3) for h in range(4)}
    groups = page.find_elements("css selector", ".layer-row[data-layer='1'] .kv-group")
    assert [[int(c.get_attribute("data-head")) for c in g.find_elements("css selector", "canvas")] for g in groups] \
        == [[0, 1], [2, 3]]


def test_click_opens_the_right_heatmap(page, small_report):
    model, _ = small_report
    page.find_element("css selector", "canvas.thumb[data-layer='2'][data-head='3']").click()
    heat = page.find_element("id", "heatmap")
    assert (heat.get_attribute("data-layer"), heat.get_attribute("data-head")) == ("2", "3")
    assert page.find_element("id", "viewer-title").text.startswith("layer 2 (blocks.2.attn, full (causal)), head 3, kv head 1")
    # the drawn pixels are that head's: in each row the darkest allowed pixel is the key with the largest weight
    tokens, _ = tokenize(model, TEXT)
    w = math_weights(model, tokens)[2][3].numpy()
    page.find_element("id", "scale").send_keys("p")  # linear colour scale: darker = larger
    L = w.shape[0]
    lum = np.array(page.execute_script("""
        const c = document.getElementById('heatmap'), d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        const out = [];
        for (let p = 0; p < d.length; p += 4) out.push(d[p] + d[p + 1] + d[p + 2]);
        return out;""")).reshape(L, L)
    checked = 0
    for i in range(1, L):
        row = w[i, :i + 1]
        top2 = np.sort(row)[-2:]
        if top2[1] - top2[0] > 4 * STEP:  # a clear winner after quantisation
            assert lum[i, :i + 1].argmin() == row.argmax(), f"row {i}"
            checked += 1
    assert checked >= L // 3


def test_hover_highlights_the_tokens_row_and_column(page):
    from selenium.webdriver.common.action_chains import ActionChains

    i = 7
    ActionChains(page).move_to_element(page.find_element("css selector", f"#tokens .tok[data-i='{i}']")).perform()
    overlay = page.find_element("id", "overlay")
    assert (overlay.get_attribute("data-row"), overlay.get_attribute("data-col")) == (str(i), str(i))
    alpha = page.execute_script("""
        const c = document.getElementById('overlay'), L = window.attnkit.L, cell = c.width / L;
        const a = (x, y) => c.getContext('2d').getImageData(Math.floor(x), Math.floor(y), 1, 1).data[3];
        const mid = (k) => (k + 0.5) * cell;
        return {row: a(mid(2), mid(arguments[0])), col: a(mid(arguments[0]), mid(L - 2)),
                other: a(mid(2), mid(arguments[0] + 3))};""", i)
    assert alpha["row"] > 0 and alpha["col"] > 0 and alpha["other"] == 0, alpha
    assert "hovered" in page.find_element("css selector", f"#tokens .tok[data-i='{i}']").get_attribute("class")


def test_hover_on_a_cell_reports_its_weight_or_the_mask(page):
    from selenium.webdriver.common.action_chains import ActionChains

    heat = page.find_element("id", "heatmap")
    size = heat.size["width"]
    L = page.execute_script("return window.attnkit.L")
    cell = size / L
    # above the diagonal (key after query): forbidden by the causal mask
    ActionChains(page).move_to_element_with_offset(heat, int(-size / 2 + 1.5 * cell), int(-size / 2 + 0.5 * cell)) \
        .perform()
    assert "forbidden by the mask" in page.find_element("id", "tooltip").text
    ActionChains(page).move_to_element_with_offset(heat, int(-size / 2 + 0.5 * cell), int(-size / 2 + 4.5 * cell)) \
        .perform()
    assert page.find_element("id", "tooltip").text.startswith("query 4 ")
    assert "-> key 0 " in page.find_element("id", "tooltip").text and "p = " in page.find_element("id", "tooltip").text


def test_metrics_table_sorts(page):
    header = page.find_element("css selector", "#metrics th[data-key='sink_mass']")
    col = [th.get_attribute("data-key") for th in page.find_elements("css selector", "#metrics th")].index("sink_mass")

    def column():
        return [float(tr.find_elements("css selector", "td")[col].text)
                for tr in page.find_elements("css selector", "#metrics tbody tr")]

    before = column()
    header.click()
    asc = column()
    header.click()
    desc = column()
    assert asc == sorted(before) and desc == sorted(before, reverse=True) and asc != desc
    assert len(asc) == 12


def test_filter_hides_heads(page):
    page.find_element("id", "filter-layers").send_keys("1")
    page.find_element("id", "filter-heads").send_keys("0,2-3")
    shown = [(t.get_attribute("data-layer"), t.get_attribute("data-head"))
             for t in page.find_elements("css selector", "canvas.thumb") if t.is_displayed()]
    assert shown == [("1", "0"), ("1", "2"), ("1", "3")]
    assert page.find_element("id", "filter-count").text == "3 of 12 heads shown"
    assert len([tr for tr in page.find_elements("css selector", "#metrics tbody tr") if tr.is_displayed()]) == 3


def test_browser_shows_math_backend_weights(page, small_report):
    model, _ = small_report
    tokens, _ = tokenize(model, TEXT)
    golden = math_weights(model, tokens)
    L = tokens.shape[1]
    for l, h in ((0, 0), (1, 3), (2, 1)):
        shown = np.array(page.execute_script(
            "const a = window.attnkit, L = a.L, out = [];"
            "for (let i = 0; i < L; i++) for (let j = 0; j < L; j++) out.push(a.weight(arguments[0], arguments[1], i, j));"
            "return out;", l, h)).reshape(L, L)
        err = float(np.abs(shown - golden[l][h].numpy()).max())
        assert err <= 0.5 * STEP + 1e-6, f"layer {l} head {h}: max |shown - math| {err:.3g} > {0.5 * STEP:.3g}"


def test_doctor_section_lists_the_checks(page):
    statuses = [td.text for td in page.find_elements("css selector", "#doctor tbody td:first-child")]
    names = [td.text for td in page.find_elements("css selector", "#doctor tbody td:nth-child(2)")]
    assert names == ["causal-leak", "scale"] and statuses == ["PASS", "PASS"]


def test_committed_example_report_loads(browser):
    from pathlib import Path

    example = Path(__file__).resolve().parents[3] / "docs" / "report_example.html"
    load(browser, example)
    assert _severe(browser.get_log("browser")) == []
    assert len(browser.find_elements("css selector", "canvas.thumb")) == 6 * 12  # MiniLM: 6 layers x 12 heads
    assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0

"""issue 29 item 4: `report --generate N`: for each new token, which earlier tokens the query that produced it
attended to, across layers and heads, within the page's size budget; checked against the attention of the decoding
step itself (a forward of the prefix), and in headless Chromium on `tiny` and an HF LLaMA (no console errors)."""

import numpy as np
import pytest
import torch

from attnkit.cli.main import main
from attnkit.diagnostics import capture
from attnkit.diagnostics.report import report
from attnkit.diagnostics.report.encode import STEP
from attnkit.diagnostics.report.generated import collect_generated, decode_rows, greedy
from attnkit.errors import AttnkitValueError
from attnkit.models.builders import build_lm
from conftest import ARTIFACTS, load, read_page

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")
PROMPT = torch.tensor([[100, 101, 102, 32, 102, 111, 114]])  # "def for"


def _model():
    torch.manual_seed(0)
    return build_lm("nano", num_layers=2, num_heads=4, num_kv_heads=2).eval()


def test_each_step_is_the_decoding_steps_own_attention():
    """Row s of layer l = the last row of a forward of the first P + s tokens (what the step that produced new token s
    computed), for every head; the new tokens are the greedy ones."""
    model, n = _model(), 6
    gen = collect_generated(model, PROMPT, n, str)
    P = PROMPT.shape[1]
    assert gen.tokens == greedy(model, PROMPT, n)[0].tolist() and gen.steps == n
    for s in range(n):
        prefix = torch.tensor([gen.tokens[:P + s]])
        with torch.no_grad(), capture(model, rows=[-1]) as cap:
            model(prefix)
        for l, record in enumerate(cap.records):
            step = record.weights[0, :, 0]  # (H, P + s)
            got = gen.rows[l][:, s]  # (H, K)
            assert torch.allclose(got[:, :P + s], step, atol=1e-6, rtol=0), (s, l)
            assert (got[:, P + s:] == 0).all()  # keys after the query: never attended


def test_the_page_holds_the_rows_within_a_step_and_the_budget_switches_to_top_k(tmp_path):
    model = _model()
    page = str(report(model, "def for", out=None, doctor=False, generate=8))
    meta, blob = read_page(page)
    g = meta["generated"]
    assert (g["P"], g["N"], g["K"]) == (7, 8, 14) and g["sparse_top_k"] is None
    assert 'id="generated-section"' in page
    gen = collect_generated(model, PROMPT, 8, str)
    for l, layer in enumerate(g["layers"]):
        for h, head in enumerate(layer["heads"]):
            shown = decode_rows(blob, head, g["N"], g["K"])
            assert np.abs(shown - gen.rows[l][h].numpy()).max() <= STEP / 2 + 1e-9
    from attnkit.diagnostics.report.encode import Buffer
    from attnkit.diagnostics.report.generated import encode_generated

    sparse = encode_generated(Buffer(), gen, budget=100, top_k=3)
    assert sparse["sparse_top_k"] == 3 and sparse["layers"][0]["heads"][0]["fmt"] == "topk"


def test_generate_refusals_arrive_before_anything_runs(tmp_path, capsys):
    from attnkit.models.builders import build_encoder

    with pytest.raises(AttnkitValueError, match="needs a causal language model"):
        report(build_encoder("nano").eval(), [5, 6, 7], out=None, doctor=False, generate=4)
    with pytest.raises(AttnkitValueError, match="more than max_tokens=10"):
        report(_model(), "def for", out=None, doctor=False, generate=4, max_tokens=10)
    with pytest.raises(AttnkitValueError, match="generate must be a positive int"):
        report(_model(), "def for", out=None, doctor=False, generate=0)
    assert main(["report", "tiny", "--generate", "0", "--no-doctor", "--out", str(tmp_path / "x.html")]) == 2
    assert "--generate must be >= 1" in capsys.readouterr().err
    assert not (tmp_path / "x.html").exists()


@pytest.mark.parametrize("target, args", [("tiny", ["--text", "def forward(self"]),
                                          ("hf-llama-tiny", ["--ids", "--text", "5 9 12 30 5 9"])])
def test_generate_32_in_headless_chromium(browser, tmp_path, target, args):
    if target.startswith("hf-"):
        pytest.importorskip("transformers")
    out = tmp_path / f"{target}.html"
    assert main(["report", target, *args, "--generate", "32", "--no-doctor", "--out", str(out)]) == 0
    meta, blob = read_page(out.read_text())
    load(browser, out)
    assert [m for m in browser.get_log("browser") if m["level"] in ("SEVERE", "ERROR")] == []
    g = browser.execute_script("return window.attnkit.generated && {N: window.attnkit.generated.N, "
                               "P: window.attnkit.generated.P}")
    assert g == {"N": 32, "P": meta["generated"]["P"]}
    new = browser.find_elements("css selector", "#gen-tokens .gen-token")
    assert len(new) == 32
    new[5].click()
    assert browser.execute_script("return window.attnkit.generated.state.step") == 5
    assert "step 5:" in browser.find_element("id", "gen-facts").text
    # the weights the page decodes are the file's, to the stored step
    head = meta["generated"]["layers"][1]["heads"][0]
    rows = decode_rows(blob, head, 32, meta["generated"]["K"])
    got = browser.execute_script("const g = window.attnkit.generated; return Array.from({length: g.K}, "
                                 "(_, j) => g.weight(1, 0, 5, j))")
    assert np.abs(np.array(got) - rows[5]).max() < 1e-6
    browser.execute_script("window.attnkit.generated.choose(1, 0)")
    shade = browser.execute_script("return Array.from(document.querySelectorAll('#gen-tokens .tok')).map("
                                   "t => t.style.background)")
    P = meta["generated"]["P"]
    assert all(shade[j] == "" for j in range(P + 5, len(shade)))  # nothing after the query is shaded
    assert any(shade[j] for j in range(P + 5))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    browser.find_element("id", "generated-section").screenshot(str(ARTIFACTS / f"report_generate_{target}.png"))

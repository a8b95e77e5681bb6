"""The report's numbers without a browser: the weights it embeds equal the math backend's return_weights to the
quantisation step, top-k rows state their remaining mass, masks and metrics are the ones attnkit computes."""

import math
import re

import numpy as np
import pytest
import torch

import attnkit as ak
from attnkit.diagnostics.report import byte_label, tokenize
from attnkit.diagnostics.report.collect import prev_token_score
from attnkit.diagnostics.report.encode import STEP, decode_head
from attnkit.errors import AttnkitTypeError, AttnkitValueError
from conftest import TEXT, math_weights, read_page, small_model

HALF_STEP = 0.5 * STEP + 1e-6  # rounding to the nearest multiple of 1/255 (float32 recomputation: + 1e-6)


def test_embedded_weights_equal_math_backend_return_weights(small_report):
    model, path = small_report
    meta, blob = read_page(path.read_text())
    tokens, _ = tokenize(model, TEXT)
    oracle = math_weights(model, tokens)
    assert len(meta["layers"]) == len(oracle) == 3 and meta["L"] == tokens.shape[1]
    for l, (layer, golden) in enumerate(zip(meta["layers"], oracle)):
        assert layer["H"] == 4 and layer["Hkv"] == 2
        for h, head in enumerate(layer["heads"]):
            shown = decode_head(blob, head, meta["L"])
            err = float(np.abs(shown - golden[h].numpy()).max())
            assert err <= HALF_STEP, f"layer {l} head {h}: max |shown - math| = {err:.3g} > half step {HALF_STEP:.3g}"


def test_weights_not_trivially_equal_across_heads(small_report):
    """Guard against a test that cannot fail: the heads differ by much more than the quantisation step."""
    model, path = small_report
    meta, blob = read_page(path.read_text())
    a, b = (decode_head(blob, meta["layers"][0]["heads"][h], meta["L"]) for h in (0, 1))
    assert np.abs(a - b).max() > 20 * STEP


def test_mask_bits_are_the_causal_mask(small_report):
    _, path = small_report
    meta, blob = read_page(path.read_text())
    L = meta["L"]
    assert len(meta["masks"]) == 1, "the causal mask is shared by every layer and head (deduplicated)"
    offset, n = meta["masks"][0]
    bits = np.unpackbits(np.frombuffer(blob[offset:offset + n], np.uint8), bitorder="big")[:L * L].reshape(L, L)
    assert (bits == np.tril(np.ones((L, L), np.uint8))).all()


def test_metrics_and_verdicts_match_head_metrics(small_report):
    model, path = small_report
    meta, _ = read_page(path.read_text())
    tokens, _ = tokenize(model, TEXT)
    golden = math_weights(model, tokens)
    L = tokens.shape[1]
    allowed = torch.ones(L, L, dtype=torch.bool).tril()
    for l, w in enumerate(golden):
        m = ak.diagnostics.head_metrics(w[None].float(), allowed)
        rows = [r for r in meta["table"] if r["layer"] == l]
        assert [r["head"] for r in rows] == [0, 1, 2, 3] and [r["kv"] for r in rows] == [0, 0, 1, 1]
        for r in rows:
            h = r["head"]
            for key in ("entropy", "sink_mass", "distance", "max_prob"):
                assert r[key] == pytest.approx(getattr(m, key)[h], abs=1e-4), (l, h, key)
            assert r["masked_mass"] == 0.0
            assert r["verdict"] == m.verdicts()[h]
            # previous-token score: mean over rows 1..L-1 of p[i, i-1]
            assert r["prev_token"] == pytest.approx(float(torch.diagonal(w[h], -1).mean()), abs=1e-4)


def test_prev_token_score_on_a_shift_head():
    L = 6
    shift = torch.zeros(1, L, L)
    shift[0, 0, 0] = 1.0
    shift[0, torch.arange(1, L), torch.arange(L - 1)] = 1.0  # every query attends to its previous token
    assert prev_token_score(shift, torch.ones(1, L, L, dtype=torch.bool).tril()) == [1.0]
    assert prev_token_score(torch.eye(L)[None], None) == [0.0]
    assert math.isnan(prev_token_score(torch.ones(1, 1, 1), None)[0])


def test_long_sequences_keep_top_k_per_row_and_state_the_rest(tmp_path):
    model = small_model()
    tokens = torch.randint(0, 256, (1, 40))
    page = ak.diagnostics.report(model, tokens, out=None, doctor=False, dense_max=16, top_k=5)
    meta, blob = read_page(page)
    golden = math_weights(model, tokens)
    assert meta["sparse_top_k"] == 5
    head = meta["layers"][1]["heads"][2]
    assert head["fmt"] == "topk"
    shown = decode_head(blob, head, 40)
    w = golden[1][2].numpy()
    top = np.sort(w, axis=-1)[:, -5:]
    assert np.abs(np.sort(shown, axis=-1)[:, -5:] - top).max() <= HALF_STEP
    offset, n = head["rest"]
    rest = np.frombuffer(blob[offset:offset + n], np.uint8) * STEP
    assert np.abs(rest - (1 - top.sum(-1)).clip(0)).max() <= HALF_STEP + 5e-6
    assert "each row keeps its 5 largest weights" in page


def test_byte_labels_and_text_tokens():
    model = small_model()
    ids, labels = tokenize(model, "a b\n\u00e9")
    assert ids.tolist() == [[97, 32, 98, 10, 0xC3, 0xA9]]
    assert labels == ["a", "\u2423", "b", "\u23ce", "\\xc3", "\\xa9"] and byte_label(256) == "<eos>"


def test_page_is_self_contained(small_report):
    _, path = small_report
    page = path.read_text()
    assert "default-src 'none'" in page  # the page may not load anything
    for needle in ("http://", "https://", "<script src", "<link rel=\"stylesheet\"", "@import"):
        assert needle not in page, needle
    assert page.count("<script") == 3 and "canvas" in page


def test_training_curves_and_monitor_verdicts_render(tmp_path):
    records = [{"step": s, "loss": 5.0 - s / 10} for s in range(0, 30, 5)] + [{"step": 25, "val_loss": 3.0}]
    records += [{"step": s, "attention": {"blocks.0.attn": {"verdicts": ["uniform", "healthy"]}}} for s in (0, 20)]
    page = ak.diagnostics.report(small_model(), "hi there", out=None, doctor=False, metrics=records)
    assert "<h2>Training</h2>" in page and "train loss" in page and "validation loss" in page
    assert "attention monitor: heads per verdict" in page and "at step 20 (the last check)" in page


def test_errors_name_the_argument():
    model = small_model()
    with pytest.raises(AttnkitTypeError, match=r"report\(model=...\) must be a torch.nn.Module"):
        ak.diagnostics.report("not a model", "x")
    with pytest.raises(AttnkitValueError, match="top_k must be a positive int"):
        ak.diagnostics.report(model, "x", top_k=0)
    with pytest.raises(AttnkitValueError, match="dense_max must be a positive int"):
        ak.diagnostics.report(model, "x", dense_max=True)
    with pytest.raises(AttnkitValueError, match="max_tokens must be a positive int"):
        ak.diagnostics.report(model, "x", max_tokens=0)
    with pytest.raises(AttnkitValueError, match=r"the input has 3 tokens, more than max_tokens=2: .* 4 L\^2 bytes"):
        ak.diagnostics.report(model, [1, 2, 3], max_tokens=2, doctor=False)
    with pytest.raises(AttnkitTypeError, match="doctor must be True, False, a doctor Report"):
        ak.diagnostics.report(model, "x", doctor="yes")
    with pytest.raises(AttnkitValueError, match="tokens must be a text, a list of ids, or an int tensor"):
        ak.diagnostics.report(model, torch.zeros(2, 3, dtype=torch.long), doctor=False)
    with pytest.raises(AttnkitValueError, match="report needs a non-empty text"):
        ak.diagnostics.report(model, "", doctor=False)
    with pytest.raises(AttnkitValueError, match="labels has 1 entries but there are 2 tokens"):
        ak.diagnostics.report(model, [1, 2], labels=["a"], doctor=False)
    with pytest.raises(AttnkitValueError, match="no attention calls were seen"):
        ak.diagnostics.report(torch.nn.Sequential(torch.nn.Embedding(10, 4)), [1, 2], doctor=False)
    big = build_vocab_model()
    with pytest.raises(AttnkitValueError, match="text needs a tokenizer: the model's vocab_size is 1000"):
        tokenize(big, "hello")


def build_vocab_model():
    from attnkit.models.builders import build_lm

    return build_lm("nano", vocab_size=1000)


def _nano():
    from attnkit.models.builders import build_lm

    return build_lm("nano").eval()


class _Scores:
    def __init__(self, scores, **kw):
        self.scores, self.objective, self.ablation, self.baseline = scores, "loss", "zero", 1.0
        for k, v in kw.items():
            setattr(self, k, v)


@pytest.mark.parametrize("obj,error,message", [
    (object(), TypeError, "head_importance must have .scores (layers, heads), .objective, .ablation and .baseline"),
    (_Scores([["a", 1.0], [1.0, 2.0]]), ValueError, "head_importance.scores must be a (layers, heads) array of floats"),
    (_Scores([[1.0, 2.0], [1.0]]), ValueError, "head_importance.scores must be a non-empty (layers, heads) array"),
    (_Scores([[1.0, 2.0, 3.0]]), ValueError, "head_importance.scores has shape (1, 3) but the model has 2 attention "
                                             "layers with [2, 2] heads"),
])
def test_head_importance_is_checked(obj, error, message):
    with pytest.raises(error, match=re.escape(message)):
        ak.diagnostics.report(_nano(), "hi", out=None, doctor=False, head_importance=obj)


def test_head_importance_renders_scores_and_escapes_its_strings():
    page = ak.diagnostics.report(_nano(), "hi", out=None, doctor=False,
                                 head_importance=_Scores(torch.tensor([[0.5, 2.0], [float("nan"), -1.0]]),
                                                         objective="<i>loss</i>"))
    cells = re.findall(r'<td data-layer="(\d)" data-head="(\d)"(?: data-score="([^"]+)")?', page)
    assert [(int(l), int(h), s) for l, h, s in cells] == [(0, 0, "0.5"), (0, 1, "2.0"), (1, 0, ""), (1, 1, "-1.0")]
    assert "&lt;i&gt;loss&lt;/i&gt;" in page and "<i>loss" not in page


def test_compare_and_names_are_checked():
    with pytest.raises(TypeError, match=re.escape("report(compare=...) must be a torch.nn.Module (another checkpoint")):
        ak.diagnostics.report(_nano(), "hi", out=None, doctor=False, compare="runs/x")
    with pytest.raises(TypeError, match=re.escape("names must be two strings (the model's and compare's), got")):
        ak.diagnostics.report(_nano(), "hi", out=None, doctor=False, names=("a",))


def test_an_out_whose_parent_is_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match=re.escape(f"out {str(tmp_path / 'file' / 'r.html')!r} cannot be used: ")):
        ak.diagnostics.report(_nano(), "hi", out=tmp_path / "file" / "r.html", doctor=False)


def test_trained_length_warning_only_past_the_configs_length():
    import warnings

    from attnkit.diagnostics.report import trained_length

    model = _nano()
    assert trained_length(model) == 128
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ak.diagnostics.report(model, "x" * 128, out=None, doctor=False)  # at the length: no warning
    with pytest.warns(UserWarning, match="the text has 129 tokens, more than the 128 TransformerLM was built for"):
        page = ak.diagnostics.report(model, "x" * 129, out=None, doctor=False)
    assert 'id="length-warning"' in page


def test_the_real_head_importance_renders_in_the_panel():
    """``ak.diagnostics.head_importance`` (the heads engineer's) goes into the report as it comes."""
    model = small_model()
    tokens, _ = tokenize(model, TEXT)
    importance = ak.diagnostics.head_importance(model, tokens)
    page = ak.diagnostics.report(model, TEXT, out=None, doctor=False, head_importance=importance)
    cells = {(int(l), int(h)): float(s) for l, h, s in
             re.findall(r'<td data-layer="(\d)" data-head="(\d)" data-score="([^"]+)"', page)}
    assert cells == {(l, h): float(importance.scores[l, h]) for l in range(3) for h in range(4)}
    assert f"with every head: {importance.baseline:.4g}" in page and importance.objective in page


def test_compare_with_another_mask_is_refused():
    """The page draws both checkpoints with the model's mask, so a compare model masked otherwise is refused."""
    from attnkit.models.builders import build_lm

    windowed = build_lm("nano", window=2).eval()
    with pytest.raises(ValueError, match=re.escape("compare's attention mask in blocks.0.attn differs from model's")):
        ak.diagnostics.report(_nano(), "hello there", out=None, doctor=False, compare=windowed)

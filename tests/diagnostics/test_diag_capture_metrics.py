"""Capture (weights from any backend), per-head metrics and verdicts, and the training monitor."""

import math
import warnings

import pytest
import torch

import attnkit as ak
from attnkit import _hooks
from attnkit.diagnostics import (
    AttentionHealthWarning,
    AttentionMonitor,
    HealthThresholds,
    capture,
    head_metrics,
    record_metrics,
    verdict,
)
from attnkit.errors import AttnkitTypeError, AttnkitValueError
from attnkit.models.builders import build_lm
from oracle import assert_within_rule


def test_capture_recomputes_fused_weights_exactly():
    q = torch.randn(2, 4, 9, 16)
    k, v = torch.randn(2, 2, 2, 9, 16)  # GQA
    mask = ak.masks.causal() & ak.masks.padding(torch.tensor([9, 6]))
    with capture(scores=True, qk=True) as cap:
        ak.attention(q, k, v, mask, bias=ak.positions.ALiBi(4))  # served by sdpa: no weights of its own
    (record,) = cap.records
    assert record.layer == "call0" and record.weights.shape == (2, 4, 9, 9)
    golden = ak.reference_attention(q.double(), k.double(), v.double(), mask, bias=ak.positions.ALiBi(4),
                                    return_weights=True)[1]
    _, ref32 = ak.reference_attention(q, k, v, mask, bias=ak.positions.ALiBi(4), return_weights=True)
    assert_within_rule(record.weights, ref32, golden, what="captured weights")
    assert record.q.shape == (2, 4, 9, 16) and record.k.shape == (2, 4, 9, 16)  # KV heads expanded
    assert torch.isinf(record.scores[1, :, :, 6:]).all()  # padded keys are -inf before the softmax
    assert record.allowed.shape[-2:] == (9, 9) and not record.allowed[1, 0, 8, 7]


def test_capture_keeps_returned_weights_and_selects_heads_rows():
    q, k, v = torch.randn(3, 1, 4, 6, 8)
    with capture(heads=[1, 3], rows=[-1, 0]) as cap:
        _, w = ak.attention(q, k, v, ak.masks.causal(), return_weights=True)
    (record,) = cap.records
    assert record.heads == [1, 3] and record.rows == [5, 0]
    assert torch.equal(record.weights, w[:, [1, 3]][:, :, [5, 0]])
    assert record.q_positions.tolist() == [[5, 0]]


def test_capture_names_layers_and_filters():
    model = build_lm("nano", num_layers=2).eval()
    tokens = torch.randint(0, 257, (1, 7))
    with capture(model, layers=["blocks.1.*"]) as cap:
        model(tokens)
    assert [r.layer for r in cap.records] == ["blocks.1.attn"]
    with capture(model) as cap:
        model(tokens)
    assert list(cap.by_layer()) == ["blocks.0.attn", "blocks.1.attn"]


def test_capture_is_off_outside_the_block():
    before = list(_hooks.OBSERVERS)
    model = build_lm("nano", num_layers=1)
    with capture(model) as cap:
        assert len(_hooks.OBSERVERS) == len(before) + 1
    assert before == _hooks.OBSERVERS
    assert all(not m._forward_pre_hooks for m in model.modules())
    ak.attention(*torch.randn(3, 1, 1, 4, 8))
    assert cap.records == []


def test_capture_errors():
    with pytest.raises(AttnkitTypeError, match="capture\\(model=...\\) must be a torch.nn.Module"):
        capture("model")
    with pytest.raises(AttnkitValueError, match="heads selects index 7 but the call has 4"), capture(heads=[7]):
        ak.attention(*torch.randn(3, 1, 4, 5, 8))


def test_metrics_of_known_distributions():
    L = 6
    uniform = torch.ones(1, 1, L, L) / L
    one_hot = torch.eye(L)[None, None]
    m = head_metrics(torch.cat([uniform, one_hot], 1))  # two heads
    assert m.norm_entropy[0] == pytest.approx(1.0) and m.entropy[0] == pytest.approx(math.log(L))
    assert m.norm_entropy[1] == pytest.approx(0.0, abs=1e-12) and m.max_prob[1] == pytest.approx(1.0)
    assert m.sink_mass[0] == pytest.approx(1 / L)
    assert m.distance[1] == pytest.approx(0.0)  # the diagonal: every query looks at itself
    assert m.distance[0] == pytest.approx(sum(abs(i - j) for i in range(L) for j in range(L)) / L / L)
    assert m.verdicts() == ["uniform", "collapsed"]
    assert m.masked_mass == [0.0, 0.0]


def test_metrics_respect_the_mask_and_flag_masked_mass():
    L = 5
    allowed = torch.ones(L, L, dtype=torch.bool).tril()
    p = ak.reference_attention(*torch.randn(3, 1, 2, L, 8), ak.masks.causal(), return_weights=True)[1]
    m = head_metrics(p, allowed)
    assert m.masked_mass == [0.0, 0.0]
    leaky = torch.ones(1, 1, L, L) / L  # uniform over all keys although the mask is causal
    assert head_metrics(leaky, allowed).masked_mass[0] == pytest.approx(1 - 1 / L)
    uniform_causal = allowed.double() / allowed.sum(-1, keepdim=True)  # uniform over the visible keys
    assert head_metrics(uniform_causal[None, None], allowed).norm_entropy[0] == pytest.approx(1.0)


def test_verdict_thresholds():
    t = HealthThresholds()
    assert verdict(0.96, 0.1, t) == "collapsed"
    assert verdict(0.3, 0.99, t) == "uniform"
    assert verdict(0.5, 0.6, t) == "healthy"
    assert verdict(math.nan, math.nan, t) == "empty"


def test_record_metrics_on_captured_model():
    model = build_lm("nano", num_layers=1).eval()
    with capture(model) as cap:
        model(torch.randint(0, 257, (2, 9)))
    m = record_metrics(cap.records[0])
    assert len(m.entropy) == 2 and m.verdicts() == ["uniform", "uniform"]  # fresh init: near uniform
    assert max(m.masked_mass) == 0.0


def _sharpen(model, factor):
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv_proj.weight.mul_(factor)


def test_monitor_warns_on_collapse_and_logit_growth():
    torch.manual_seed(0)
    model = build_lm("nano", num_layers=1)
    tokens = torch.randint(0, 257, (2, 12))
    seen = []
    monitor = AttentionMonitor(model, tokens, every=2, thresholds=HealthThresholds(growth_window=3),
                               log_fn=lambda step, summary: seen.append(step))
    assert monitor(1) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error", AttentionHealthWarning)  # step 0: uniform is expected, no warning
        summary = monitor(0)
    assert set(summary) == {"blocks.0.attn"} and summary["blocks.0.attn"]["verdicts"] == ["uniform", "uniform"]
    with pytest.warns(AttentionHealthWarning, match="grew at each of the last 3 checks") as record:
        for step in (2, 4, 6):
            _sharpen(model, 3.0)  # logits grow 9x per check
            monitor(step)
    texts = [str(w.message) for w in record]
    assert any("collapsed" in t for t in texts)
    assert any("logits reach" in t for t in texts)
    assert seen == [0, 2, 4, 6] and len(monitor.history) == 4
    assert model.training  # the mode is restored


def test_monitor_errors():
    with pytest.raises(AttnkitTypeError, match="AttentionMonitor model must be a torch.nn.Module"):
        AttentionMonitor(lambda x: x, None)
    with pytest.raises(AttnkitValueError, match="every must be a positive int"):
        AttentionMonitor(build_lm("nano", num_layers=1), None, every=0)


def test_heatmaps_one_png_per_layer(tmp_path):
    from attnkit.diagnostics.viz import save_heatmaps

    model = build_lm("nano", num_layers=2).eval()
    with capture(model) as cap:
        model(torch.randint(0, 257, (1, 10)))
    paths = save_heatmaps(cap, tmp_path / "out" / "attn")  # a folder, created with its parents
    assert paths == [tmp_path / "out" / "attn" / "blocks.0.attn.png", tmp_path / "out" / "attn" / "blocks.1.attn.png"]
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in paths)
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(AttnkitValueError, match=r"save_heatmaps\(folder='.*a-file'\): that path is a file, not a folder"):
        save_heatmaps(cap, tmp_path / "a-file")
    with pytest.raises(AttnkitValueError, match="the capture holds no records"):
        save_heatmaps(capture(), tmp_path / "none")

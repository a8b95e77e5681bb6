"""Every check: a correct subject passes, a deliberately broken one fails under the right name."""

import pytest
import torch
from diag_zoo import (
    TinyDecoder,
    ViewBugAttention,
    causal_off_by_one,
    good_attention,
    head_seq_view_bug,
    mask_after_softmax,
    minus_1e9,
    missing_scale,
    nan_rows,
    only_square_masks,
)

import attnkit as ak
from attnkit.diagnostics.checks import names

FN_CHECKS = ["causal-leak", "padding-leak", "packing-leak", "scale", "mask-placement", "layout", "low-precision",
             "backend-agreement"]


def test_bare_function_needs_nothing_else():
    report = ak.doctor.examine(good_attention)
    assert report.ok, str(report)
    assert [r.name for r in report.results] == names()
    assert {r.name for r in report.results if r.status == "PASS"} == set(FN_CHECKS)
    assert {r.name for r in report.results if r.status == "SKIP"} == {"departures", "kv-cache", "init",
                                                                     "attention-health", "overfit", "extrapolation",
                                                                     "attention-dropout", "init-scale"}
    assert all(r.evidence for r in report.results)


@pytest.mark.parametrize(("fn", "failing", "words"), [
    (missing_scale, "scale", "missing scale"),
    (mask_after_softmax, "mask-placement", "mask applied after softmax"),
    (causal_off_by_one, "causal-leak", "first at position 3"),
    (only_square_masks, "padding-leak", "padding leaks"),
    (minus_1e9, "low-precision", "float16 overflow"),
    (nan_rows, "low-precision", "fully masked rows break float32"),
    (head_seq_view_bug, "layout", "heads and sequence are mixed"),
])
def test_broken_function_fails_the_right_check(fn, failing, words):
    report = ak.doctor.examine(fn, checks=FN_CHECKS)
    result = report[failing]
    assert result.status == "FAIL", str(report)
    assert words in result.evidence
    assert result.fix and " ".join(result.fix.split()) in " ".join(str(report).split())  # the table wraps lines
    assert not report.ok and report.exit_code == 1


def test_correct_function_passes_what_the_broken_ones_fail():
    report = ak.doctor.examine(good_attention, checks=FN_CHECKS)
    assert all(r.status == "PASS" for r in report.results), str(report)


def test_scale_classifies_d_k_instead_of_sqrt():
    def over_d(q, k, v, mask):
        return ak.attention(q, k, v, mask, scale=1.0 / q.shape[-1])

    result = ak.doctor.examine(over_d, checks=["scale"])["scale"]
    assert result.status == "FAIL" and "divided by d_k instead of sqrt(d_k)" in result.evidence


def test_view_bug_module_fails_layout():
    report = ak.doctor.examine(ViewBugAttention(), checks=["layout", "causal-leak"])
    assert report["layout"].status == "FAIL", str(report)
    good = ak.doctor.examine(ak.nn.MultiHeadAttention(32, 4), checks=["layout"])
    assert good["layout"].status == "PASS"


def test_collapsed_init_fails_initialisation_and_names_collapsed_heads():
    broken = ak.nn.MultiHeadAttention(32, 4, init_std=1.0)
    report = ak.doctor.examine(broken, checks=["init", "attention-health"], fresh=True)
    assert report["init"].status == "FAIL" and "qkv_proj std" in report["init"].evidence
    health = report["attention-health"]
    assert health.status == "WARN" and "collapsed" in health.evidence and "heads [" in health.evidence
    good = ak.doctor.examine(ak.nn.MultiHeadAttention(32, 4, init_std=0.02), checks=["init"], fresh=True)
    assert good["init"].status == "PASS", str(good)


def test_init_is_skipped_for_trained_models():
    report = ak.doctor.examine(ak.nn.MultiHeadAttention(32, 4), checks=["init"], fresh=False)
    assert report["init"].status == "SKIP" and "trained" in report["init"].evidence


DECODER_CHECKS = ["causal-leak", "padding-leak", "kv-cache", "scale", "low-precision", "init", "attention-health"]


def test_tiny_decoder_passes():
    report = ak.doctor.examine(TinyDecoder(), checks=DECODER_CHECKS, fresh=True)
    assert report.ok, str(report)
    assert all(r.status == "PASS" for r in report.results), str(report)


@pytest.mark.parametrize(("bug", "failing", "words", "skipped"), [
    # the cache refuses the off-by-one mask (a typed error): that refusal is no evidence of drift, so kv-cache SKIPs
    ("causal-off-by-one", "causal-leak", "future tokens leak", {"kv-cache": "with a KV cache the mask must be causal"}),
    ("padding-leak", "padding-leak", "left padding", {}),
    ("cache-drift", "kv-cache", "drifts", {}),
    ("missing-scale", "scale", "missing scale", {}),
])
def test_broken_decoder_fails_the_right_check(bug, failing, words, skipped):
    report = ak.doctor.examine(TinyDecoder(bug=bug), checks=DECODER_CHECKS[:4])
    assert report[failing].status == "FAIL", str(report)
    assert words in report[failing].evidence
    assert {r.name for r in report.results if r.status == "FAIL"} == {failing}, str(report)
    for name, why in skipped.items():
        assert report[name].status == "SKIP" and why in report[name].evidence, str(report)
        assert "could not run: its probe raised AttnkitValueError" in report[name].evidence


def test_causal_leak_also_reads_the_gradient():
    result = ak.doctor.examine(causal_off_by_one, checks=["causal-leak"])["causal-leak"]
    assert result.details["future_grad"] > 0


def test_overfit_is_optional_and_learns():
    from attnkit.models.builders import build_lm

    model = build_lm("nano", num_layers=1)
    assert ak.doctor.examine(model, checks=["overfit"])["overfit"].status == "SKIP"
    result = ak.doctor.examine(model, checks=["overfit"], overfit=True)["overfit"]
    assert result.status == "PASS", result.evidence


def test_overfit_fails_when_nothing_is_learned():
    frozen = TinyDecoder()
    for p in frozen.parameters():
        p.requires_grad_(False)
    frozen.head.weight.requires_grad_(True)  # only the head learns: can't memorise positions beyond bigrams
    frozen.head.weight.data.zero_()
    frozen.head.weight.register_hook(lambda g: g * 0)  # ... and not even that
    result = ak.doctor.examine(frozen, checks=["overfit"], overfit=True, overfit_steps=10)["overfit"]
    assert result.status == "FAIL" and "did not fall" in result.evidence


def test_skip_and_crash_are_reported():
    def crashes(q, k, v, mask):
        raise RuntimeError("boom")

    report = ak.doctor.examine(crashes, checks=["scale", "layout"], skip=["layout"])
    assert report["scale"].status == "FAIL" and "RuntimeError: boom" in report["scale"].evidence
    assert report["layout"].status == "SKIP" and "on request" in report["layout"].evidence


def test_report_json_roundtrip():
    import json

    report = ak.doctor.examine(missing_scale, checks=["scale", "mask-placement"])
    data = json.loads(report.to_json())
    assert data["ok"] is False and data["counts"]["FAIL"] == 1
    assert [c["name"] for c in data["checks"]] == ["scale", "mask-placement"]
    assert data["checks"][0]["fix"].startswith("Multiply the scores by 1/sqrt(d_k)")
    with pytest.raises(KeyError, match="no check named 'nope'"):
        report["nope"]


def test_backend_agreement_detects_a_wrong_backend(monkeypatch):
    from attnkit.backends.registry import _REGISTRY

    sdpa = _REGISTRY["sdpa"]
    original = type(sdpa).__call__
    monkeypatch.setattr(type(sdpa), "__call__", lambda self, call: original(self, call) * 1.001)
    report = ak.doctor.examine(ak.nn.MultiHeadAttention(32, 4), checks=["backend-agreement"])
    result = report["backend-agreement"]
    assert result.status == "FAIL" and result.evidence.startswith("sdpa outside 2x"), result.evidence


def test_gqa_rope_and_alibi_modules_pass():
    for module in (ak.nn.MultiHeadAttention(32, 4, num_kv_heads=2, positions="rope"),
                   ak.nn.MultiHeadAttention(32, 4, num_kv_heads=1, positions="alibi")):
        report = ak.doctor.examine(module, skip=["backend-agreement"])
        assert report.ok, str(report)
        assert report["layout"].status == "PASS" and report["padding-leak"].status == "PASS"


def test_tensor_outputs_are_finite_in_low_precision_for_attnkit():
    result = ak.doctor.examine(ak.attention, checks=["low-precision"])["low-precision"]
    assert result.status == "PASS" and "float16" in result.evidence, result.evidence


def test_torch_default_seed_not_consumed():
    torch.manual_seed(3)
    expected = torch.rand(1)
    torch.manual_seed(3)
    ak.doctor.examine(good_attention, checks=["causal-leak", "layout"])
    assert torch.equal(torch.rand(1), expected)


def test_every_registered_check_runs(monkeypatch):
    """Registration is the only source: a check registered with @check runs, in its declared order
    (issue 11 defect 3: one missing from ORDER never ran while the report said ok)."""
    from attnkit.diagnostics.checks import REGISTRY, base, names

    def always_fails(subject, options):
        return base.Outcome(base.FAIL, "planted failure")

    monkeypatch.setitem(REGISTRY, "planted", base.Check("planted", "planted", "remove the plant", always_fails, 55.0))
    report = ak.doctor.examine(good_attention)
    assert [r.name for r in report.results] == names()
    assert {r.name for r in report.results} == set(REGISTRY)
    assert report["planted"].status == "FAIL" and not report.ok
    order = [r.name for r in report.results]
    assert order.index("scale") < order.index("planted") < order.index("mask-placement")  # order=55 between 50, 60


def test_check_modules_are_discovered_and_names_are_unique():
    import importlib
    import pkgutil
    import sys

    import attnkit.diagnostics.checks as checks
    from attnkit.diagnostics.checks import base

    assert all(f"{checks.__name__}.{m.name}" in sys.modules for m in pkgutil.iter_modules(checks.__path__))
    module = importlib.import_module("attnkit.diagnostics.checks.leaks")
    with pytest.raises(ak.errors.AttnkitValueError, match="'causal-leak' is already registered by"):
        base.check("causal-leak", "t", "f")(lambda subject, options: None)
    with pytest.raises(ak.errors.AttnkitValueError, match="order must be a number"):
        base.check("x", "t", "f", order="first")
    assert module is not None

"""Attention sinks (gpt-oss): one learned logit per head joins each row's softmax and is dropped."""

import pytest
import torch

import attnkit as ak
from attnkit.errors import AttnkitTypeError, AttnkitValueError, BackendUnsupportedError


def _closed_form(q, k, v, mask, sinks):
    # softmax over [scores, sink] without the sink column == the plain output scaled by sigmoid(lse - sink)
    scores = (q @ k.transpose(-2, -1)) / q.shape[-1] ** 0.5
    scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)  # (B, H, Lq, 1)
    plain = torch.softmax(scores, dim=-1) @ v
    return plain * torch.sigmoid(lse - sinks.view(1, -1, 1, 1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sinks_take_mass_and_match_the_closed_form(dtype):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 7, 16, generator=g, dtype=torch.float64) for _ in range(3))
    sinks = torch.tensor([-1.0, 0.0, 2.0, 5.0], dtype=torch.float64)
    golden = _closed_form(q, k, v, torch.ones(7, 7, dtype=torch.bool).tril(), sinks)
    out, w = ak.attention(*(t.to(dtype) for t in (q, k, v)), ak.masks.causal(), sinks=sinks.to(dtype),
                          return_weights=True)
    ref = ak.reference_attention(*(t.to(dtype) for t in (q, k, v)), ak.masks.causal(), sinks=sinks.to(dtype))
    err, ref_err = (out.double() - golden).abs().max().item(), (ref.double() - golden).abs().max().item()
    assert err <= 2 * ref_err + 1e-6, f"{dtype}: attnkit {err:.3g} vs reference in {dtype} {ref_err:.3g}"
    assert (w.double().sum(-1) < 1).all()  # the sink took some of every row's mass
    plain = ak.attention(q, k, v, ak.masks.causal())
    assert (ak.attention(q, k, v, ak.masks.causal(), sinks=sinks) - plain).abs().max() > 1e-3  # it matters


def test_sink_gradients_match_float64():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 5, 8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    sinks = torch.tensor([0.5, -0.5], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *a: ak.attention(*a[:3], ak.masks.causal(), sinks=a[3]), (q, k, v, sinks))


def test_only_backends_that_declare_sinks_serve_them():
    q = k = v = torch.randn(1, 2, 4, 8)
    sinks = torch.zeros(2)
    why = ak.explain(q, k, v, sinks=sinks)
    assert why.chosen in ("sdpa", "blocksparse", "eager", "math"), why.chosen
    assert not why.reasons.get("sdpa"), why.reasons  # sdpa serves sinks (the flash kernel's log-sum-exp)
    assert any("serves_sinks" in r for r in why.reasons["flex"]), why.reasons  # flex does not declare them
    with pytest.raises(BackendUnsupportedError, match=r"attention sinks \(sinks=\): this backend does not declare"):
        ak.attention(q, k, v, sinks=sinks, backend="flex")


def test_sinks_refusals_name_the_option():
    q = k = v = torch.randn(1, 2, 4, 8)
    sinks = torch.zeros(2)
    with pytest.raises(BackendUnsupportedError, match="blocksparse serves attention sinks on its SDPA pieces, not with a "
                                                      "bias or softcap"):
        ak.attention(q, k, v, sinks=sinks, softcap=5.0, backend="blocksparse")
    with pytest.raises(BackendUnsupportedError, match="sdpa has no dropout with attention sinks"):
        ak.attention(q, k, v, sinks=sinks, dropout_p=0.1, backend="sdpa")
    with pytest.raises(BackendUnsupportedError, match="blocksparse gives no gradient to a bias beside attention sinks"):
        ak.attention(q, k, v, sinks=sinks, bias=torch.zeros(1, 2, 4, 4, requires_grad=True), backend="blocksparse")


def test_sinks_must_be_one_float_logit_per_head():
    q = k = v = torch.randn(1, 2, 4, 8)
    with pytest.raises(AttnkitTypeError, match=r"sinks must be a float tensor \(H,\)"):
        ak.attention(q, k, v, sinks=[0.0, 1.0])
    with pytest.raises(AttnkitValueError, match=r"sinks must have shape \(2,\) \(one logit per query head\)"):
        ak.attention(q, k, v, sinks=torch.zeros(3))

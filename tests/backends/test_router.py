"""The router's choices (which backend for which request) and what explain() says. Not timed."""

from __future__ import annotations

import pytest
import torch

import attnkit as ak
from attnkit.backends import flex
from attnkit.errors import BackendUnsupportedError

M = ak.masks


def qkv(L=4096, Lq=None, grad=False, H=4):
    q = torch.randn(1, H, Lq or L, 8, requires_grad=grad)
    k = torch.randn(1, H, L, 8, requires_grad=grad)
    return q, k, k.detach().clone().requires_grad_(grad)


@pytest.fixture(autouse=True)
def _no_flex_opt_in():
    flex.allow_cpu_compile(False)
    yield
    flex._STATE["cpu_compile"] = None


@pytest.mark.parametrize("mask, kwargs, L, Lq, expected", [
    (None, {}, 2048, None, "sdpa"),
    (M.causal(), {}, 4096, None, "sdpa"),  # is_causal flag: one fused kernel
    (M.causal(), {"bias": "alibi"}, 4096, None, "blocksparse"),  # structured bias on long sequences
    (M.causal(), {"bias": "alibi"}, 2048, None, "blocksparse"),  # the tiled kernel wins from 2048 keys
    (M.causal(), {"bias": "alibi"}, 1024, None, "sdpa"),
    (M.sliding_window(256), {}, 4096, None, "blocksparse"),
    (M.sliding_window(256), {}, 2048, None, "sdpa"),  # short: a dense mask costs little
    (M.sliding_window(256), {}, 4096, 1, "sdpa"),  # a decode step: one query row
    (M.causal(), {}, 4096, 64, "sdpa"),  # chunked prefill of a few rows against a cache
    (M.causal() & M.strided(64), {}, 4096, None, "blocksparse"),
    (M.document(torch.arange(4096)[None] // 256) & M.causal(), {}, 4096, None, "blocksparse"),
    (M.sliding_window(256), {"return_weights": True}, 4096, None, "math"),
    (M.sliding_window(256), {"softcap": 5.0}, 4096, None, "math"),  # SDPA-based backends have no softcap
    ("bool", {}, 4096, None, "sdpa"),  # a dense tensor is already Lq x Lk
])
def test_auto_choice_cpu(mask, kwargs, L, Lq, expected):
    q, k, v = qkv(L, Lq)
    if kwargs.get("bias") == "alibi":
        kwargs = {**kwargs, "bias": ak.positions.ALiBi(4)}
    if mask == "bool":
        mask = torch.ones(L, L, dtype=torch.bool).tril()
    assert ak.explain(q, k, v, mask, **kwargs).chosen == expected


def test_flex_only_for_cpu_inference_when_compiling_is_allowed():
    q, k, v = qkv(4096)
    mask = M.sliding_window(256)
    assert ak.explain(q, k, v, mask).chosen == "blocksparse"
    flex.allow_cpu_compile(True)
    assert ak.explain(q, k, v, mask).chosen == "flex"
    qg, kg, vg = qkv(4096, grad=True)
    e = ak.explain(qg, kg, vg, mask)  # training on CPU: flex has no backward
    assert e.chosen == "blocksparse"
    assert "no backward" in "; ".join(e.reasons["flex"])
    with torch.no_grad():
        assert ak.explain(qg, kg, vg, mask).chosen == "flex"


def test_explain_reports_the_choice_and_the_reasons():
    q, k, v = qkv(4096)
    e = ak.explain(q, k, v, M.sliding_window(256))
    text = str(e)
    assert "blocksparse" in text and "why:" in text and "reachable key blocks" in text
    assert "computes" in e.plan and "% of the Lq x Lk entries" in e.plan
    forced = ak.explain(q, k, v, M.sliding_window(256), backend="sdpa")
    assert forced.chosen == "sdpa" and forced.why == ["backend='sdpa' asked for"]


@pytest.mark.parametrize("kwargs, match", [
    ({"return_weights": True}, "does not return attention weights"),
    ({"softcap": 3.0}, "no logit softcap"),
])
def test_blocksparse_refuses_with_reasons(kwargs, match):
    q, k, v = qkv(64)
    with pytest.raises(BackendUnsupportedError, match=match):
        ak.attention(q, k, v, M.causal(), backend="blocksparse", **kwargs)


@pytest.mark.parametrize("kwargs, grad, match", [
    ({"dropout_p": 0.1}, False, "no attention dropout"),
    ({"bias": torch.zeros(64, 64)}, False, "not dense float bias tensors"),
    ({}, True, "no backward pass on CPU"),
    ({"return_weights": True}, False, "does not return attention weights"),
])
def test_flex_refuses_with_reasons(kwargs, grad, match):
    q, k, v = qkv(64, grad=grad)
    with pytest.raises(BackendUnsupportedError, match=match):
        ak.attention(q, k, v, M.causal(), backend="flex", **kwargs)

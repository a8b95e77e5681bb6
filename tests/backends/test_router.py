"""The router's rank layer: which backend for which request when no calibration prices the call (``cost.use(None)``:
auto by rank alone, as on a device without a calibration, and for backends without ``work``), and what explain()
says. Routing by predicted cost: test_cost_routing.py. Not timed."""

from __future__ import annotations

import pytest
import torch

import attnkit as ak
from attnkit.backends import cost, flex
from attnkit.errors import BackendUnsupportedError

M = ak.masks


def qkv(L=4096, Lq=None, grad=False, H=4):
    q = torch.randn(1, H, Lq or L, 8, requires_grad=grad)
    k = torch.randn(1, H, L, 8, requires_grad=grad)
    return q, k, k.detach().clone().requires_grad_(grad)


@pytest.fixture(autouse=True)
def _no_flex_opt_in():
    flex.allow_cpu_compile(False)
    with cost.use(None):
        yield
    flex._STATE["cpu_compile"] = None


@pytest.mark.parametrize("mask, kwargs, L, Lq, expected", [
    (None, {}, 2048, None, "sdpa"),
    (M.causal(), {}, 4096, None, "sdpa"),  # is_causal flag: one fused kernel
    (M.causal(), {"bias": "alibi"}, 4096, None, "blocksparse"),  # structured bias on long sequences
    (M.causal(), {"bias": "alibi"}, 2048, None, "blocksparse"),
    (M.causal(), {"bias": "alibi"}, 256, None, "blocksparse"),  # SDPA pieces on an offset table from 256 keys
    (M.causal(), {"bias": "alibi"}, 128, None, "sdpa"),  # shorter: the dense bias costs little
    (M.causal() & M.padding([200]), {"bias": "alibi"}, 1024, None, "sdpa"),  # not offset-only: per-piece path
    (M.sliding_window(256), {}, 4096, None, "blocksparse"),
    (M.sliding_window(256), {}, 2048, None, "sdpa"),  # short: ranked below SDPA (by rank alone)
    (M.sliding_window(256), {}, 4096, 1, "sdpa"),  # a decode step: one query row
    (M.causal(), {}, 4096, 64, "sdpa"),  # chunked prefill of a few rows against a cache
    (M.causal() & M.strided(64), {}, 4096, None, "blocksparse"),
    (M.document(torch.arange(4096)[None] // 256) & M.causal(), {}, 4096, None, "blocksparse"),
    (M.document(torch.arange(512)[None] // 64) & M.causal(), {}, 512, None, "blocksparse"),  # documents: any length
    (M.sliding_window(256), {"return_weights": True}, 4096, None, "math"),
    (M.sliding_window(256), {"softcap": 5.0}, 4096, None, "blocksparse"),  # softcap in the tiled kernel
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


class ToyBackend:
    """Serves calls with head dim 7 only (math underneath), ranked above everything there."""

    def __init__(self, name="toy", score=100.0):
        self.name, self.score, self.served = name, score, 0

    def available(self):
        return []

    def supports(self, call):
        return [] if call.q.shape[-1] == 7 else [f"toy serves head dim 7 only, got {call.q.shape[-1]}"]

    def rank(self, call):
        return ak.backends.Rank(self.score, "toy: head dim 7 is all it knows")

    def plan(self, call):
        return "toy plan"

    def __call__(self, call):
        self.served += 1
        return ak.backends.get("math")(call)


@pytest.fixture
def toy():
    backend = ToyBackend()
    ak.backends.register(backend)
    try:
        yield backend
    finally:
        ak.backends.unregister("toy")
    assert "toy" not in ak.backends.available()


def test_a_registered_backend_is_chosen_where_it_ranks_first(toy):
    q7, k7, v7 = (torch.randn(1, 2, 16, 7) for _ in range(3))
    e = ak.explain(q7, k7, v7, M.causal())
    assert e.chosen == "toy" and e.why == ["toy: head dim 7 is all it knows"] and e.plan == "toy plan"
    assert "sdpa: could serve, ranks lower (30:" in str(e)
    out = ak.attention(q7, k7, v7, M.causal())
    assert toy.served == 1
    torch.testing.assert_close(out, ak.reference_attention(q7, k7, v7, M.causal()))
    q, k, v = qkv(64)  # head dim 8: the toy can't serve, auto picks as before
    e = ak.explain(q, k, v, M.causal())
    assert e.chosen == "sdpa" and e.reasons["toy"] == ["toy serves head dim 7 only, got 8"]
    ak.attention(q, k, v, M.causal())
    assert toy.served == 1


def test_a_backend_ranked_below_math_is_never_auto_chosen():
    low = ToyBackend("low", score=-1.0)
    ak.backends.register(low)
    try:
        q7, k7, v7 = (torch.randn(1, 2, 16, 7) for _ in range(3))
        assert ak.explain(q7, k7, v7, M.causal()).chosen == "sdpa"
        assert ak.explain(q7, k7, v7, M.causal(), return_weights=True).chosen == "math"  # toy: -1 < math: 0
        ak.attention(q7, k7, v7, M.causal(), backend="low")  # asked for by name: it serves
        assert low.served == 1
    finally:
        ak.backends.unregister("low")


def test_register_and_unregister_errors():
    with pytest.raises(ak.errors.AttnkitTypeError, match=r"register expects a backend .* missing \['rank'\]"):
        ak.backends.register(type("NoRank", (), {"name": "norank", "available": lambda s: [], "supports": lambda s, c: [],
                                                 "plan": lambda s, c: "", "__call__": lambda s, c: None})())
    with pytest.raises(ak.errors.AttnkitTypeError, match=r"register expects a backend with a str name \(not 'auto'\)"):
        ak.backends.register(ToyBackend("auto"))
    with pytest.raises(ak.errors.AttnkitValueError, match="backend 'math' can't be unregistered"):
        ak.backends.unregister("math")
    with pytest.raises(ak.errors.AttnkitValueError, match="unknown backend 'nope'"):
        ak.backends.unregister("nope")


def test_flex_refuses_float64_on_cpu_even_when_compiling_is_allowed():
    """Issue 16 item 21: the router picked flex for fp64 on CPU, which flex can't run."""
    flex.allow_cpu_compile(True)
    q, k, v = (t.double() for t in qkv(4096))
    e = ak.explain(q, k, v, M.sliding_window(256))
    assert e.chosen == "blocksparse"
    assert e.reasons["flex"] == ["flex on CPU has no float64 kernel (use float32 or bfloat16, or another backend)"]
    with pytest.raises(BackendUnsupportedError, match="flex on CPU has no float64 kernel"):
        ak.attention(q[:, :, :64], k[:, :, :64], v[:, :, :64], M.causal(), backend="flex")


def test_softcap_on_cpu_needs_no_compile_and_explain_gives_the_reason_used():
    """Issue 16 item 21: softcap on CPU compiled flex (25 s) although compiling was not allowed, and explain
    gave SDPA's reason."""
    q, k, v = qkv(4096)
    e = ak.explain(q, k, v, M.sliding_window(256), softcap=5.0)
    assert e.chosen == "blocksparse"  # the tiled kernel applies the softcap: no compile, no Lq x Lk scores
    assert e.why == [ak.backends.get(e.chosen).rank(_call(q, k, v, M.sliding_window(256), softcap=5.0)).reason]
    assert "compiling on CPU was not allowed" in str(e)
    flex.allow_cpu_compile(True)  # allowed, inference, long and structured: flex ranks first
    e = ak.explain(q, k, v, M.sliding_window(256), softcap=5.0)
    assert e.chosen == "flex" and "flex skips empty blocks (CPU inference, compiling allowed)" in e.why[0]


def _call(q, k, v, mask, **kwargs):
    from attnkit._validation import build_call
    return build_call(q, k, v, mask, **kwargs)

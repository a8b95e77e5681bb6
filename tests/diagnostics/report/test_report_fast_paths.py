"""The report's fast paths against their float64 / per-head references.

The page shows the metrics with 3 decimals (``toFixed(3)``; masked mass with one significant digit), so a fast
metric is good when it is within half a displayed unit (5e-4) of the float64 computation on the same weights.
``head_metrics`` documents a tighter bound (entropy within 3u * entropy, distance within u * distance,
u = 2**-24; max p, sink mass and a zero masked mass exact): the tests check that bound and that it is below the
display's half unit at the lengths tested.
"""

import math

import numpy as np
import pytest
import torch

from attnkit.diagnostics.capture import capture
from attnkit.diagnostics.metrics import head_metrics, head_metrics_reference
from attnkit.diagnostics.report.collect import prev_token_score
from attnkit.diagnostics.report.encode import STEP, Buffer, decode_blob, decode_head, encode_layer, thumbnails
from attnkit.functional.reference import safe_softmax
from conftest import read_page

U = 2.0 ** -24  # float32 unit roundoff
DISPLAY_HALF_UNIT = 0.5e-3  # the page prints toFixed(3)


def softmax_weights(B, H, Lq, Lk, allowed, sharp=3.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(B, H, Lq, Lk, generator=g) * sharp
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores, -1).nan_to_num(0.0)  # fully masked rows: zeros


def masks(Lq, Lk, H):
    causal = torch.arange(Lk - Lq, Lk)[:, None] >= torch.arange(Lk)[None, :]  # (Lq, Lk), bottom-right aligned
    padding = (torch.arange(Lk) < Lk - 3)[None, None, None, :]  # (1, 1, 1, Lk): row-broadcast
    per_head = torch.rand(1, H, Lq, Lk, generator=torch.Generator().manual_seed(1)) > 0.3  # (1, H, Lq, Lk)
    empty_rows = causal & (torch.arange(Lq) >= 2)[:, None]  # the first two queries see nothing
    return {"none": None, "causal": causal, "padding": padding, "per-head": per_head, "causal&padding": causal & padding,
            "empty-rows": empty_rows}


def compare(weights, allowed, **positions):
    fast = head_metrics(weights, allowed, **positions)
    gold = head_metrics_reference(weights, allowed, **positions)
    for key in ("max_prob", "sink_mass", "masked_mass"):
        a, b = np.array(getattr(fast, key)), np.array(getattr(gold, key))
        assert np.array_equal(a, b, equal_nan=True) or np.allclose(a, b, rtol=1e-15, atol=0, equal_nan=True), \
            f"{key}: fast {a} vs float64 {b}"
    for key, rel in (("entropy", 3 * U), ("norm_entropy", 3 * U), ("distance", U)):
        a, b = np.array(getattr(fast, key)), np.array(getattr(gold, key))
        assert np.array_equal(np.isnan(a), np.isnan(b)), key
        err = np.nan_to_num(np.abs(a - b)).max()
        bound = rel * np.nan_to_num(np.abs(b)).max() + 1e-12
        assert err <= bound, f"{key}: max |fast - float64| = {err:.3g} > documented bound {bound:.3g}"
    assert fast.verdicts() == gold.verdicts()
    return fast, gold


@pytest.mark.parametrize("mask", ["none", "causal", "padding", "per-head", "causal&padding", "empty-rows"])
@pytest.mark.parametrize("Lq,Lk", [(1, 1), (7, 7), (65, 65), (5, 9)])
def test_head_metrics_equal_the_float64_reference(mask, Lq, Lk):
    H = 3
    allowed = masks(Lq, Lk, H)[mask]
    weights = softmax_weights(2, H, Lq, Lk, allowed)
    compare(weights, allowed)


def test_head_metrics_across_many_slabs_and_bf16_and_float64_inputs(monkeypatch):
    import attnkit.diagnostics.metrics as metrics

    monkeypatch.setattr(metrics, "SLAB_ELEMENTS", 37)  # a slab of one row: every row boundary is a slab edge
    allowed = masks(33, 33, 2)["causal"]
    w = softmax_weights(1, 2, 33, 33, allowed)
    compare(w, allowed)
    compare(w.double(), allowed)
    fast = head_metrics(w.bfloat16(), allowed)
    gold = head_metrics_reference(w.bfloat16(), allowed)
    assert max(abs(a - b) for a, b in zip(fast.entropy, gold.entropy)) <= 3 * U * max(gold.entropy) + 1e-12


def test_head_metrics_at_2048_keys_stay_within_the_displayed_precision():
    """The worst case for the distance: heads that look ~2000 tokens away (the bound grows with the distance)."""
    L, H = 2048, 2
    allowed = masks(L, L, H)["causal"]
    far = torch.zeros(1, H, L, L)
    far[..., 0] = 4.0  # most mass on the first key: distance ~ position
    w = softmax_weights(1, H, L, L, allowed, sharp=1.0) + far
    w = torch.where(allowed, w, 0) / torch.where(allowed, w, 0).sum(-1, keepdim=True)
    fast, gold = compare(w, allowed)
    assert max(gold.distance) > 900  # really far heads
    err = max(abs(a - b) for a, b in zip(fast.distance, gold.distance))
    assert U * L < DISPLAY_HALF_UNIT and err < DISPLAY_HALF_UNIT, f"distance error {err:.3g}"


@pytest.mark.parametrize("slab", [1, 1 << 22])
def test_head_metrics_flags_masked_mass_like_the_reference(monkeypatch, slab):
    """Mass on forbidden keys, also past the last visible key of a slab (where the fast path skips empty keys)."""
    import attnkit.diagnostics.metrics as metrics

    monkeypatch.setattr(metrics, "SLAB_ELEMENTS", slab)
    L = 6
    allowed = torch.ones(L, L, dtype=torch.bool).tril()
    leaky = torch.full((1, 2, L, L), 1.0 / L)
    fast, gold = compare(leaky, allowed)
    assert fast.masked_mass[0] == pytest.approx(1 - 1 / L, abs=1e-7) and fast.masked_mass == gold.masked_mass
    one = torch.eye(L)[None, None].repeat(1, 2, 1, 1)
    one[0, 1, 0, L - 1] = 0.25  # head 1: the first query (sees key 0 only) puts mass on the last key
    fast, gold = compare(one, allowed)
    assert fast.masked_mass == gold.masked_mass == [0.0, 0.25]
    nan = one.clone()
    nan[0, 0, 2, 4] = math.nan  # a NaN on a forbidden key is reported, not skipped
    assert math.isnan(head_metrics(nan, allowed).masked_mass[0])


def old_prev_token_score(weights, allowed):
    """The report's previous definition on the whole matrix, in float64 (the oracle of the diagonal version)."""
    H, Lq, Lk = weights.shape
    prev = torch.arange(Lk - Lq, Lk)[:, None] - 1 == torch.arange(Lk)[None, :]  # (Lq, Lk)
    ok = prev.expand(H, Lq, Lk) if allowed is None else prev & allowed.expand(H, Lq, Lk)
    rows = ok.any(-1)
    score = (weights.double() * ok).sum(-1)
    n = rows.sum(-1)
    return torch.where(n > 0, (score * rows).sum(-1) / n.clamp_min(1), torch.full_like(n, math.nan,
                                                                                    dtype=torch.double)).tolist()


@pytest.mark.parametrize("mask", ["none", "causal", "per-head", "causal&padding"])
@pytest.mark.parametrize("Lq,Lk", [(1, 1), (9, 9), (4, 9), (1, 6)])
def test_prev_token_score_reads_the_diagonal_like_the_full_matrix(mask, Lq, Lk):
    allowed = masks(Lq, Lk, 3)[mask]
    allowed = None if allowed is None else allowed.reshape(-1, Lq, Lk) if allowed.dim() == 4 else allowed[None]
    w = softmax_weights(1, 3, Lq, Lk, allowed)[0]
    got, want = prev_token_score(w, allowed), old_prev_token_score(w, allowed)
    assert np.allclose(got, want, rtol=1e-15, atol=1e-17, equal_nan=True), (got, want)


@pytest.mark.parametrize("top_k", [None, 5])
def test_layer_encoding_equals_per_head_float64_quantisation(top_k):
    L, H = 40, 3
    w = softmax_weights(1, H, L, L, masks(L, L, H)["causal"], sharp=4.0)[0]  # (H, L, L)
    w[0, 5, 0] = 0.5 * STEP  # an exact tie on a rounding boundary: float64 rounds it half to even (to 0)
    buf = Buffer()
    heads = encode_layer(buf, w, top_k)
    blob = decode_blob(buf.encoded())
    for h, head in enumerate(heads):
        golden = w[h].double().numpy()
        shown = decode_head(blob, head, L)
        if top_k is None:
            assert np.array_equal(shown, np.rint(golden * 255) * STEP), f"head {h}: not the nearest step"
        else:
            top = np.sort(golden, -1)[:, -top_k:]
            assert np.abs(np.sort(shown, -1)[:, -top_k:] - top).max() <= 0.5 * STEP + 1e-12
            rest = np.frombuffer(blob[head["rest"][0]:sum(head["rest"])], np.uint8) * STEP
            assert np.abs(rest - (1 - top.sum(-1)).clip(0)).max() <= 0.5 * STEP + 1e-7
        pooled = torch.nn.functional.adaptive_max_pool2d(w[h][None, None], min(48, L))[0, 0]
        t = np.frombuffer(blob[head["thumb"][0]:sum(head["thumb"])], np.uint8).reshape(head["T"], head["T"])
        assert np.array_equal(t, np.rint((pooled / pooled.max()).double().numpy() * 255).astype(np.uint8))
    assert thumbnails(torch.zeros(2, 4, 4)).max() == 0  # an all-zero head: no division by zero


def test_capture_of_every_head_and_row_copies_nothing_but_never_aliases_returned_weights():
    import attnkit as ak

    q, k, v = torch.randn(3, 1, 2, 5, 8)
    with capture() as cap:
        _, w = ak.attention(q, k, v, ak.masks.causal(), return_weights=True)
    golden = w.clone()
    w.mul_(0)  # the caller edits its weights in place: the record keeps what the call returned
    assert torch.equal(cap.records[0].weights, golden) and golden.abs().sum() > 0
    with capture(scores=True) as cap:
        ak.attention(q, k, v, ak.masks.causal())  # fused backend: recomputed, nothing selected, nothing copied
    r = cap.records[0]
    assert torch.equal(r.weights, safe_softmax(r.scores)) and r.q_positions.tolist() == [[0, 1, 2, 3, 4]]


def test_hf_decoder_through_attnkit_shows_its_eager_weights_without_output_attentions():
    """The report runs a Hugging Face model through attnkit without output_attentions (capture recomputes the
    weights once; no second copy of every layer): what it shows still equals transformers' own eager weights."""
    pytest.importorskip("transformers")
    from attnkit.diagnostics.report import report
    from attnkit.runs.source import hf_tiny

    torch.manual_seed(0)
    model = hf_tiny("hf-llama-tiny")  # 2 layers, 4 query heads on 2 KV heads, causal
    ids = torch.randint(3, 128, (1, 23))
    page = report(model, ids, out=None, doctor=False)
    assert "weights from attnkit capture (transformers attn_implementation='attnkit')" in page
    meta, blob = read_page(page)
    assert len(meta["layers"]) == 2 and meta["layers"][0]["Hkv"] == 2 and len(meta["masks"]) == 1  # causal
    model.set_attn_implementation("eager")
    with torch.no_grad():
        eager = model(input_ids=ids, output_attentions=True).attentions
    for l, layer in enumerate(meta["layers"]):
        for h, head in enumerate(layer["heads"]):
            err = np.abs(decode_head(blob, head, 23) - eager[l][0, h].double().numpy()).max()
            assert err <= 0.5 * STEP + 1e-5, f"layer {l} head {h}: {err:.3g}"

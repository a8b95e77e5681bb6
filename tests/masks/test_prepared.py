"""Prepared masks: bound once per forward, shared by every layer, never stale across calls (issue 11's
prepared mask; issue 16 items 1-2: memos keyed on memory addresses served the previous batch's mask)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import attnkit as ak
from attnkit.backends import cost, flex
from attnkit.errors import AttnkitTypeError, AttnkitValueError
from attnkit.masks import blocks
from attnkit.masks import prepared as prepared_module
from oracle import assert_within_rule

M = ak.masks


def qkv(B=1, L=9, H=2, D=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, L, D, generator=g) for _ in range(3))


def counting(monkeypatch):
    calls = []
    real = prepared_module.evaluate

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(prepared_module, "evaluate", spy)
    return calls


def check(got, q, k, v, mask, **kwargs):
    """``got`` (float32) against the float64 reference, with the float32 reference's error as the yardstick."""
    golden = ak.reference_attention(q.double(), k.double(), v.double(), mask, **kwargs)
    assert_within_rule(got, ak.reference_attention(q, k, v, mask, **kwargs), golden)


def test_a_prepared_mask_is_built_once_for_every_layer(monkeypatch):
    calls = counting(monkeypatch)
    q, k, v = qkv(B=2)
    pos = torch.arange(9) + 4
    mask = M.sliding_window(3) & M.padding(torch.tensor([7, 9]))
    pm = M.prepare(mask, pos, pos, batch=2)
    outs = [ak.attention(q, k, v, pm, backend="sdpa") for _ in range(4)]  # four "layers"
    assert len(calls) == 1
    for out in outs:
        check(out, q, k, v, mask, q_positions=pos, kv_positions=pos)


def test_a_plain_mask_is_bound_per_call_nothing_kept_across_calls(monkeypatch):
    calls = counting(monkeypatch)
    q, k, v = qkv()
    mask = M.sliding_window(3)
    for _ in range(3):
        ak.attention(q, k, v, mask, backend="sdpa")
    assert len(calls) == 3


def test_positions_from_a_numpy_buffer_refilled_in_place():
    """A data loader refilling one numpy buffer per batch: the version counter never moves (issue 16 item 1)."""
    q, k, v = qkv(L=16)
    buf = np.arange(16, dtype=np.int64)
    pos = torch.from_numpy(buf)
    mask = M.sliding_window(4)
    for batch in range(3):
        buf[:] = np.arange(16) * (batch + 1)  # batch 1: positions spread out, fewer keys inside the window
        for backend in ("sdpa", "blocksparse", "auto"):
            got = ak.attention(q, k, v, mask, q_positions=pos, kv_positions=pos, backend=backend)
            check(got, q, k, v, mask, q_positions=pos.clone(), kv_positions=pos.clone())


@pytest.mark.parametrize("edit", ["numpy", "data"])
def test_padding_edited_in_place_outside_autograd(edit):
    """A padding mask edited through numpy or ``.data`` between calls (issue 16 items 1-2)."""
    q, k, v = qkv(B=2, L=12)
    real = torch.ones(2, 12, dtype=torch.bool)
    mask = M.padding(real) & M.causal()
    first = ak.attention(q, k, v, mask, backend="sdpa")
    if edit == "numpy":
        real.numpy()[1, 5:] = False
    else:
        real.data[1, 5:] = False
    for backend in ("sdpa", "blocksparse", "math"):
        got = ak.attention(q, k, v, mask, backend=backend)
        check(got, q, k, v, M.padding(real.clone()) & M.causal())
    assert not torch.allclose(first, got)


def test_flex_block_mask_follows_padding_edited_in_place():
    """flex's block mask was cached per mask object and shape: an in-place edit kept the old blocks (item 2)."""
    q, k, v = qkv(L=256, D=16)
    real = torch.ones(1, 256, dtype=torch.bool)
    mask = M.padding(real)
    with torch.no_grad():
        ak.attention(q, k, v, mask, backend="flex")  # every block full: no mask_mod applied there
        real.numpy()[0, 130:] = False
        got = ak.attention(q, k, v, mask, backend="flex")
    check(got, q, k, v, M.padding(real.clone()))


def test_prepared_mask_wherever_a_mask_goes():
    q, k, v = qkv(B=2, L=10)
    mask = M.document(torch.tensor([[0] * 4 + [1] * 6, [0] * 10])) & M.causal()
    pm = M.prepare(mask, 10, batch=2)
    want = ak.reference_attention(q, k, v, mask)
    for backend in ("auto", "sdpa", "blocksparse", "math"):
        torch.testing.assert_close(ak.attention(q, k, v, pm, backend=backend), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ak.reference_attention(q, k, v, pm), want)
    out, w = ak.attention(q, k, v, pm, return_weights=True)
    assert (w[0, :, 5, :4] == 0).all()
    with cost.use(None):  # (by rank: at L = 10 the predicted times may prefer SDPA's dense mask)
        e = ak.explain(q, k, v, pm)  # causal documents: each one a causal sequence of its own (backends/varlen.py)
    assert e.chosen == "blocksparse" and "documents as separate causal sequences" in e.plan, str(e)
    tensor_pm = M.prepare(mask.to_dense(10, batch=2), 10)
    torch.testing.assert_close(ak.attention(q, k, v, tensor_pm, backend="blocksparse"), want, rtol=1e-5, atol=1e-6)


def test_prepared_positions_are_the_calls_positions():
    q, k, v = qkv(L=8)
    pos = torch.arange(8) * 2
    pm = M.prepare(M.sliding_window(3), pos)
    bias = ak.positions.ALiBi(2)
    want = ak.reference_attention(q, k, v, M.sliding_window(3), bias=bias, q_positions=pos, kv_positions=pos)
    torch.testing.assert_close(ak.attention(q, k, v, pm, bias=bias), want, rtol=1e-5, atol=1e-6)  # bias reads them
    torch.testing.assert_close(ak.attention(q, k, v, pm, bias=bias, q_positions=pos, kv_positions=pos), want,
                               rtol=1e-5, atol=1e-6)
    with pytest.raises(AttnkitValueError, match=r"q_positions .* differ from the positions the mask was prepared with"):
        ak.attention(q, k, v, pm, q_positions=torch.arange(8))


def test_prepared_mask_checks_the_call():
    q, k, v = qkv(L=8)
    with pytest.raises(AttnkitValueError, match=r"mask was prepared for batch 1, Lq=6, Lk=6 .* but the call has "
                                                r"batch 1, Lq=8, Lk=8"):
        ak.attention(q, k, v, M.prepare(M.causal(), 6))
    with pytest.raises(AttnkitTypeError, match="prepare expects an ak.masks mask or a bool tensor, got"):
        M.prepare("causal", 6)
    with pytest.raises(AttnkitTypeError, match="prepare expects an ak.masks mask or a bool tensor with at most 4 dims"):
        M.prepare(torch.ones(6, 6), 6)
    assert M.prepare(None, 6) is None
    pm = M.prepare(M.causal(), 6)
    assert M.prepare(pm, 6) is pm


def test_structure_and_default_positions():
    pm = M.prepare(M.causal() & M.document(torch.tensor([[0, 0, 1, 1]])) & M.padding(torch.tensor([3])), 4)
    s = pm.structure
    assert s.reach == (None, 0) and s.offsets is None and s.key_lengths.tolist() == [3]
    assert s.doc_ids[1].tolist() == [[0, 0, 1, 1]] and s.chunk is None
    assert M.prepare(M.chunked(4) & M.strided(2), 8).structure.chunk == 4
    assert M.prepare(M.chunked(4) & M.strided(2), 8).structure.stride == 2
    assert M.prepare(M.causal(), torch.arange(6)).pure_causal  # equal to the defaults: SDPA may flag it
    assert not M.prepare(M.causal(), torch.arange(6) + 1).pure_causal
    pm = M.prepare(M.causal(), 8)
    cover = blocks.cover(pm.spec, pm.grid(4))
    assert cover.any.tolist() == [[True, False], [True, True]] and cover.full.tolist() == [[False, False], [True, False]]


def test_a_mask_built_under_inference_mode_is_not_served_to_training():
    """Inference tensors can't enter autograd (rows 0-2 see no key here: zeros with finite gradients)."""
    q, k, v = torch.randn(3, 1, 2, 9, 8).unbind(0)
    k, v = k[:, :, :6], v[:, :, :6]
    pos = {"q_positions": torch.arange(-3, 6), "kv_positions": torch.arange(6)}  # queries 0-2 sit before every key
    with torch.inference_mode():
        ak.attention(q, k, v, M.causal(), backend="sdpa", **pos)
    q = q.clone().requires_grad_()
    out = ak.attention(q, k, v, M.causal(), backend="sdpa", **pos)
    out.sum().backward()
    assert torch.equal(out[:, :, :3], torch.zeros_like(out[:, :, :3])) and torch.isfinite(q.grad).all()


@pytest.fixture(autouse=True)
def _no_flex_opt_in():
    yield
    flex._STATE["cpu_compile"] = None

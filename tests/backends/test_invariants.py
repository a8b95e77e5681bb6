"""Invariants every backend must keep, whatever the numbers: equalities between requests that must agree."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attnkit as ak
from oracle import run_with_grads

M = ak.masks
# flex on CPU has no backward and compiles for seconds: it has its own few small tests (test_flex.py)
BACKENDS = [b for b in ak.backends.available() if b != "flex"]


def qkv(B=2, H=4, Hkv=2, Lq=17, Lk=17, D=16, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, Lq, D, generator=g).to(dtype), torch.randn(B, Hkv, Lk, D, generator=g).to(dtype),
            torch.randn(B, Hkv, Lk, D, generator=g).to(dtype))


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=15, deadline=None)
@given(L=st.integers(1, 40), extra=st.integers(0, 10))
def test_window_at_least_length_equals_causal(backend, L, extra):
    q, k, v = qkv(Lq=L, Lk=L)
    a = ak.attention(q, k, v, M.sliding_window(L + extra), backend=backend)
    b = ak.attention(q, k, v, M.causal(), backend=backend)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_document_equals_causal(backend):
    q, k, v = qkv()
    one_doc = M.document(torch.zeros(2, 17, dtype=torch.long)) & M.causal()
    torch.testing.assert_close(ak.attention(q, k, v, one_doc, backend=backend),
                               ak.attention(q, k, v, M.causal(), backend=backend), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_packed_equals_unpacked(backend):
    """Documents packed in one row with restarting positions == each document attended alone."""
    lengths = [5, 1, 8, 3]
    q, k, v = qkv(B=1, Lq=sum(lengths), Lk=sum(lengths))
    docs = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))[None]  # (1, L)
    pos = torch.cat([torch.arange(n) for n in lengths])  # positions restart at each document
    packed = ak.attention(q, k, v, M.document(docs) & M.causal(), q_positions=pos, kv_positions=pos,
                          bias=ak.positions.ALiBi(4), backend=backend)
    start = 0
    for n in lengths:
        s = slice(start, start + n)
        alone = ak.attention(q[:, :, s], k[:, :, s], v[:, :, s], M.causal(), bias=ak.positions.ALiBi(4), backend=backend)
        torch.testing.assert_close(packed[:, :, s], alone, rtol=1e-5, atol=1e-6)
        start += n


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("side", ["left", "right"])
def test_padding_contents_do_not_change_real_outputs(backend, side):
    q, k, v = qkv(B=2)
    L, pad = 17, torch.tensor([4, 0])
    idx = torch.arange(L)[None, :]
    real = idx >= pad[:, None] if side == "left" else idx < (L - pad)[:, None]  # (B, L)
    mask = M.padding(real) & M.causal() if side == "left" else M.padding(L - pad)
    base = ak.attention(q, k, v, mask, backend=backend)
    noise = torch.randn_like(k) * 100
    k2 = torch.where(real[:, None, :, None], k, noise)
    v2 = torch.where(real[:, None, :, None], v, noise)
    moved = ak.attention(q, k2, v2, mask, backend=backend)
    rows = real[:, None, :, None].expand_as(base)
    torch.testing.assert_close(base[rows], moved[rows], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gqa_equals_mha_with_repeated_heads(backend):
    q, k, v = qkv(H=4, Hkv=2)
    k_rep, v_rep = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)  # head h reads KV head h // 2
    torch.testing.assert_close(ak.attention(q, k, v, M.causal(), backend=backend),
                               ak.attention(q, k_rep, v_rep, M.causal(), backend=backend), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_causal_leak_impossible(backend):
    q, k, v = qkv(B=1, H=2, Hkv=2)
    out = ak.attention(q, k, v, M.causal(), backend=backend)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 9:], v2[:, :, 9:] = 1e3, -1e3
    out2 = ak.attention(q, k2, v2, M.causal(), backend=backend)
    assert torch.equal(out[:, :, :9], out2[:, :, :9])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("kind", ["spec", "tensor", "padding_all"])
def test_fully_masked_rows_are_zero_with_finite_grads(backend, dtype, kind):
    q, k, v = qkv(B=2, Lq=6, Lk=6, dtype=dtype)
    if kind == "spec":
        mask = M.causal() & ~M.sliding_window(3)  # rows 0..2 see nothing
        empty = torch.tensor([True, True, True, False, False, False])[None, None, :, None]
    elif kind == "tensor":
        mask = torch.ones(6, 6, dtype=torch.bool)
        mask[2] = False
        empty = (~mask.any(-1))[None, None, :, None]
    else:
        mask = M.padding(torch.tensor([0, 6]))  # batch row 0 is all padding
        empty = torch.tensor([True, False])[:, None, None, None]
    out, grads = run_with_grads(lambda q, k, v: ak.attention(q, k, v, mask, backend=backend), [q, k, v])
    assert torch.isfinite(out).all()
    assert (out.masked_select(empty.expand_as(out)) == 0).all()
    for grad in grads:
        assert torch.isfinite(grad).all()


def test_dropout_is_after_softmax_and_before_v():
    """out == dropout(probs) @ v with the same RNG state, probabilities are returned before dropout."""
    q, k, v = qkv(B=1, H=2, Hkv=2, Lq=8, Lk=8)
    torch.manual_seed(3)
    out, w = ak.attention(q, k, v, M.causal(), dropout_p=0.5, backend="math", return_weights=True)
    torch.manual_seed(3)
    dropped = torch.nn.functional.dropout(w, p=0.5)
    torch.testing.assert_close(out, dropped @ v)
    torch.testing.assert_close(w.sum(-1), torch.ones(1, 2, 8))


@pytest.mark.parametrize("backend", BACKENDS)
def test_dropout_keeps_mask_and_mean(backend):
    q, k, v = qkv(B=1, H=2, Hkv=2, Lq=4, Lk=4)
    v2 = v.clone()
    v2[:, :, 2:] = 50.0  # future values must not leak through dropout either
    clean = ak.attention(q, k, v, M.causal(), backend=backend)
    runs = torch.stack([ak.attention(q, k, v2, M.causal(), dropout_p=0.3, backend=backend) for _ in range(600)])
    assert runs[:, :, :, :2].abs().max() < 40  # rows 0, 1 never see the 50s
    torch.testing.assert_close(runs.mean(0)[:, :, :2], clean[:, :, :2], rtol=0.15, atol=0.15)

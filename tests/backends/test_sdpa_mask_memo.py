"""The SDPA backend builds a dense mask once for repeated calls with the same mask and positions (the layers
of one forward), and never serves a stale one."""

from __future__ import annotations

import torch

import attnkit as ak
from attnkit.backends import sdpa as sdpa_module

M = ak.masks


def counting(monkeypatch):
    calls = []
    real = sdpa_module.materialize

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(sdpa_module, "materialize", spy)
    return calls


def qkv(L=9):
    return torch.randn(3, 1, 2, L, 8).unbind(0)


def test_same_mask_and_positions_build_once(monkeypatch):
    calls = counting(monkeypatch)
    q, k, v = qkv()
    mask, pos = M.sliding_window(3) & M.padding(torch.tensor([7])), torch.arange(9) + 4
    outs = [ak.attention(q, k, v, mask, q_positions=pos, kv_positions=pos, backend="sdpa") for _ in range(4)]
    assert len(calls) == 1
    want = ak.reference_attention(q, k, v, mask, q_positions=pos, kv_positions=pos)
    for out in outs:
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)


def test_new_positions_or_mask_rebuild(monkeypatch):
    calls = counting(monkeypatch)
    q, k, v = qkv()
    mask = M.sliding_window(3)
    ak.attention(q, k, v, mask, q_positions=torch.arange(9), kv_positions=torch.arange(9), backend="sdpa")
    ak.attention(q, k, v, mask, q_positions=torch.arange(9), kv_positions=torch.arange(9), backend="sdpa")
    ak.attention(q, k, v, M.sliding_window(3), backend="sdpa")
    assert len(calls) == 3


def test_in_place_edits_of_mask_data_are_seen(monkeypatch):
    q, k, v = qkv()
    real = torch.ones(1, 9, dtype=torch.bool)
    mask = M.padding(real)
    first = ak.attention(q, k, v, mask, backend="sdpa")
    real[0, 4:] = False  # the user edits the padding in place
    second = ak.attention(q, k, v, mask, backend="sdpa")
    torch.testing.assert_close(second, ak.reference_attention(q, k, v, mask), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(first, second)


def test_custom_masks_are_not_memoised(monkeypatch):
    calls = counting(monkeypatch)
    q, k, v = qkv()
    mask = M.custom(lambda b, h, q_pos, kv_pos: kv_pos <= q_pos)
    for _ in range(3):
        ak.attention(q, k, v, mask, backend="sdpa")
    assert len(calls) == 3


def test_in_place_edits_of_positions_are_seen():
    q, k, v = qkv()
    pos = torch.arange(9)
    mask = M.sliding_window(2)
    ak.attention(q, k, v, mask, q_positions=pos, kv_positions=pos, backend="sdpa")
    pos[5:] += 3  # a gap: positions 5.. are now further away
    got = ak.attention(q, k, v, mask, q_positions=pos, kv_positions=pos, backend="sdpa")
    torch.testing.assert_close(got, ak.reference_attention(q, k, v, mask, q_positions=pos, kv_positions=pos),
                               rtol=1e-5, atol=1e-6)


def test_inference_tensors_are_served_without_memo():
    q, k, v = qkv()
    with torch.inference_mode():
        pos = torch.arange(9)
        got = ak.attention(q, k, v, M.sliding_window(2), q_positions=pos, kv_positions=pos, backend="sdpa")
    torch.testing.assert_close(got, ak.reference_attention(q, k, v, M.sliding_window(2)), rtol=1e-5, atol=1e-6)


def test_equal_position_rule_masks_share_the_dense_mask(monkeypatch):
    """A mask written inline (a new but equal object per call) is built once; a different rule rebuilds."""
    calls = counting(monkeypatch)
    q, k, v = qkv()
    for _ in range(3):
        out = ak.attention(q, k, v, (M.sliding_window(3) | M.global_tokens([0])) & M.causal(), backend="sdpa")
    assert len(calls) == 1
    want = ak.reference_attention(q, k, v, (M.sliding_window(3) | M.global_tokens([0])) & M.causal())
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)
    ak.attention(q, k, v, (M.sliding_window(4) | M.global_tokens([0])) & M.causal(), backend="sdpa")
    ak.attention(q, k, v, (M.sliding_window(4) | M.global_tokens([1])) & M.causal(), backend="sdpa")
    assert len(calls) == 3
    ak.attention(q, k, v, M.sliding_window(4) & M.padding(torch.tensor([7])), backend="sdpa")
    ak.attention(q, k, v, M.sliding_window(4) & M.padding(torch.tensor([7])), backend="sdpa")
    assert len(calls) == 5  # masks holding tensors are matched by identity only


def test_a_mask_built_under_inference_mode_is_not_served_to_training():
    """Inference tensors can't enter autograd: the memo keys on inference mode (rows 0-2 see no key here)."""
    q, k, v = torch.randn(3, 1, 2, 9, 8).unbind(0)
    k, v = k[:, :, :6], v[:, :, :6]
    pos = {"q_positions": torch.arange(-3, 6), "kv_positions": torch.arange(6)}  # queries 0-2 sit before every key
    with torch.inference_mode():
        ak.attention(q, k, v, M.causal(), backend="sdpa", **pos)
    q = q.clone().requires_grad_()
    out = ak.attention(q, k, v, M.causal(), backend="sdpa", **pos)
    out.sum().backward()
    assert torch.equal(out[:, :, :3], torch.zeros_like(out[:, :, :3])) and torch.isfinite(q.grad).all()

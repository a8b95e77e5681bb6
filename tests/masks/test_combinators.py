"""``&`` and ``|`` are sibling combinators with one way to ask for conjuncts (issue 11, defect 1: ``Or`` was a
subclass of ``And``, so LinearAttention read ``causal() | padding(x)`` as ``causal() & padding(x)``)."""

from __future__ import annotations

import pytest
import torch

import attnkit as ak
from attnkit.errors import BackendUnsupportedError

M = ak.masks


def dense_linear_reference(layer, x, mask):
    """Linear attention written as its quadratic form with the mask's dense tensor, float64: ``(B, L, E)``."""
    B, L, _ = x.shape
    H, Hkv, D = layer.num_heads, layer.num_kv_heads, layer.head_dim
    q, k, v = layer.qkv_proj(x).double().split([H * D, Hkv * D, Hkv * D], dim=-1)
    q = q.view(B, L, H, D).transpose(1, 2)  # (B, H, L, D)
    k = k.view(B, L, Hkv, D).transpose(1, 2).repeat_interleave(H // Hkv, dim=1)  # (B, H, L, D)
    v = v.view(B, L, Hkv, D).transpose(1, 2).repeat_interleave(H // Hkv, dim=1)  # (B, H, L, D)
    phi = lambda t: torch.nn.functional.elu(t) + 1  # noqa: E731
    scores = (phi(q) @ phi(k).transpose(-2, -1)) * mask.to_dense(L, batch=B)  # (B, H, L, L), masked terms 0
    out = (scores / (scores.sum(-1, keepdim=True) + layer.eps)) @ v  # (B, H, L, D)
    return layer.out_proj.double()(out.transpose(1, 2).reshape(B, L, H * D))  # (B, L, E)


def test_or_is_not_read_as_and_by_linear_attention():
    torch.manual_seed(0)
    layer = ak.nn.LinearAttention(16, 2).double()
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    lengths = torch.tensor([7, 4])
    conj, disj = M.causal() & M.padding(lengths), M.causal() | M.padding(lengths)
    assert not torch.equal(conj.to_dense(7, batch=2), disj.to_dense(7, batch=2))  # the two really differ
    with torch.no_grad():
        torch.testing.assert_close(layer(x, conj), dense_linear_reference(layer, x, conj))
        # one running state can't express "causal OR real": a typed refusal, never the & result
        with pytest.raises(BackendUnsupportedError, match=r"LinearAttention serves masks built from causal.*\|"):
            layer(x, disj)


def test_combinators_are_siblings_with_one_conjuncts_answer():
    a, b, c = M.causal(), M.padding(torch.tensor([3])), M.sliding_window(2)
    both, either = a & b, a | b
    assert isinstance(both, M.And) and isinstance(either, M.Or)
    assert not isinstance(either, M.And) and not isinstance(both, M.Or)
    assert (both & c).conjuncts() == (a, b, c)  # nested & flattened
    assert either.conjuncts() == (either,) and (either & c).conjuncts() == (either, c)
    n = ~a
    assert n.conjuncts() == (n,) and a.conjuncts() == (a,)


def test_reach_bounds_every_combination():
    assert M.causal().reach() == (None, 0)
    assert (M.causal() & M.padding(torch.tensor([3]))).reach() == (None, 0)  # not exact, still bounded
    assert (M.sliding_window(4) | M.causal()).reach() == (None, 0)
    assert (M.sliding_window(4) | M.global_tokens([0])).reach() == (None, None)
    assert (M.sliding_window(4) & M.causal()).reach() == (-3, 0)
    assert (~M.causal()).reach() == (None, None)

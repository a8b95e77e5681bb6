"""MultiHeadAttention: equals the reference composition, torch's MHA, and wires positions correctly."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import attnkit as ak
from attnkit.errors import AttnkitTypeError, AttnkitValueError

M = ak.masks


def manual_forward(mha: ak.nn.MultiHeadAttention, x, mask, positions=None):
    """The module's math written out with the float64 reference."""
    B, L, E = x.shape
    q, k, v = mha.project(x, positions)  # RoPE applied inside project
    out = ak.reference_attention(q, k, v, mask, bias=mha.alibi, q_positions=positions, kv_positions=positions)
    return mha.out_proj(out.transpose(1, 2).reshape(B, L, -1))


@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (4, 2), (4, 1)])
@pytest.mark.parametrize("positions", [None, "rope", "alibi"])
def test_module_matches_reference_composition(heads, kv_heads, positions):
    torch.manual_seed(0)
    mha = ak.nn.MultiHeadAttention(32, heads, num_kv_heads=kv_heads, positions=positions).double()
    x = torch.randn(2, 11, 32, dtype=torch.float64)
    pos = torch.arange(11) + 7
    for mask in (None, M.causal(), M.sliding_window(4) & M.padding(torch.tensor([11, 6]))):
        torch.testing.assert_close(mha(x, mask, positions=pos), manual_forward(mha, x, mask, pos.view(1, -1)))


def test_drop_in_for_torch_multihead_attention():
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(32, 4, batch_first=True).eval()
    ours = ak.nn.MultiHeadAttention.from_torch(ref).eval()
    x = torch.randn(3, 9, 32)
    key_padding_mask = torch.tensor([[False] * 9, [False] * 6 + [True] * 3, [False] * 2 + [True] * 7])  # True = pad
    causal = torch.ones(9, 9, dtype=torch.bool).triu(1)  # torch: True = blocked
    want, _ = ref(x, x, x, key_padding_mask=key_padding_mask, attn_mask=causal, need_weights=False)
    got = ours(x, M.padding(~key_padding_mask) & M.causal())
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_returned_weights_and_shapes():
    mha = ak.nn.MultiHeadAttention(24, 6, num_kv_heads=2, head_dim=5)
    x = torch.randn(2, 7, 24)
    out, w = mha(x, M.causal(), return_weights=True)
    assert out.shape == (2, 7, 24) and w.shape == (2, 6, 7, 7)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 6, 7))
    assert (w.triu(1) == 0).all()
    assert mha.qkv_proj.weight.shape == ((6 + 2 * 2) * 5, 24)


def test_dropout_only_in_training():
    mha = ak.nn.MultiHeadAttention(16, 2, dropout=0.5)
    x = torch.randn(1, 6, 16)
    mha.eval()
    torch.testing.assert_close(mha(x), mha(x))
    mha.train()
    torch.manual_seed(1)
    a = mha(x)
    torch.manual_seed(2)
    assert not torch.allclose(a, mha(x))


def test_init_std():
    torch.manual_seed(0)
    mha = ak.nn.MultiHeadAttention(256, 4, init_std=0.02)
    assert abs(float(mha.qkv_proj.weight.detach().std()) - 0.02) < 0.001
    assert float(mha.qkv_proj.bias.detach().abs().max()) == 0.0


def test_rope_makes_scores_relative():
    """Shifting all positions by a constant leaves a RoPE module's output unchanged."""
    mha = ak.nn.MultiHeadAttention(32, 4, positions="rope").double()
    x = torch.randn(1, 9, 32, dtype=torch.float64)
    torch.testing.assert_close(mha(x, M.causal()), mha(x, M.causal(), positions=torch.arange(9) + 1000))


def test_gradients_flow():
    mha = ak.nn.MultiHeadAttention(16, 4, num_kv_heads=2, positions="rope")
    x = torch.randn(2, 5, 16, requires_grad=True)
    mha(x, M.causal()).sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in mha.parameters())


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"embed_dim": 30, "num_heads": 4}, AttnkitValueError, "embed_dim=30 must be divisible by num_heads=4"),
        ({"num_kv_heads": 3}, AttnkitValueError, "num_heads=4 must be a multiple of num_kv_heads=3"),
        ({"num_heads": 0}, AttnkitValueError, "num_heads must be a positive int"),
        ({"head_dim": -2}, AttnkitValueError, "head_dim must be a positive int"),
        ({"dropout": 1.5}, AttnkitValueError, r"dropout must be in \[0, 1\), got 1.5"),
        ({"backend": "nope"}, AttnkitValueError, "unknown backend 'nope'"),
        ({"positions": "sinusoidal"}, AttnkitTypeError, "added to token embeddings by the model"),
        ({"positions": ak.positions.ALiBi(2)}, AttnkitValueError, r"ALiBi has num_heads=2 but the module has"),
        ({"positions": ak.positions.RoPE(16)}, AttnkitValueError, "RoPE has head_dim=16 but the heads have head_dim=8"),
    ],
)
def test_constructor_errors(kwargs, error, match):
    args = {"embed_dim": 32, "num_heads": 4}
    args.update(kwargs)
    with pytest.raises(error, match=match):
        ak.nn.MultiHeadAttention(args.pop("embed_dim"), args.pop("num_heads"), **args)


def test_forward_errors():
    mha = ak.nn.MultiHeadAttention(16, 2)
    with pytest.raises(AttnkitValueError, match=r"x must have shape \(B, L, embed_dim=16\)"):
        mha(torch.randn(5, 16))
    with pytest.raises(AttnkitValueError, match=r"positions must have shape \(5,\) or \(1, 5\)"):
        mha(torch.randn(1, 5, 16), positions=torch.arange(4))
    with pytest.raises(AttnkitTypeError, match="from_torch expects an nn.MultiheadAttention"):
        ak.nn.MultiHeadAttention.from_torch(nn.Linear(2, 2))

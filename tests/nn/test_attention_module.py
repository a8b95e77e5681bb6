"""MultiHeadAttention: equals the reference composition, torch's MHA in every configuration (cross-attention,
kdim/vdim, bias, add_bias_kv, add_zero_attn, batch_first), and wires its injected parts correctly."""

from __future__ import annotations

import itertools
import warnings

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
    out = ak.reference_attention(q, k, v, mask, bias=mha.score_bias, q_positions=positions, kv_positions=positions)
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
        ({"rotary": ak.positions.RoPE(16)}, AttnkitValueError, "rotary RoPE has head_dim=16 but the heads have"),
        ({"rotary": 3}, AttnkitTypeError, "rotary must be a module f"),
        ({"score_bias": torch.zeros(4)}, AttnkitTypeError, "score_bias must be a structured bias"),
        ({"score_bias": ak.positions.ALiBi(2)}, AttnkitValueError, "score_bias ALiBi has num_heads=2 but the module"),
        ({"positions": "rope", "rotary": ak.positions.RoPE(8)}, AttnkitValueError, "shorthand for rotary=/score_bias="),
        ({"positions": "rope", "add_bias_kv": True}, NotImplementedError, "cannot be combined with rotary= or score_bias"),
        ({"kdim": 0}, AttnkitValueError, "kdim must be a positive int"),
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
    with pytest.raises(AttnkitValueError, match=r"context must have shape \(B=1, L, kdim=16\)"):
        mha(torch.randn(1, 5, 16), context=torch.randn(2, 3, 16))
    with pytest.raises(AttnkitValueError, match="value= needs context="):
        mha(torch.randn(1, 5, 16), value=torch.randn(1, 3, 16))
    with pytest.raises(AttnkitValueError, match="cache= with context=: a cross-attention's keys are the context"):
        mha(torch.randn(1, 5, 16), context=torch.randn(1, 3, 16), positions=torch.arange(5), cache=object())
    cross = ak.nn.MultiHeadAttention(16, 2, kdim=6, vdim=4)
    with pytest.raises(AttnkitValueError, match="it is a cross-attention; pass context="):
        cross(torch.randn(1, 5, 16))
    with pytest.raises(AttnkitValueError, match="value has 2 tokens but context has 3"):
        cross(torch.randn(1, 5, 16), context=torch.randn(1, 3, 6), value=torch.randn(1, 2, 4))
    extra = ak.nn.MultiHeadAttention(16, 2, add_zero_attn=True)
    with pytest.raises(AttnkitValueError, match="cache= is not supported with add_bias_kv/add_zero_attn"):
        extra(torch.randn(1, 5, 16), positions=torch.arange(5), cache=ak.cache.make_cache("dynamic", 1, 2, 8))
    with pytest.raises(AttnkitValueError, match="batch_first=False: attnkit modules only take"):
        ak.nn.MultiHeadAttention.from_torch(nn.MultiheadAttention(16, 2), batch_first=False)


# ------------------------------------------------------------------------ every nn.MultiheadAttention config

TORCH_CONFIGS = list(itertools.product([None, (6, 10)], [True, False], [False, True], [False, True], [True, False]))


def _torch_id(cfg):
    dims, bias, bias_kv, zero, batch_first = cfg
    return (f"{'kv' + str(dims) if dims else 'same'}-bias{int(bias)}-biaskv{int(bias_kv)}-zero{int(zero)}-"
            f"bf{int(batch_first)}").replace(" ", "")


@pytest.mark.parametrize("cfg", TORCH_CONFIGS, ids=_torch_id)
def test_from_torch_matches_every_configuration(cfg):
    dims, bias, bias_kv, zero, batch_first = cfg
    torch.manual_seed(0)
    kdim, vdim = dims or (None, None)
    ref = nn.MultiheadAttention(24, 4, bias=bias, add_bias_kv=bias_kv, add_zero_attn=zero, kdim=kdim, vdim=vdim,
                                batch_first=batch_first).eval()
    if bias:
        with torch.no_grad():  # torch zero-initialises its biases: make them count
            ref.in_proj_bias.normal_()
            ref.out_proj.bias.normal_()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours = ak.nn.MultiHeadAttention.from_torch(ref).eval()
    assert any("batch_first=False" in str(w.message) for w in caught) == (not batch_first)
    B, Lq, Lk = 3, 7, 5
    x = torch.randn(B, Lq, 24)
    key = torch.randn(B, Lk, kdim or 24)
    value = torch.randn(B, Lk, vdim or 24)
    kpm = torch.zeros(B, Lk, dtype=torch.bool)
    kpm[1, 3:] = True  # torch: True = padded
    blocked = torch.rand(Lq, Lk) < 0.3
    blocked[:, 0] = False  # no fully masked row (torch gives NaN there)
    cases = [(None, None, None), (kpm, None, M.padding(~kpm)), (None, blocked, M.dense(~blocked)),
             (kpm, blocked, M.padding(~kpm) & M.dense(~blocked))]
    if dims is None:
        cases.append(("self", None, None))
    for kpm_t, attn_mask, mask in cases:
        self_attn = isinstance(kpm_t, str)
        kpm_t = None if self_attn else kpm_t
        q_in, k_in, v_in = (x, x, x) if self_attn else (x, key, value)
        t = (lambda a: a) if batch_first else (lambda a: a.transpose(0, 1))
        want, _ = ref(t(q_in), t(k_in), t(v_in), key_padding_mask=kpm_t, attn_mask=attn_mask, need_weights=False)
        want = t(want)
        got = ours(x, mask) if self_attn else ours(x, mask, context=key, value=value)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        if mask is not None and (bias_kv or zero):  # a mask prepared once per forward serves the extra keys too
            prepared = M.prepare(mask, torch.arange(Lq), torch.arange(x.shape[1] if self_attn else Lk), batch=B)
            got = ours(x, prepared) if self_attn else ours(x, prepared, context=key, value=value)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_cross_attention_matches_the_reference_with_positions_and_gqa():
    torch.manual_seed(0)
    mha = ak.nn.MultiHeadAttention(32, 4, num_kv_heads=2, kdim=12, vdim=20, positions="alibi").double()
    x, ctx, val = (torch.randn(2, n, d, dtype=torch.float64) for n, d in ((6, 32), (9, 12), (9, 20)))
    pos, ctx_pos = torch.arange(6) + 3, torch.arange(9)
    mask = M.causal()  # on positions: query at p sees context tokens at <= p
    got = mha(x, mask, context=ctx, value=val, positions=pos, context_positions=ctx_pos)
    q, k, v = mha.project(x, pos[None], context=ctx, value=val, context_positions=ctx_pos[None])
    want = ak.reference_attention(q, k, v, mask, bias=mha.score_bias, q_positions=pos, kv_positions=ctx_pos)
    torch.testing.assert_close(got, mha.out_proj(want.transpose(1, 2).reshape(2, 6, -1)))
    assert q.shape == (2, 4, 6, 8) and k.shape == v.shape == (2, 2, 9, 8)


def test_injected_rotary_and_qk_norm_are_applied_in_order():
    """q_norm/k_norm act per head before the rotary slot; a custom rotary module is called for q and k."""
    calls = []

    class Shift(nn.Module):  # any q/k transform: here a sign flip, recorded
        def forward(self, x, positions):
            calls.append(tuple(x.shape))
            return -x

    mha = ak.nn.MultiHeadAttention(16, 4, num_kv_heads=2, rotary=Shift(), q_norm=nn.RMSNorm(4), k_norm=nn.RMSNorm(4))
    x = torch.randn(2, 5, 16)
    q, k, v = mha.project(x)
    assert calls == [(2, 4, 5, 4), (2, 2, 5, 4)]
    plain = ak.nn.MultiHeadAttention(16, 4, num_kv_heads=2)
    plain.load_state_dict(mha.state_dict(), strict=False)
    q0, k0, v0 = plain.project(x)
    torch.testing.assert_close(q, -nn.functional.rms_norm(q0, (4,), mha.q_norm.weight))
    torch.testing.assert_close(k, -nn.functional.rms_norm(k0, (4,), mha.k_norm.weight))
    torch.testing.assert_close(v, v0)


def test_qk_norm_with_rope_rotates_keys_at_their_own_positions():
    """QK-norm takes the unfused rotary path: keys must still turn at the given positions (a cache's decode step
    gives positions far from arange)."""
    torch.manual_seed(0)
    mha = ak.nn.MultiHeadAttention(16, 4, positions="rope", q_norm=nn.RMSNorm(4), k_norm=nn.RMSNorm(4)).double()
    x = torch.randn(1, 6, 16, dtype=torch.float64)
    torch.testing.assert_close(mha(x, M.causal()), mha(x, M.causal(), positions=torch.arange(6) + 50))

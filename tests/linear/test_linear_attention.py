"""Linear attention: parallel == chunked == recurrent (outputs, states, gradients), no causal leak, padding
ignored, decoding with the state equals the full forward."""

from __future__ import annotations

import pytest
import torch

import attnkit as ak
from attnkit.errors import AttnkitTypeError, AttnkitValueError, BackendUnsupportedError
from attnkit.functional.linear import LinearState, linear_attention
from oracle import assert_within_rule, run_with_grads

M = ak.masks


def qkv(B=2, H=4, Hkv=2, L=37, D=16, Dv=8, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, L, D, generator=g).to(dtype), torch.randn(B, Hkv, L, D, generator=g).to(dtype),
            torch.randn(B, Hkv, L, Dv, generator=g).to(dtype))


def naive(q, k, v, causal=True, eps=1e-6):
    """The paper's formula written directly, float64, one query at a time."""
    fq, fk = torch.nn.functional.elu(q.double()) + 1, torch.nn.functional.elu(k.double()) + 1
    G = q.shape[1] // k.shape[1]
    fk, vv = fk.repeat_interleave(G, 1), v.double().repeat_interleave(G, 1)
    out = torch.empty(*q.shape[:3], v.shape[-1], dtype=torch.float64)
    for i in range(q.shape[2]):
        stop = i + 1 if causal else q.shape[2]
        num = torch.einsum("bhd,bhjd,bhje->bhe", fq[:, :, i], fk[:, :, :stop], vv[:, :, :stop])
        den = torch.einsum("bhd,bhjd->bh", fq[:, :, i], fk[:, :, :stop])[..., None]
        out[:, :, i] = num / (den + eps)
    return out


@pytest.mark.parametrize("causal", [True, False])
def test_parallel_matches_the_paper_formula(causal):
    q, k, v = qkv(dtype=torch.float64, L=11)
    torch.testing.assert_close(linear_attention(q, k, v, causal=causal, mode="parallel"), naive(q, k, v, causal))


@pytest.mark.parametrize("mode", ["chunked", "recurrent"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize(("L", "chunk"), [(1, 4), (7, 3), (37, 8), (64, 16), (65, 64)])
@pytest.mark.parametrize(("H", "Hkv"), [(4, 4), (4, 2), (4, 1)])
def test_modes_agree_outputs_states_and_grads(mode, dtype, L, chunk, H, Hkv):
    q, k, v = qkv(L=L, H=H, Hkv=Hkv, dtype=dtype)

    def run(q, k, v, which):
        out, state = linear_attention(q, k, v, mode=which, chunk_size=chunk, return_state=True)
        return torch.cat([out.flatten(), state.kv.flatten().to(out.dtype), state.k_sum.flatten().to(out.dtype)])

    got, got_grads = run_with_grads(lambda q, k, v: run(q, k, v, mode), [q, k, v])
    ref, ref_grads = run_with_grads(lambda q, k, v: run(q, k, v, "parallel"), [q, k, v])
    gold, gold_grads = run_with_grads(lambda q, k, v: run(q, k, v, "parallel"), [q.double(), k.double(), v.double()])
    assert_within_rule(got, ref, gold, what=f"{mode} output+state")
    for name, g, r, gg in zip("qkv", got_grads, ref_grads, gold_grads):
        assert_within_rule(g, r, gg, factor=3.0, what=f"{mode} grad {name}")


def test_state_carries_across_calls():
    q, k, v = qkv(L=40)
    full = linear_attention(q, k, v, mode="parallel")
    state, outs = None, []
    for start, stop in [(0, 13), (13, 14), (14, 31), (31, 40)]:
        s = slice(start, stop)
        out, state = linear_attention(q[:, :, s], k[:, :, s], v[:, :, s], state=state, return_state=True, chunk_size=5)
        outs.append(out)
    torch.testing.assert_close(torch.cat(outs, dim=2), full, rtol=1e-5, atol=1e-6)
    assert state.length == 40 and state.kv.dtype == torch.float32


@pytest.mark.parametrize("mode", ["parallel", "chunked", "recurrent"])
def test_causal_leak_impossible(mode):
    q, k, v = qkv(L=20)
    out = linear_attention(q, k, v, mode=mode, chunk_size=8)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 11:], v2[:, :, 11:] = 5.0, -7.0
    out2 = linear_attention(q, k2, v2, mode=mode, chunk_size=8)
    assert torch.equal(out[:, :, :11], out2[:, :, :11])


@pytest.mark.parametrize("causal", [True, False])
def test_padded_keys_are_ignored(causal):
    q, k, v = qkv(B=1, L=12)
    real = torch.tensor([[True] * 9 + [False] * 3])
    out = linear_attention(q, k, v, causal=causal, key_is_real=real, chunk_size=4)
    short = linear_attention(q[:, :, :9], k[:, :, :9], v[:, :, :9], causal=causal, chunk_size=4)
    torch.testing.assert_close(out[:, :, :9], short, rtol=1e-5, atol=1e-6)


def test_normaliser_never_divides_by_zero():
    q, k, v = qkv(L=6)
    out = linear_attention(-q.abs() - 1, k, v, feature_map="relu")  # all query features are 0
    assert torch.isfinite(out).all() and (out == 0).all()


def test_fp32_state_under_bf16_autocast():
    q, k, v = qkv(L=9)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, state = linear_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), return_state=True)
    assert state.kv.dtype == torch.float32 and out.dtype == torch.bfloat16


def test_custom_feature_map():
    q, k, v = qkv(L=5, dtype=torch.float64)
    a = linear_attention(q, k, v, feature_map=lambda x: torch.nn.functional.elu(x) + 1)
    torch.testing.assert_close(a, linear_attention(q, k, v))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"feature_map": "softmax"}, AttnkitValueError, "feature_map must be one of"),
        ({"eps": 0.0}, AttnkitValueError, "eps must be > 0.0, got 0.0"),
        ({"chunk_size": 0}, AttnkitValueError, "chunk_size must be a positive int"),
        ({"mode": "fast"}, AttnkitValueError, "mode must be one of"),
        ({"causal": False, "return_state": True}, AttnkitValueError, "state/return_state need causal=True"),
        ({"key_is_real": torch.ones(2, 5)}, AttnkitTypeError, r"key_is_real must be a bool tensor of shape \(2, 9\)"),
        ({"state": LinearState.zeros(2, 3, 16, 8)}, AttnkitValueError, r"state holds kv of shape \(2, 3, 16, 8\)"),
    ],
)
def test_errors(kwargs, error, match):
    q, k, v = qkv(L=9)
    with pytest.raises(error, match=match):
        linear_attention(q, k, v, **kwargs)


def test_length_mismatch_error():
    q, k, v = qkv(L=9)
    with pytest.raises(AttnkitValueError, match="needs q and k of one length"):
        linear_attention(q[:, :, :3], k, v)


# ------------------------------------------------------------------------------------------ the module


def test_module_decoding_with_cache_equals_full_forward():
    torch.manual_seed(0)
    layer = ak.nn.LinearAttention(32, 4, num_kv_heads=2, chunk_size=4).double()
    x = torch.randn(2, 15, 32, dtype=torch.float64)
    full = layer(x, M.causal())
    cache, outs = layer.new_cache(2), []
    for start, stop in [(0, 6), (6, 7), (7, 8), (8, 15)]:
        outs.append(layer(x[:, start:stop], M.causal(), cache=cache))
    torch.testing.assert_close(torch.cat(outs, dim=1), full)
    assert cache.length == 15


def test_module_padding_and_weights():
    layer = ak.nn.LinearAttention(16, 2)
    x = torch.randn(2, 7, 16)
    mask = M.padding(torch.tensor([7, 4])) & M.causal()
    out, w = layer(x, mask, return_weights=True)
    assert out.shape == (2, 7, 16) and w.shape == (2, 2, 7, 7)
    assert (w[1, :, :, 4:] == 0).all() and (w.triu(1) == 0).all()
    torch.testing.assert_close(w[0].sum(-1), torch.ones(2, 7), rtol=1e-4, atol=1e-4)
    moved = x.clone()
    moved[1, 4:] = 100.0
    torch.testing.assert_close(layer(moved, mask)[1, :4], out[1, :4])


def test_module_refuses_masks_it_cannot_express():
    layer = ak.nn.LinearAttention(16, 2)
    with pytest.raises(BackendUnsupportedError, match="LinearAttention serves masks built from causal"):
        layer(torch.randn(1, 4, 16), M.sliding_window(2))
    with pytest.raises(BackendUnsupportedError, match="returns weights only without a cache"):
        layer(torch.randn(1, 4, 16), M.causal(), cache=layer.new_cache(1), return_weights=True)
    with pytest.raises(AttnkitValueError, match="needs a causal mask"):
        layer(torch.randn(1, 4, 16), None, cache=layer.new_cache(1))
    with pytest.raises(AttnkitValueError, match="takes no positions scheme"):
        ak.nn.LinearAttention(16, 2, positions="rope")
    with pytest.raises(AttnkitValueError, match=r"x must have shape \(B, L, embed_dim=16\)"):
        layer(torch.randn(4, 16))
    with pytest.raises(AttnkitValueError, match=r"dropout must be in \[0, 1\)"):
        ak.nn.LinearAttention(16, 2, dropout=-0.1)

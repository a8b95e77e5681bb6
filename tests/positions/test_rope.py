"""RoPE: the relative-position property, exactness against an independent complex-number formula, the two
pairing styles and their converter, scaling (linear, NTK, YaRN), dtypes, agreement with Hugging Face
LLaMA's rotary embedding, and every error message.

Shape legend: B batch, H heads, Hkv key/value heads, L length, D head_dim, E embed_dim.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnkit.errors import AttnkitTypeError, AttnkitValueError
from attnkit.positions import LinearScaling, Llama3Scaling, NTKScaling, RoPE, YaRNScaling, convert_rope_layout
from attnkit.positions.rope_scaling import rope_inv_freq, scaling_from_dict

SCALINGS = [None, LinearScaling(2.0), NTKScaling(4.0), YaRNScaling(4.0, original_max_positions=64),
            Llama3Scaling(8.0, original_max_positions=64)]
SCALING_IDS = ["none", "linear", "ntk", "yarn", "llama3"]


def golden_rope(x: torch.Tensor, positions: torch.Tensor, base: float, style: str) -> torch.Tensor:
    """Independent float64 spec: each channel pair is a complex number multiplied by exp(i * p * theta_k)."""
    D = x.shape[-1]
    theta = torch.tensor([base ** (-2 * k / D) for k in range(D // 2)], dtype=torch.float64)  # (D/2,)
    x = x.double()
    if style == "half":
        z = torch.complex(x[..., : D // 2], x[..., D // 2:])  # (B, H, L, D/2)
    else:
        z = torch.complex(x[..., 0::2], x[..., 1::2])  # (B, H, L, D/2)
    rot = torch.polar(torch.ones_like(theta), positions.double().reshape(-1, 1, positions.shape[-1], 1) * theta)
    z = z * rot  # (B, H, L, D/2)
    if style == "half":
        return torch.cat((z.real, z.imag), dim=-1)  # (B, H, L, D)
    return torch.stack((z.real, z.imag), dim=-1).flatten(-2)  # (B, H, L, D/2, 2) -> (B, H, L, D)


# ------------------------------------------------------------------------------------------- exactness, invariants


@pytest.mark.parametrize("style", ["half", "interleaved"])
@pytest.mark.parametrize("D,L", [(2, 1), (8, 7), (64, 65), (128, 129)])
def test_matches_complex_formula_float64(style, D, L):
    g = torch.Generator().manual_seed(D + L)
    x = torch.randn(2, 3, L, D, generator=g, dtype=torch.float64)
    positions = torch.arange(L) * 37 + 5  # non-contiguous, large positions
    out = RoPE(D, base=500000.0, style=style)(x, positions)
    torch.testing.assert_close(out, golden_rope(x, positions, 500000.0, style), rtol=0, atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(
    D=st.sampled_from([2, 4, 16, 64]),
    style=st.sampled_from(["half", "interleaved"]),
    scaling=st.sampled_from(SCALINGS),
    m=st.integers(0, 20000),
    n=st.integers(0, 20000),
    shift=st.integers(-20000, 20000),
    seed=st.integers(0, 2**16),
)
def test_scores_depend_only_on_position_difference(D, style, scaling, m, n, shift, seed):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, 1, 1, 1, D, generator=g, dtype=torch.float64)  # each (1, 1, 1, D)
    rope = RoPE(D, style=style, scaling=scaling)

    def score(pq: int, pk: int) -> float:
        return float((rope(q, torch.tensor([pq])) * rope(k, torch.tensor([pk]))).sum())

    # angles are O(4e4) rad; float64 rounds them to ~1e-11 rad
    tol = 1e-9 * float(q.norm() * k.norm()) * rope.attention_factor**2
    assert abs(score(m, n) - score(m + shift, n + shift)) <= tol


@pytest.mark.parametrize("style", ["half", "interleaved"])
@pytest.mark.parametrize("scaling", SCALINGS, ids=SCALING_IDS)
def test_rotation_preserves_norm_and_position_zero_is_identity(style, scaling):
    rope = RoPE(32, style=style, scaling=scaling)
    x = torch.randn(2, 4, 50, 32, dtype=torch.float64)
    af = rope.attention_factor  # 1 except YaRN, which scales cos and sin (so every vector) by mscale
    out = rope(x, torch.arange(50) * 101)
    torch.testing.assert_close(out.norm(dim=-1), af * x.norm(dim=-1), rtol=1e-12, atol=0)
    torch.testing.assert_close(rope(x, torch.zeros(50, dtype=torch.long)), af * x, rtol=0, atol=0)


@pytest.mark.parametrize("style", ["half", "interleaved"])
def test_batched_positions_equal_per_row_calls(style):
    rope = RoPE(16, style=style, scaling=LinearScaling(2.0))
    x = torch.randn(3, 2, 9, 16)
    positions = torch.stack([torch.arange(9), torch.arange(9) + 100, torch.arange(9).flip(0) * 7])  # (B, L)
    out = rope(x, positions)
    for b in range(3):
        torch.testing.assert_close(out[b: b + 1], rope(x[b: b + 1], positions[b]), rtol=0, atol=0)
    # (1, L) broadcasts like (L,), and the default is arange(L)
    torch.testing.assert_close(rope(x, torch.arange(9)[None]), rope(x, torch.arange(9)), rtol=0, atol=0)
    torch.testing.assert_close(rope(x), rope(x, torch.arange(9)), rtol=0, atol=0)


def naive_rope(x: torch.Tensor, positions: torch.Tensor, base: float, dtype: torch.dtype) -> torch.Tensor:
    """The usual implementation run entirely in ``dtype`` (half style): the ref_T of the docs/conventions.md tolerance rule."""
    D = x.shape[-1]
    inv_freq = (1.0 / base ** (torch.arange(0, D, 2, dtype=torch.float64) / D)).to(dtype)  # (D/2,)
    angles = positions.to(dtype)[:, None] * inv_freq  # (L, D/2)
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()  # (L, D)
    x = x.to(dtype)
    rotated = torch.cat((-x[..., D // 2:], x[..., : D // 2]), dim=-1)  # (B, H, L, D)
    return x * cos + rotated * sin


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_low_precision_within_design_tolerance(dtype):
    # docs/conventions.md rule: max|out - golden| <= 2 * max|ref_T - golden| + floor, golden in float64 on the same input.
    # attnkit computes in float32 and rounds once, so for bf16/fp16 it is far inside the bound; for fp32 it is
    # the naive formula itself (ratio ~1). floor = eps(T) * max|golden|, one rounding of the output.
    x = torch.randn(2, 4, 129, 64).to(dtype)
    positions = torch.arange(129) + 1000
    golden = golden_rope(x, positions, 10000.0, "half")
    out = RoPE(64)(x, positions)
    assert out.dtype == dtype and out.shape == x.shape
    err = (out.double() - golden).abs().max().item()
    ref_err = (naive_rope(x, positions, 10000.0, dtype).double() - golden).abs().max().item()
    floor = torch.finfo(dtype).eps * golden.abs().max().item()
    assert err <= 2 * ref_err + floor, f"attnkit err {err:.3g}, naive {dtype} err {ref_err:.3g}, floor {floor:.3g}"
    if dtype != torch.float32:  # stronger: one rounding of a float32 result (the naive bf16 error here is ~8)
        assert err <= floor, f"attnkit {dtype} err {err:.3g} > one output rounding {floor:.3g}"


def test_module_cast_to_bf16_keeps_float32_angles():
    rope = RoPE(64)
    x = torch.randn(1, 2, 33, 64)
    expected = rope(x, torch.arange(33) + 5000)
    rope.to(torch.bfloat16)  # casts the inv_freq buffer; forward must not use the degraded copy
    assert rope.inv_freq.dtype == torch.bfloat16
    torch.testing.assert_close(rope(x, torch.arange(33) + 5000), expected, rtol=0, atol=0)


def test_inv_freq_is_a_non_persistent_float32_buffer():
    rope = RoPE(8)
    assert rope.inv_freq.dtype == torch.float32 and rope.inv_freq.shape == (4,)
    assert "inv_freq" not in rope.state_dict()
    assert "inv_freq" in dict(rope.named_buffers())


# --------------------------------------------------------------------------------------------- layout converter


def project(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, heads: int, D: int) -> torch.Tensor:
    B, L, _ = x.shape
    return (x @ w.T + b).view(B, L, heads, D).transpose(1, 2)  # (B, L, heads*D) -> (B, heads, L, D)


@pytest.mark.parametrize("source", ["half", "interleaved"])
@pytest.mark.parametrize("D", [2, 8, 32])
def test_converted_projections_give_identical_scores(source, D):
    target = "interleaved" if source == "half" else "half"
    H, Hkv, E, L = 4, 2, 24, 11
    g = torch.Generator().manual_seed(D)
    x = torch.randn(2, L, E, generator=g, dtype=torch.float64)
    wq, wk = torch.randn(H * D, E, generator=g, dtype=torch.float64), torch.randn(Hkv * D, E, generator=g,
                                                                                  dtype=torch.float64)
    bq, bk = torch.randn(H * D, generator=g, dtype=torch.float64), torch.randn(Hkv * D, generator=g,
                                                                               dtype=torch.float64)
    positions = torch.arange(L) * 13

    def scores(style, wq, bq, wk, bk):
        rope = RoPE(D, style=style)
        q = rope(project(x, wq, bq, H, D), positions)  # (B, H, L, D)
        k = rope(project(x, wk, bk, Hkv, D), positions).repeat_interleave(H // Hkv, dim=1)  # (B, H, L, D)
        return q @ k.transpose(-1, -2)  # (B, H, L, L)

    converted = (convert_rope_layout(wq, H, D, to=target), convert_rope_layout(bq, H, D, to=target),
                 convert_rope_layout(wk, Hkv, D, to=target), convert_rope_layout(bk, Hkv, D, to=target))
    expected = scores(source, wq, bq, wk, bk)
    torch.testing.assert_close(scores(target, *converted), expected, rtol=1e-12, atol=1e-10)
    # a forgotten conversion changes the scores (so the comparison above can fail)
    if D > 2:
        assert not torch.allclose(scores(target, wq, bq, wk, bk), expected)


@pytest.mark.parametrize("to", ["half", "interleaved"])
def test_convert_round_trips_and_matches_hf_llama_permute(to):
    H, D, E = 3, 8, 5
    w = torch.randn(H * D, E)
    back = "interleaved" if to == "half" else "half"
    assert torch.equal(convert_rope_layout(convert_rope_layout(w, H, D, to=to), H, D, to=back), w)
    b = torch.randn(H * D)
    assert torch.equal(convert_rope_layout(convert_rope_layout(b, H, D, to=to), H, D, to=back), b)
    if to == "half":  # transformers' convert_llama_weights_to_hf.py: Meta (interleaved) -> HF (half)
        hf = w.view(H, D // 2, 2, E).transpose(1, 2).reshape(H * D, E)
        assert torch.equal(convert_rope_layout(w, H, D, to="half"), hf)


def test_convert_explicit_permutation():
    rows = torch.arange(8.0)  # one head, D = 8: half pairs (0,4) (1,5) (2,6) (3,7)
    assert convert_rope_layout(rows, 1, 8, to="interleaved").tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    assert convert_rope_layout(rows, 1, 8, to="half").tolist() == [0, 2, 4, 6, 1, 3, 5, 7]


# ------------------------------------------------------------------------------------------------------ scaling


def test_linear_scaling_is_position_interpolation():
    x = torch.randn(1, 2, 10, 16, dtype=torch.float64)
    m = torch.arange(10) * 3
    scaled = RoPE(16, scaling=LinearScaling(4.0))(x, m * 4)
    torch.testing.assert_close(scaled, RoPE(16)(x, m), rtol=0, atol=1e-12)


@pytest.mark.parametrize("D", [4, 16, 128])
def test_ntk_effective_base(D):
    factor, base = 8.0, 10000.0
    ntk_base = base * factor ** (D / (D - 2))
    assert NTKScaling(factor).effective_base(base, D) == pytest.approx(ntk_base, rel=1e-15)
    expected = torch.tensor([ntk_base ** (-2 * k / D) for k in range(D // 2)], dtype=torch.float64)
    got = RoPE(D, base=base, scaling=NTKScaling(factor))._inv_freq(torch.float64, torch.device("cpu"))
    torch.testing.assert_close(got, expected, rtol=1e-14, atol=0)
    plain = RoPE(D, base=base)._inv_freq(torch.float64, torch.device("cpu"))
    assert got[0] == plain[0] == 1.0  # the highest frequency is untouched
    assert (plain[-1] / got[-1]).item() == pytest.approx(factor, rel=1e-12)  # the lowest one is interpolated


def test_ntk_and_yarn_factor_one_are_identity_and_ntk_approaches_it():
    x = torch.randn(1, 2, 20, 32, dtype=torch.float64)
    positions = torch.arange(20) * 500
    plain = RoPE(32)(x, positions)
    assert torch.equal(RoPE(32, scaling=NTKScaling(1.0))(x, positions), plain)
    assert torch.equal(RoPE(32, scaling=YaRNScaling(1.0, 64))(x, positions), plain)
    errs = [(RoPE(32, scaling=NTKScaling(f))(x, positions) - plain).abs().max().item() for f in (1.1, 1.01, 1.001)]
    assert errs[0] > errs[1] > errs[2] > 0
    assert NTKScaling(5.0).effective_base(10000.0, 2) == 10000.0  # D == 2: one frequency, 1, whatever the base


def test_yarn_frequencies_and_attention_factor():
    D, base, factor, original = 64, 10000.0, 8.0, 2048
    scaling = YaRNScaling(factor, original)
    low, high = scaling.ramp_bounds(base, D)
    # find_correction_dim(beta) = D * ln(original / (2 pi beta)) / (2 ln base), floored / ceiled
    assert low == math.floor(D * math.log(original / (2 * math.pi * 32)) / (2 * math.log(base)))
    assert high == math.ceil(D * math.log(original / (2 * math.pi * 1)) / (2 * math.log(base)))
    plain = RoPE(D)._inv_freq(torch.float64, torch.device("cpu"))
    got = RoPE(D, scaling=scaling)._inv_freq(torch.float64, torch.device("cpu"))
    torch.testing.assert_close(got[: low + 1], plain[: low + 1], rtol=0, atol=0)  # fast pairs: extrapolate
    torch.testing.assert_close(got[high:], plain[high:] / factor, rtol=1e-15, atol=0)  # slow pairs: interpolate
    mid = got[low + 1: high] / plain[low + 1: high]
    assert ((mid < 1) & (mid > 1 / factor)).all() and (mid.diff() < 0).all()  # a monotone blend in between
    assert RoPE(D, scaling=scaling).attention_factor == pytest.approx(0.1 * math.log(factor) + 1)
    assert RoPE(D, scaling=YaRNScaling(factor, original, attention_factor=1.5)).attention_factor == 1.5


def test_scaling_dicts():
    assert scaling_from_dict({"type": "linear", "factor": 4.0}, 10000.0) == LinearScaling(4.0)
    assert scaling_from_dict({"rope_type": "ntk", "factor": 2}, 10000.0) == NTKScaling(2)
    assert scaling_from_dict({"rope_type": "default", "rope_theta": 10000.0}, 10000.0) is None
    yarn = scaling_from_dict({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096,
                              "beta_fast": None, "truncate": False, "rope_theta": 1e6}, 1e6)
    assert yarn == YaRNScaling(4.0, 4096, truncate=False)
    deepseek = scaling_from_dict({"type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
                                  "mscale": 1.0, "mscale_all_dim": 0.707}, 10000.0)
    expected = (0.1 * math.log(40.0) + 1) / (0.1 * 0.707 * math.log(40.0) + 1)
    assert deepseek.attention_factor == pytest.approx(expected)
    rope = RoPE(8, scaling={"rope_type": "linear", "factor": 2.0})
    assert rope.scaling == LinearScaling(2.0)
    llama3 = scaling_from_dict({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 8192, "rope_theta": 5e5}, 5e5)
    assert llama3 == Llama3Scaling(8.0, 8192, low_freq_factor=1.0, high_freq_factor=4.0)
    as_float = scaling_from_dict({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                  "original_max_position_embeddings": 8192.0}, 10000.0)
    assert as_float == llama3 and isinstance(as_float.original_max_positions, int)


def test_llama3_scaling_keeps_high_interpolates_low_and_blends_between():
    """The three bands, against the formula written out per pair in float64 (an invariant, not HF)."""
    D, base, original, factor = 64, 10000.0, 64, 8.0
    plain = rope_inv_freq(D, base, dtype=torch.float64)
    scaled = rope_inv_freq(D, base, Llama3Scaling(factor, original), dtype=torch.float64)
    bands = {"keep": 0, "interpolate": 0, "blend": 0}
    for f, g in zip(plain.tolist(), scaled.tolist()):
        wavelength = 2 * math.pi / f
        if wavelength < original / 4.0:
            bands["keep"] += 1
            assert g == f
        elif wavelength > original / 1.0:
            bands["interpolate"] += 1
            assert g == pytest.approx(f / factor, rel=1e-15)
        else:
            bands["blend"] += 1
            s = (original / wavelength - 1.0) / (4.0 - 1.0)
            assert g == pytest.approx((1 - s) * f / factor + s * f, rel=1e-15)
    assert all(bands.values()), bands  # the test covers every band


# ---------------------------------------------------------------------------------------- Hugging Face agreement

HF_PARAMETERS = [
    ({"rope_type": "default", "rope_theta": 10000.0}, 256),
    ({"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}, 256),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "rope_theta": 10000.0}, 256),
    ({"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 32, "rope_theta": 500000.0,
      "beta_fast": 16.0, "beta_slow": 2.0, "truncate": False}, 256),
    # original 64, D = 32, base 1e4: wavelengths 6.3 .. 5.6e3 put pairs in all three llama3 bands
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 64, "rope_theta": 10000.0}, 256),
]


@pytest.mark.parametrize("params,max_positions", HF_PARAMETERS,
                         ids=["default", "linear", "yarn", "yarn-untruncated", "llama3"])
def test_agrees_with_transformers_llama_rotary(params, max_positions):
    pytest.importorskip("transformers", reason="transformers is the external oracle for LLaMA's RoPE")
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    H, D, L = 2, 32, 200
    config = LlamaConfig(hidden_size=H * D, num_attention_heads=H, num_key_value_heads=H, head_dim=D,
                         max_position_embeddings=max_positions, rope_parameters=dict(params))
    hf_rope = LlamaRotaryEmbedding(config)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 2, H, L, D, generator=g)  # each (B, H, L, D)
    positions = torch.stack([torch.arange(L), torch.arange(L) + 37])  # (B, L)
    cos, sin = hf_rope(q, positions)
    hf_q, hf_k = apply_rotary_pos_emb(q, k, cos, sin)

    rope = RoPE(D, base=params["rope_theta"], scaling=dict(params))
    assert rope.attention_factor == pytest.approx(hf_rope.attention_scaling, rel=1e-12)
    torch.testing.assert_close(rope.inv_freq, hf_rope.inv_freq, rtol=4 * torch.finfo(torch.float32).eps, atol=0)
    for x, hf_x in ((q, hf_q), (k, hf_k)):
        golden = rope(x.double(), positions)
        hf_err = (hf_x.double() - golden).abs().max().item()
        err = (rope(x, positions).double() - golden).abs().max().item()
        # HF runs in float32: its angle error is ~ |angle| * eps32 <= 2 * max position * eps32 (inv_freq <= 1),
        # so |hf - golden| <= 4 * max_pos * eps32 * max|x| leaves 2x headroom; attnkit's float32 path obeys the
        # docs/conventions.md rule against HF as ref_T.
        bound = 4 * positions.max().item() * torch.finfo(torch.float32).eps * x.abs().max().item()
        assert hf_err <= bound, f"HF differs from attnkit float64 by {hf_err:.3g} > {bound:.3g}"
        assert err <= 2 * hf_err + 1e-6, f"attnkit float32 err {err:.3g}, HF float32 err {hf_err:.3g}"


# ------------------------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize("kwargs,error,match", [
    ({"head_dim": 7}, AttnkitValueError, r"head_dim must be even for RoPE .* got 7"),
    ({"head_dim": 0}, AttnkitValueError, r"head_dim must be >= 2, got 0"),
    ({"head_dim": 8.0}, AttnkitTypeError, r"head_dim must be an int, got 8.0"),
    ({"head_dim": 8, "base": 1.0}, AttnkitValueError, r"base must be > 1.0, got 1.0; use e.g. base=10000.0"),
    ({"head_dim": 8, "base": "1e4"}, AttnkitTypeError, r"base must be a finite number, got '1e4'"),
    ({"head_dim": 8, "style": "gptj"}, AttnkitValueError, r"style must be 'half' or 'interleaved', got 'gptj'"),
    ({"head_dim": 8, "scaling": 4.0}, AttnkitTypeError, r"scaling must be None, LinearScaling.*got 4.0; e.g."),
    ({"head_dim": 8, "scaling": "linear"}, AttnkitTypeError, r"scaling must be None.*got 'linear'"),
])
def test_constructor_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        RoPE(**kwargs)


@pytest.mark.parametrize("make,error,match", [
    (lambda: LinearScaling(0.5), AttnkitValueError, r"LinearScaling.factor must be >= 1.0, got 0.5; use factor ="),
    (lambda: LinearScaling(float("nan")), AttnkitTypeError, r"LinearScaling.factor must be a finite number, got nan"),
    (lambda: NTKScaling(0.9), AttnkitValueError, r"NTKScaling.factor must be >= 1.0, got 0.9"),
    (lambda: YaRNScaling(0.5, 64), AttnkitValueError, r"YaRNScaling.factor must be >= 1.0, got 0.5"),
    (lambda: YaRNScaling(4.0, 64.0), AttnkitTypeError, r"original_max_positions must be an int, got 64.0; give"),
    (lambda: YaRNScaling(4.0, 0), AttnkitValueError, r"original_max_positions must be >= 1, got 0"),
    (lambda: YaRNScaling(4.0, 64, beta_slow=0.0), AttnkitValueError, r"beta_slow must be > 0.0, got 0.0"),
    (lambda: YaRNScaling(4.0, 64, beta_fast=-1.0), AttnkitValueError, r"beta_fast must be > 0.0, got -1.0"),
    (lambda: YaRNScaling(4.0, 64, beta_fast=1.0, beta_slow=2.0), AttnkitValueError,
     r"beta_fast must be greater than beta_slow, got beta_fast=1.0, beta_slow=2.0; use the paper's defaults"),
    (lambda: YaRNScaling(4.0, 64, attention_factor=0.0), AttnkitValueError,
     r"attention_factor must be > 0.0, got 0.0; omit it"),
    (lambda: Llama3Scaling(0.5, 64), AttnkitValueError, r"Llama3Scaling.factor must be >= 1.0, got 0.5"),
    (lambda: Llama3Scaling(8.0, 64.0), AttnkitTypeError, r"original_max_positions must be an int, got 64.0"),
    (lambda: Llama3Scaling(8.0, 64, low_freq_factor=0.0), AttnkitValueError, r"low_freq_factor must be > 0.0"),
    (lambda: Llama3Scaling(8.0, 64, high_freq_factor=-1.0), AttnkitValueError, r"high_freq_factor must be > 0.0"),
    (lambda: Llama3Scaling(8.0, 64, low_freq_factor=4.0, high_freq_factor=1.0), AttnkitValueError,
     r"high_freq_factor must be greater than low_freq_factor, got high_freq_factor=1.0, low_freq_factor=4.0"),
])
def test_scaling_errors(make, error, match):
    with pytest.raises(error, match=match):
        make()


@pytest.mark.parametrize("params,match", [
    ({"rope_type": "linear", "factr": 4.0}, r"unknown keys \['factr'\]; accepted keys are"),
    ({"rope_type": "linear", "factor": 4.0, "rope_theta": 5e5}, r"rope_theta=500000.0 but RoPE was built with "
                                                                 r"base=10000.0; pass base=500000.0"),
    ({"rope_type": "default", "partial_rotary_factor": 0.5}, r"partial_rotary_factor=0.5.*build RoPE\(head_dim="),
    ({"rope_type": "linear"}, r"type 'linear' needs a 'factor' key"),
    ({"rope_type": "yarn", "factor": 4.0}, r"type 'yarn' needs 'original_max_position_embeddings'"),
    ({"rope_type": "dynamic", "factor": 8.0}, r"type 'dynamic', which attnkit's RoPE does not implement; use one of"),
    ({"rope_type": "llama3", "factor": 8.0}, r"type 'llama3' needs 'original_max_position_embeddings'"),
    ({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192, "high_freq_factor": 4.0},
     r"type 'llama3' needs \['low_freq_factor'\], got .*; LLaMA 3.1 uses 'low_freq_factor': 1.0"),
])
def test_scaling_dict_errors(params, match):
    with pytest.raises(AttnkitValueError, match=match):
        RoPE(8, scaling=params)


def test_forward_errors():
    rope = RoPE(8)
    x = torch.randn(2, 3, 5, 8)
    shape_msg = r"x must have shape \(B, H, L, head_dim=8\), got tensor\(shape="
    with pytest.raises(AttnkitTypeError, match=r"x must be a floating-point tensor .* got tensor\(shape=\(2, 3, 5, "
                                               r"8\), dtype=torch.int64"):
        rope(x.long(), torch.arange(5))
    with pytest.raises(AttnkitTypeError, match=r"x must be a floating-point tensor .* got \[1.0\]"):
        rope([1.0], torch.arange(5))
    with pytest.raises(AttnkitValueError, match=shape_msg + r"\(3, 5, 8\)"):
        rope(x[0], torch.arange(5))
    with pytest.raises(AttnkitValueError, match=shape_msg + r"\(2, 3, 5, 4\).*build RoPE with the head_dim of x"):
        rope(x[..., :4], torch.arange(5))
    with pytest.raises(AttnkitTypeError, match=r"positions must be an integer tensor .* dtype=torch.float32.*"
                                               r"torch.arange\(L\)"):
        rope(x, torch.arange(5.0))
    with pytest.raises(AttnkitTypeError, match=r"positions must be an integer tensor .* got \[0, 1, 2, 3, 4\]"):
        rope(x, [0, 1, 2, 3, 4])
    with pytest.raises(AttnkitValueError, match=r"positions must have shape \(5,\) or \(2, 5\) to match x "
                                                r"\(2, 3, 5, 8\), got tensor\(shape=\(4,\).*one position per token"):
        rope(x, torch.arange(4))
    with pytest.raises(AttnkitValueError, match=r"positions must have shape \(5,\) or \(2, 5\).*shape=\(3, 5\)"):
        rope(x, torch.arange(15).view(3, 5))
    with pytest.raises(AttnkitValueError, match=r"positions must have shape.*shape=\(1, 2, 5\)"):
        rope(x, torch.arange(10).view(1, 2, 5))
    with pytest.raises(AttnkitValueError, match=r"positions is on meta but x is on cpu; move it with .to\(x.device\)"):
        rope(x, torch.arange(5, device="meta"))


@pytest.mark.parametrize("args,kwargs,error,match", [
    (([1.0], 1, 2), {}, AttnkitTypeError, r"weight must be a torch.Tensor .* got \[1.0\]; pass e.g."),
    ((torch.zeros(8, 3), 0, 8), {}, AttnkitValueError, r"num_heads must be >= 1, got 0; pass the number of heads"),
    ((torch.zeros(8, 3), 1, 8.0), {}, AttnkitTypeError, r"head_dim must be an int, got 8.0"),
    ((torch.zeros(7, 3), 1, 7), {}, AttnkitValueError, r"head_dim must be even for RoPE, got 7"),
    ((torch.zeros(8, 3), 1, 8), {"to": "gptj"}, AttnkitValueError, r"to must be 'half' or 'interleaved', got 'gptj'"),
    ((torch.zeros(8, 3), 2, 8), {}, AttnkitValueError, r"weight must have shape \(16, in\) or \(16,\).*got "
                                                       r"tensor\(shape=\(8, 3\).*num_kv_heads"),
    ((torch.zeros(8, 3, 1), 1, 8), {}, AttnkitValueError, r"weight must have shape \(8, in\) or \(8,\)"),
])
def test_convert_errors(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        convert_rope_layout(*args, **kwargs)

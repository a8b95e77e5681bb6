"""ALiBi: slopes from the paper (powers of two and the rule for other head counts), agreement with BLOOM's
implementation in transformers, the structured-bias protocol and the errors.

Shape legend: B batch, H heads, Lq/Lk query/key lengths.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import attnkit as ak
from attnkit._bias import StructuredBias
from attnkit.errors import AttnkitTypeError, AttnkitValueError
from attnkit.positions import ALiBi, alibi_slopes


def press_get_slopes(n: int) -> list[float]:
    """Verbatim from ofirpress/attention_with_linear_biases (fairseq/models/transformer.py)."""

    def get_slopes_power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        ratio = start
        return [start * ratio**i for i in range(n)]

    if math.log2(n).is_integer():
        return get_slopes_power_of_2(n)
    closest_power_of_2 = 2 ** math.floor(math.log2(n))
    return get_slopes_power_of_2(closest_power_of_2) + press_get_slopes(2 * closest_power_of_2)[0::2][
        : n - closest_power_of_2]


def bloom_slopes(num_heads: int) -> torch.Tensor:
    """Slopes recovered from transformers' BLOOM bias: at key index 1 its value is slope * 1."""
    pytest.importorskip("transformers", reason="transformers' BLOOM is the external oracle for ALiBi slopes")
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    alibi = build_alibi_tensor(torch.ones(1, 2), num_heads, torch.float32)  # (1 * H, 1, 2)
    return alibi[:, 0, 1]  # (H,)


def test_eight_heads_are_one_half_to_one_256th_exactly():
    expected = torch.tensor([2.0**-k for k in range(1, 9)])
    assert torch.equal(alibi_slopes(8), expected)
    assert alibi_slopes(8).dtype == torch.float32


@pytest.mark.parametrize("num_heads", [1, 2, 4, 16, 32, 64])
def test_powers_of_two_follow_the_geometric_sequence(num_heads):
    expected = torch.tensor([2.0 ** (-8 * (h + 1) / num_heads) for h in range(num_heads)], dtype=torch.float64)
    assert torch.equal(alibi_slopes(num_heads), expected.float())


def test_six_heads_by_hand():
    # n = 4: 2^-2, 2^-4, 2^-6, 2^-8; then the 8-head slopes [0::2] = 2^-1, 2^-3, ... take the first 2
    assert alibi_slopes(6).tolist() == [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3]


@pytest.mark.parametrize("num_heads", [3, 5, 6, 7, 12, 20, 24, 40, 96])
def test_non_powers_of_two_match_the_paper_and_bloom(num_heads):
    ours = alibi_slopes(num_heads)
    paper = torch.tensor(press_get_slopes(num_heads), dtype=torch.float64).float()
    assert torch.equal(ours, paper)
    # BLOOM raises a float32-rounded base (relative error <= eps/2) to integer powers k < H, so its slopes carry
    # a relative error up to ~k * eps/2 plus one rounding: allow H * eps
    torch.testing.assert_close(ours, bloom_slopes(num_heads), rtol=num_heads * torch.finfo(torch.float32).eps, atol=0)


@pytest.mark.parametrize("num_heads", [6, 12, 20])
def test_causal_softmax_equals_bloom_bias(num_heads):
    pytest.importorskip("transformers", reason="transformers' BLOOM is the external oracle for ALiBi")
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    L = 9
    scores = torch.randn(1, num_heads, L, L, dtype=torch.float64)
    causal = torch.ones(L, L, dtype=torch.bool).tril()  # (Lq, Lk)
    bloom = build_alibi_tensor(torch.ones(1, L), num_heads, torch.float32).view(1, num_heads, 1, L)  # (B, H, 1, Lk)
    ours = ALiBi(num_heads).materialize(torch.arange(L)[None], torch.arange(L)[None])  # (1, H, L, L)
    # our bias differs from BLOOM's slope * j by the row constant -slope * i, which softmax removes
    assert not torch.allclose(ours, bloom.expand_as(ours))

    def probs(bias):
        return (scores + bias.double()).masked_fill(~causal, -math.inf).softmax(-1)

    torch.testing.assert_close(probs(ours), probs(bloom), rtol=0, atol=1e-6)


def test_materialize_shape_and_values():
    H, B, Lq, Lk = 5, 2, 3, 7
    alibi = ALiBi(H)
    q_pos = torch.stack([torch.arange(Lk - Lq, Lk), torch.arange(Lq) * 4])  # (B, Lq): bottom-right and arbitrary
    kv_pos = torch.stack([torch.arange(Lk), torch.arange(Lk) + 2])  # (B, Lk)
    bias = alibi.materialize(q_pos, kv_pos)
    assert bias.shape == (B, H, Lq, Lk) and bias.dtype == torch.float32
    slopes = alibi_slopes(H)
    for b in range(B):
        for h in range(H):
            for i in range(Lq):
                for j in range(Lk):
                    distance = abs(int(q_pos[b, i]) - int(kv_pos[b, j]))
                    assert bias[b, h, i, j].item() == -(slopes[h] * distance).item()
    assert alibi.materialize(q_pos[:1], kv_pos[:1]).shape == (1, H, Lq, Lk)
    assert torch.equal(alibi(q_pos, kv_pos), bias)  # forward is materialize


def test_score_is_symmetric_and_broadcasts_with_scalars():
    alibi = ALiBi(4)
    i, j = torch.arange(6)[:, None], torch.arange(6)[None, :]  # (Lq, 1), (1, Lk)
    h = torch.tensor(2)
    assert torch.equal(alibi.score(h, i, j), alibi.score(h, j, i))
    assert alibi.score(h, torch.tensor(5), torch.tensor(3)).item() == -2 * 2.0**-6  # a flex-style scalar call
    assert torch.equal(alibi.score(h, i, i.T).diagonal(), torch.zeros(6))


def test_module_protocol_and_buffer():
    alibi = ALiBi(12)
    assert isinstance(alibi, nn.Module) and isinstance(alibi, StructuredBias)
    assert alibi.num_heads == 12
    assert alibi.slopes.dtype == torch.float32 and torch.equal(alibi.slopes, alibi_slopes(12))
    assert "slopes" not in alibi.state_dict() and "slopes" in dict(alibi.named_buffers())
    alibi.to(torch.bfloat16)  # a cast module still scores in float32
    assert alibi.score(torch.tensor(0), torch.tensor(3), torch.tensor(0)).dtype == torch.float32


@pytest.mark.parametrize("make", [ALiBi, alibi_slopes])
def test_errors(make):
    with pytest.raises(AttnkitValueError, match=r"num_heads must be >= 1, got 0; pass the number of query heads"):
        make(0)
    with pytest.raises(AttnkitTypeError, match=r"num_heads must be an int, got 8.0; pass the number of query heads"):
        make(8.0)
    with pytest.raises(AttnkitTypeError, match=r"num_heads must be an int, got True"):
        make(True)


def _dense_alibi(slopes, L):
    """``-m * |i - j|`` written out: ``(B|1, H, L, L)`` float32 (the oracle for arbitrary slopes)."""
    d = (torch.arange(L)[:, None] - torch.arange(L)[None, :]).abs().float()  # (L, L)
    m = slopes if slopes.dim() == 2 else slopes[None]  # (B|1, H)
    return -m[:, :, None, None] * d  # (B|1, H, L, L)


@pytest.mark.parametrize("slopes", [torch.tensor([0.5, 0.0, 0.03, -0.02]),  # any sign, zero included
                                    torch.tensor([[0.5, 0.1, 0.03, 0.2], [0.01, 0.7, 0.0, 0.3]])],  # per (b, h)
                         ids=["per_head", "per_batch_head"])
@pytest.mark.parametrize("backend", ["auto", "sdpa", "blocksparse", "math"])
def test_arbitrary_slopes_on_every_backend(slopes, backend):
    from oracle import assert_within_rule
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, n, 300, 16, generator=g) for n in (4, 2, 2))
    alibi = ak.positions.ALiBi(4, slopes=slopes)
    mask = ak.masks.causal()
    dense = _dense_alibi(slopes, 300)
    golden = ak.reference_attention(q.double(), k.double(), v.double(), mask, bias=dense.double())
    ref = ak.reference_attention(q, k, v, mask, bias=dense)
    out = ak.attention(q, k, v, mask, bias=alibi, backend=backend)
    assert_within_rule(out, ref, golden)
    torch.testing.assert_close(alibi.materialize(torch.arange(300)[None], torch.arange(300)[None]),
                               dense.expand(slopes.shape[0] if slopes.dim() == 2 else 1, -1, -1, -1))


def test_arbitrary_slopes_are_saved_and_parameters_stay_trainable():
    alibi = ak.positions.ALiBi(2, slopes=torch.tensor([0.3, 0.1]))
    assert torch.equal(alibi.state_dict()["slopes"], torch.tensor([0.3, 0.1]))
    assert "slopes" not in ak.positions.ALiBi(2).state_dict()  # the paper's slopes are recomputed, not saved
    trainable = ak.positions.ALiBi(2, slopes=torch.nn.Parameter(torch.tensor([0.3, 0.1])))
    assert [n for n, _ in trainable.named_parameters()] == ["slopes"]


def test_slope_errors():
    with pytest.raises(AttnkitTypeError, match=r"ALiBi slopes must be a float tensor \(H,\) or \(B, H\), got"):
        ak.positions.ALiBi(2, slopes=[0.5, 0.25])
    with pytest.raises(AttnkitValueError, match=r"ALiBi slopes must have shape \(2,\) or \(B, 2\) for num_heads=2"):
        ak.positions.ALiBi(2, slopes=torch.ones(3))
    with pytest.raises(AttnkitValueError, match="ALiBi slopes must be finite"):
        ak.positions.ALiBi(2, slopes=torch.tensor([0.5, float("inf")]))
    per_row = ak.positions.ALiBi(2, slopes=torch.ones(3, 2))
    with pytest.raises(AttnkitValueError, match=r"ALiBi with per-row slopes \(3, 2\) needs the batch index b"):
        per_row.score(torch.tensor(0), torch.tensor(0), torch.tensor(1))
    q = torch.randn(2, 2, 5, 8)
    with pytest.raises(AttnkitValueError, match="bias ALiBi has per-row terms for batch 3 but q has batch 2"):
        ak.attention(q, q, q, bias=per_row)


def test_needs_grad_reads_the_slopes_without_scoring(monkeypatch):
    """ALiBi answers from its slopes (no score evaluated per call); a subclass with its own score is scored;
    a call with trainable slopes still gives the slopes a gradient."""
    fixed, trained = ALiBi(4), ALiBi(4, slopes=nn.Parameter(torch.rand(4)))
    monkeypatch.setattr(ALiBi, "score", lambda *a, **kw: pytest.fail("scored"))
    assert fixed.needs_grad(torch.device("cpu")) is False and trained.needs_grad(torch.device("cpu")) is True
    monkeypatch.undo()

    class Scaled(ALiBi):
        def __init__(self):
            super().__init__(4)
            self.gain = nn.Parameter(torch.ones(()))

        def score(self, h, q_pos, kv_pos, b=None):
            return self.gain * super().score(h, q_pos, kv_pos, b)

    assert Scaled().needs_grad(torch.device("cpu")) is True
    q = torch.randn(1, 4, 16, 8)
    ak.attention(q, q, q, ak.masks.causal(), bias=trained).sum().backward()
    assert trained.slopes.grad is not None and bool(torch.isfinite(trained.slopes.grad).all())

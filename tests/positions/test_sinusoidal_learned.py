"""Absolute positional embeddings: sinusoidal against a float64 direct formula, the learned table's lookup,
initialisation and range errors.

Shape legend: B batch, L length, E embed_dim.
"""

from __future__ import annotations

import math

import pytest
import torch

from attnkit.errors import AttnkitTypeError, AttnkitValueError
from attnkit.positions import Learned, Sinusoidal


def direct_formula(positions: list[int], embed_dim: int, base: float) -> torch.Tensor:
    """PE[p, 2i] = sin(p / base^(2i/E)), PE[p, 2i+1] = cos(p / base^(2i/E)), in Python floats (float64)."""
    rows = []
    for p in positions:
        row = []
        for c in range(embed_dim):
            angle = p / base ** ((c - c % 2) / embed_dim)
            row.append(math.sin(angle) if c % 2 == 0 else math.cos(angle))
        rows.append(row)
    return torch.tensor(rows, dtype=torch.float64)


@pytest.mark.parametrize("embed_dim", [1, 2, 7, 16, 33])
@pytest.mark.parametrize("base", [10000.0, 100.0])
def test_sinusoidal_matches_direct_formula(embed_dim, base):
    positions = [0, 1, 2, 5, 63, 1000, 123457, -3]
    out = Sinusoidal(embed_dim, base=base)(torch.tensor(positions))
    assert out.shape == (len(positions), embed_dim) and out.dtype == torch.float32
    # float64 angles rounded once to float32: within half an ulp of values in [-1, 1] (2**-24)
    golden = direct_formula(positions, embed_dim, base)
    assert (out.double() - golden).abs().max().item() <= 2**-24 + 1e-12


def test_sinusoidal_batched_and_known_values():
    pe = Sinusoidal(6)
    positions = torch.tensor([[0, 1, 2], [7, 8, 9]])  # (B, L)
    out = pe(positions)
    assert out.shape == (2, 3, 6)
    assert torch.equal(out[1], pe(positions[1]))
    assert out[0, 0].tolist() == [0.0, 1.0, 0.0, 1.0, 0.0, 1.0]  # position 0: sin 0, cos 0
    assert out[0, 1, 0].item() == pytest.approx(math.sin(1.0)) and out[0, 1, 1].item() == pytest.approx(math.cos(1.0))
    assert "embed_dim=6" in repr(pe) and not list(pe.parameters())


@pytest.mark.parametrize("kwargs,error,match", [
    ({"embed_dim": 0}, AttnkitValueError, r"embed_dim must be >= 1, got 0; pass the model width E"),
    ({"embed_dim": 8.0}, AttnkitTypeError, r"embed_dim must be an int, got 8.0"),
    ({"embed_dim": 8, "base": -1.0}, AttnkitValueError, r"base must be > 0, got -1.0; use the paper"),
    ({"embed_dim": 8, "base": float("inf")}, AttnkitTypeError, r"base must be a finite number, got inf"),
])
def test_sinusoidal_constructor_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        Sinusoidal(**kwargs)


@pytest.mark.parametrize("module", [Sinusoidal(8), Learned(16, 8)], ids=["sinusoidal", "learned"])
def test_positions_type_and_rank_errors(module):
    with pytest.raises(AttnkitTypeError, match=r"positions must be an integer tensor of absolute positions, got "
                                               r"tensor\(shape=\(4,\), dtype=torch.float32.*torch.arange\(L\)"):
        module(torch.arange(4.0))
    with pytest.raises(AttnkitTypeError, match=r"positions must be an integer tensor of absolute positions, got "
                                               r"\[0, 1\]"):
        module([0, 1])
    with pytest.raises(AttnkitValueError, match=r"positions must have shape \(L,\) or \(B, L\), got tensor\(shape="
                                                r"\(1, 2, 2\).*one position per token"):
        module(torch.zeros(1, 2, 2, dtype=torch.long))


def test_learned_lookup_and_shapes():
    torch.manual_seed(0)
    pe = Learned(32, 8)
    positions = torch.tensor([[0, 31, 5], [2, 2, 9]])  # (B, L)
    out = pe(positions)
    assert out.shape == (2, 3, 8)
    assert torch.equal(out, pe.embedding.weight[positions])
    assert torch.equal(pe(torch.arange(4, dtype=torch.int32)), pe.embedding.weight[:4])
    assert pe(torch.zeros(0, dtype=torch.long)).shape == (0, 8)
    assert "embedding.weight" in pe.state_dict()
    out.sum().backward()
    assert pe.embedding.weight.grad[2].sum().item() == pytest.approx(2 * 8)  # position 2 used twice


def test_learned_init_std():
    torch.manual_seed(0)
    assert Learned(1024, 256).embedding.weight.std().item() == pytest.approx(0.02, rel=0.02)
    assert Learned(1024, 256, init_std=0.5).embedding.weight.std().item() == pytest.approx(0.5, rel=0.02)
    assert torch.equal(Learned(4, 4, init_std=0).embedding.weight, torch.zeros(4, 4))


def test_learned_range_errors():
    pe = Learned(16, 4)
    with pytest.raises(AttnkitValueError, match=r"positions must be < max_positions=16, got value 20; raise "
                                                r"max_positions to at least 21"):
        pe(torch.tensor([0, 20, 3]))
    with pytest.raises(AttnkitValueError, match=r"positions must be < max_positions=16, got value 16"):
        pe(torch.arange(17))
    with pytest.raises(AttnkitValueError, match=r"positions must be >= 0, got value -1; learned positions are "
                                                r"absolute indices"):
        pe(torch.tensor([[3, -1]]))


@pytest.mark.parametrize("kwargs,error,match", [
    ({"max_positions": 0, "embed_dim": 4}, AttnkitValueError, r"max_positions must be >= 1, got 0; pass the longest"),
    ({"max_positions": 16.0, "embed_dim": 4}, AttnkitTypeError, r"max_positions must be an int, got 16.0"),
    ({"max_positions": 16, "embed_dim": True}, AttnkitTypeError, r"embed_dim must be an int, got True; pass the model"),
    ({"max_positions": 16, "embed_dim": 4, "init_std": -0.1}, AttnkitValueError,
     r"init_std must be >= 0, got -0.1; use e.g. 0.02"),
])
def test_learned_constructor_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        Learned(**kwargs)

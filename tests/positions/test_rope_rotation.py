"""RoPE's fused half-split rotation (an autograd Function whose backward is the inverse rotation) computes what
the plain expression computes, forward, backward and double backward. Not timed."""

from __future__ import annotations

import pytest
import torch

from attnkit.positions import RoPE


def _plain(rope: RoPE, x: torch.Tensor, positions=None) -> torch.Tensor:
    """The rotation written out with autograd ops: ``(x1 cos - x2 sin, x2 cos + x1 sin)``."""
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    pos = torch.arange(x.shape[2])[None] if positions is None else positions.reshape(-1, x.shape[2])
    cos, sin = (t[:, None] for t in rope.cos_sin(pos, compute))  # (B|1, 1, L, D/2)
    x1, x2 = x.to(compute).chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("positions", [None, "restarting"])
def test_fused_rotation_equals_the_plain_expression(dtype, positions):
    rope = RoPE(16, scaling={"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 8})
    pos = None if positions is None else torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]])
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 9, 3, 16, generator=g).to(dtype).transpose(1, 2).detach().requires_grad_()  # (B, H, L, D) view
    x_plain = x.detach().clone().requires_grad_()
    out, want = rope(x, pos), _plain(rope, x_plain, pos)
    cot = torch.randn(out.shape, generator=g).to(dtype)
    (out * cot).sum().backward()
    (want * cot).sum().backward()
    tol = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 2e-2}[dtype]
    torch.testing.assert_close(out, want, rtol=tol, atol=tol)
    torch.testing.assert_close(x.grad, x_plain.grad, rtol=tol, atol=tol)


def test_fused_rotation_gradcheck_and_double_backward():
    rope = RoPE(8)
    x = torch.randn(1, 2, 5, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: rope(t), (x,))
    assert torch.autograd.gradgradcheck(lambda t: rope(t), (x,))


@pytest.mark.parametrize("offset", [0, 1000, -3], ids=["in_table", "beyond_table", "negative"])
def test_cos_sin_gathered_from_the_table_equal_computed(offset):
    """Explicit positions inside the arange table read its rows: bitwise the numbers cos_sin computes; positions
    outside it (or negative) are computed."""
    rope = RoPE(16, scaling={"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 8})
    pos = torch.tensor([[0, 1, 2, 3, 0, 1, 0, 1, 2, 3, 4, 5]]) + offset  # packed rows: positions restart
    for dtype in (torch.float32, torch.float64):
        got, want = rope._cos_sin_at(pos, dtype, pos.shape[1]), rope.cos_sin(pos, dtype)
        assert all(torch.equal(a, b) for a, b in zip(got, want)), f"{dtype}: gathered cos/sin differ from computed"

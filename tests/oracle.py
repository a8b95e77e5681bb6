"""The tolerance rule of docs/conventions.md (``attnkit._tolerance``, one place), as assertions for the oracle tests.

A result computed in dtype T passes when ``max|out - golden| <= factor * max|ref_T - golden| + floor``:
golden is the float64 reference on the same (already T-rounded) inputs, ref_T the reference run in T,
factor 2 for outputs and 3 for gradients, and floor = 4 * eps(T) * max(1, max|golden|) so that exact
agreement of two nearly-exact results is not judged on rounding noise alone.
"""

from __future__ import annotations

import torch

from attnkit._tolerance import floor_for, within_rule  # noqa: F401  (floor_for: re-used by tests)


def assert_within_rule(out, ref_t, golden, *, factor: float = 2.0, what: str = "output") -> None:
    """Assert the 2x (3x for gradients) rule; the message prints both errors."""
    assert out.shape == golden.shape, f"{what}: shape {tuple(out.shape)} != golden {tuple(golden.shape)}"
    assert torch.isfinite(out).all(), f"{what}: non-finite values"
    result = within_rule(out, ref_t, golden, factor=factor)
    assert result.ok, result.describe(what, out.dtype)


def run_with_grads(fn, tensors, seed: int = 0):
    """Run ``fn(*leaves)`` on fresh leaf copies, backprop a fixed random cotangent; return (out, grads)."""
    leaves = [t.detach().clone().requires_grad_(True) for t in tensors]
    out = fn(*leaves)
    g = torch.Generator().manual_seed(seed)
    cot = torch.randn(out.shape, generator=g, dtype=torch.float64).to(out.dtype)
    (out * cot).sum().backward()
    return out.detach(), [leaf.grad for leaf in leaves]

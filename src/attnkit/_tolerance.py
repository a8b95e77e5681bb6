"""The tolerance rule of docs/conventions.md, in one place: the tests' oracle, the doctor and export use it.

A result computed in dtype T passes when ``max|out - golden| <= factor * max|ref_T - golden| + floor``: golden is
the float64 reference on the same (already T-rounded) inputs, ref_T the reference run in T, factor 2 for outputs and
3 for gradients, and ``floor = 4 * eps(T) * max(1, max|golden|)`` so that two nearly exact results are not judged on
rounding noise alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

OUTPUT_FACTOR = 2.0
GRAD_FACTOR = 3.0


def floor_for(dtype: torch.dtype, golden: torch.Tensor) -> float:
    """``4 * eps(dtype) * max(1, max|golden|)``: the rounding noise a result in ``dtype`` may carry."""
    scale = max(1.0, float(golden.detach().abs().max())) if golden.numel() else 1.0
    return 4 * torch.finfo(dtype).eps * scale


def max_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """``max|a - b|`` in float64 (0 for empty tensors)."""
    return float((a.detach().double() - b.detach().double()).abs().max()) if a.numel() else 0.0


@dataclass(frozen=True)
class RuleResult:
    """One comparison under the rule: the result's error, the reference-in-T error, the floor and the verdict."""

    err: float
    ref_err: float
    floor: float
    factor: float

    @property
    def ok(self) -> bool:
        return self.err <= self.factor * self.ref_err + self.floor

    def describe(self, what: str = "output", dtype: torch.dtype | None = None) -> str:
        in_t = f"-in-{dtype}" if dtype is not None else ""
        return (f"{what}: max error {self.err:.3e} {'within' if self.ok else 'exceeds'} {self.factor:g} x "
                f"reference{in_t} error {self.ref_err:.3e} + floor {self.floor:.3e}")


def within_rule(out: torch.Tensor, ref_t: torch.Tensor, golden: torch.Tensor, *,
                factor: float = OUTPUT_FACTOR, dtype: torch.dtype | None = None) -> RuleResult:
    """Judge ``out`` (dtype T, or ``dtype`` when given) against ``golden`` (float64) with ``ref_t`` (the reference in
    T) as the yardstick. Shapes must match; a non-finite ``out`` where golden is finite fails (its error is inf)."""
    if out.shape != golden.shape:
        raise ValueError(f"within_rule: out has shape {tuple(out.shape)}, golden {tuple(golden.shape)}; "
                         "compare tensors of the same shape")
    dtype = dtype or out.dtype
    if golden.numel() == 0:
        return RuleResult(0.0, 0.0, floor_for(dtype, golden), factor)
    err = max_error(out, golden)
    if err != err:  # NaN anywhere in out (or golden): never within the rule
        err = float("inf")
    return RuleResult(err, max_error(ref_t, golden), floor_for(dtype, golden), factor)

"""The doctor's checks, in the order they run. Each one is registered in ``base.REGISTRY`` under its name."""

from attnkit.diagnostics.checks import cache, layout, leaks, model, numerics  # noqa: F401 - registers the checks
from attnkit.diagnostics.checks.base import FAIL, PASS, REGISTRY, SKIP, WARN, Check, Options, Outcome, Skip

ORDER = ["causal-leak", "padding-leak", "packing-leak", "kv-cache", "scale", "mask-placement", "layout",
         "low-precision", "backend-agreement", "init", "attention-health", "overfit"]

__all__ = ["ORDER", "REGISTRY", "Check", "Options", "Outcome", "Skip", "PASS", "WARN", "FAIL", "SKIP"]

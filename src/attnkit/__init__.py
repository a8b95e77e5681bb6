"""attnkit: self-attention that is right, fast and understandable.

>>> import torch, attnkit as ak
>>> q = k = v = torch.randn(1, 4, 16, 32)
>>> out = ak.attention(q, k, v, ak.masks.causal())
>>> print(ak.explain(q, k, v, ak.masks.causal()).chosen)
sdpa
"""

from attnkit import backends, cache, diagnostics, errors, masks, nn, positions
from attnkit.backends import attention, explain
from attnkit.diagnostics import doctor
from attnkit.functional.linear import LinearState, linear_attention
from attnkit.functional.reference import reference_attention

__version__ = "0.1.0"

__all__ = [
    "attention", "explain", "reference_attention", "linear_attention", "LinearState",
    "masks", "positions", "backends", "cache", "nn", "diagnostics", "doctor", "errors",
]


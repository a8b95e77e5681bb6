"""A mask prepared for batch 1 and used by a call of batch B > 1 (``PreparedMask.check_call`` allows the broadcast).

The regression: blocksparse (and its varlen path for documents) planned one batch row and crashed with an untyped
RuntimeError/IndexError for B > 1 (``ak.explain`` too). Now the prepared mask is bound again for the call's rows,
and every backend that serves the call equals the float64 reference.
"""

from __future__ import annotations

import pytest
import torch

import attnkit as ak
from attnkit.functional.reference import reference_attention

M = ak.masks
L, B = 40, 2
MASKS = {
    "documents": lambda: M.causal() & M.document(torch.tensor([0] * 15 + [1] * 25)),
    "padding": lambda: M.causal() & M.padding(torch.tensor([[True] * 30 + [False] * 10])),
    "window": lambda: M.sliding_window(7),
    "strided": lambda: M.causal() & (M.sliding_window(4) | M.strided(4)),
    "dense": lambda: M.dense(torch.ones(L, L, dtype=torch.bool).tril()),
}


@pytest.mark.parametrize("backend", ["math", "sdpa", "blocksparse", "auto"])
@pytest.mark.parametrize("name", list(MASKS))
def test_a_batch_one_prepared_mask_serves_a_bigger_batch(name, backend):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, 4, L, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(B, 2, L, 8, generator=g, dtype=torch.float64) for _ in range(2))
    want = reference_attention(q, k, v, MASKS[name]())
    prepared = M.prepare(MASKS[name](), L)
    assert prepared.batch == 1
    got = ak.attention(q, k, v, prepared, backend=backend)
    assert (got - want).abs().max().item() <= 1e-12
    ak.explain(q, k, v, prepared)  # answers instead of raising

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


@pytest.mark.parametrize("name", list(MASKS))
def test_a_mask_alike_for_every_row_is_dense_once(name):
    """Default positions and no per-row data: every row's dense form is the same, so it is built once (batch 1,
    broadcast), not B times; with per-row data (or positions) it has B rows, each its own."""
    from attnkit.masks.dense import evaluate

    prepared = M.prepare(MASKS[name](), L, L, B)
    dense = prepared.dense()
    assert dense.shape[0] == 1
    assert torch.equal(dense.expand(B, -1, -1, -1), evaluate(prepared.fn, prepared.ctx, heads=prepared.heads))
    per_row = M.prepare(M.causal() & M.padding(torch.tensor([30, 40])), L)
    assert per_row.dense().shape[0] == B and not torch.equal(per_row.dense()[0], per_row.dense()[1])
    shifted = M.prepare(M.causal(), torch.arange(L).expand(B, L) + torch.tensor([[0], [5]]), torch.arange(L + 5))
    assert shifted.dense().shape[0] == B


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_a_custom_mask_reading_rows_through_b_is_not_broadcast_from_row_0(backend):
    """A custom fn may close over per-row data (its batch says 1): on default positions its dense form is still
    evaluated per row (it was built for row 0 and broadcast, so rows 1 and 2 got row 0's mask)."""
    shift = torch.tensor([0, 3, 6])
    mask = M.custom(lambda b, h, q, kv: (kv - shift[b]) // 4 == (q - shift[b]) // 4) & M.causal()
    q = torch.randn(3, 2, 20, 8, dtype=torch.float64)
    truth = ak.attention(q, q, q, mask.to_dense(20, batch=3), backend="math")
    assert (ak.attention(q, q, q, mask, backend=backend) - truth).abs().max().item() < 1e-12

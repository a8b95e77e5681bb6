"""Packed documents whose ids recur in a row (issue 16 item 5): every path serves the mask it stands for.

``document(ids) & causal()`` compares document ids and *positions*. When an id comes back later in the row and
positions restart, the later run also sees the earlier run's keys at positions <= its own: a fast path that
compares indices instead (the old ``packed_mask`` of ``TransformerLM``) computed a different function (0.15-0.24
in the logits).
"""

from __future__ import annotations

import pytest
import torch

import attnkit as ak
from attnkit.models.lm import LMConfig, TransformerLM

M = ak.masks


def _recurring_documents(L: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Doc ids ``(1, L)`` drawn from {0, 1, 2} per run (so ids recur, adjacent or not) and positions restarting
    at every run."""
    ids, pos = [], []
    while len(ids) < L:
        n, d = int(torch.randint(1, 120, (), generator=g)), int(torch.randint(0, 3, (), generator=g))
        ids += [d] * n
        pos += list(range(n))
    return torch.tensor([ids[:L]]), torch.tensor([pos[:L]])


@pytest.mark.parametrize("L", [9, 130, 400])
@pytest.mark.parametrize("bias", [None, "alibi"])
def test_blocksparse_serves_recurring_document_ids(L, bias):
    g = torch.Generator().manual_seed(L)
    ids, pos = _recurring_documents(L, g)
    q, k, v = (torch.randn(1, 2, L, 16, generator=g, dtype=torch.float64) for _ in range(3))
    bias = ak.positions.ALiBi(2) if bias else None
    for mask in (M.document(ids) & M.causal(), M.document(ids) & M.sliding_window(40)):
        kw = {"bias": bias, "q_positions": pos, "kv_positions": pos}
        golden = ak.attention(q, k, v, mask, backend="math", **kw)
        out = ak.attention(q, k, v, mask, backend="blocksparse", **kw)
        err = float((out - golden).abs().max())
        assert err < 1e-10, f"{mask!r}: blocksparse differs from the reference by {err:.2e}"


def test_lm_packed_rows_with_a_recurring_document_id_follow_the_mask():
    """The logits of a packed row do not depend on which internal path builds its mask: with a padding mask
    (which the old fast path skipped) and without."""
    torch.manual_seed(0)
    model = TransformerLM(LMConfig(embed_dim=32, num_layers=2, num_heads=2, max_seq_len=16)).eval()
    ids = torch.tensor([[0, 0, 0, 1, 1, 0, 0, 0]])  # document 0 comes back after document 1
    pos = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2]])  # positions restart at every run
    tokens = torch.randint(0, 257, (1, 8))
    with torch.no_grad():
        packed = model(tokens, positions=pos, doc_ids=ids)
        spec = model(tokens, positions=pos, doc_ids=ids, key_is_real=torch.ones(1, 8, dtype=torch.bool))
    err = float((packed - spec).abs().max())
    assert err < 1e-5, f"packed logits differ from the mask's by {err:.3e}"

"""Masks defined on key indices (padding, documents, dense) in caches that do not return keys in written order.

The regressions: a static cache (which returns all max_length slots) took a document mask's query ids from its
last slots, and a sliding cache's ring put a padding mask's columns on the wrong keys once it wrapped; both gave
outputs different from the full forward without a word. Now both are typed errors, and what stays served equals
the full forward in float64.
"""

from __future__ import annotations

import pytest
import torch

import attnkit as ak
from attnkit.cache import make_cache
from attnkit.errors import AttnkitValueError

M = ak.masks
E, H, L = 16, 2, 6


@pytest.fixture
def mha():
    torch.manual_seed(0)
    return ak.nn.MultiHeadAttention(E, H, dtype=torch.float64).eval()


def _decode(mha, x, cache, mask_at):
    return torch.cat([mha(x[:, t:t + 1], mask_at(t), positions=torch.tensor([[t]]), cache=cache)
                      for t in range(x.shape[1])], dim=1)  # (B, L, E)


def test_static_cache_refuses_documents_without_query_ids_and_serves_them_with(mha):
    x = torch.randn(1, L, E, dtype=torch.float64)
    docs = torch.tensor([[0, 0, 0, 1, 1, 1]])
    full = mha(x, M.causal() & M.document(docs))
    cache = make_cache("static", 1, H, E // H, max_length=L, dtype=torch.float64)
    with pytest.raises(AttnkitValueError, match=r"a static cache returns all max_length=6 slots, but mask=.* has a "
                                                r"document mask without q_doc_ids.*pass document\(doc_ids, q_doc_ids="):
        mha(x[:, :1], M.causal() & M.document(docs), positions=torch.tensor([[0]]), cache=cache)
    cache = make_cache("static", 1, H, E // H, max_length=L, dtype=torch.float64)
    got = _decode(mha, x, cache, lambda t: M.causal() & M.document(docs, q_doc_ids=docs[:, t:t + 1]))
    assert (got - full).abs().max().item() <= 1e-12


@pytest.mark.parametrize("index_part", ["padding", "document", "dense"])
def test_sliding_cache_refuses_parts_defined_on_key_indices(mha, index_part):
    W = 4
    part = {"padding": M.padding(torch.ones(1, W, dtype=torch.bool)),
            "document": M.document(torch.zeros(1, W, dtype=torch.long)),
            "dense": M.dense(torch.ones(1, 1, 1, W, dtype=torch.bool))}[index_part]
    cache = make_cache("sliding", 1, H, E // H, window=W, dtype=torch.float64)
    with pytest.raises(AttnkitValueError, match=r"a sliding-window cache returns its keys in ring order, but mask=.* "
                                                r"has parts defined on key indices \((padding|document|dense)\)"):
        mha(torch.randn(1, 1, E, dtype=torch.float64), M.sliding_window(W) & part, positions=torch.tensor([[0]]),
            cache=cache)


def test_sliding_cache_with_padding_by_position_equals_the_full_forward(mha):
    from attnkit.models.generation import padding_by_position

    W, n = 4, 10
    x = torch.randn(1, n, E, dtype=torch.float64)
    real = torch.ones(1, n, dtype=torch.bool)
    real[0, :2] = False  # left padding
    positions = torch.arange(n)[None]
    full = mha(x, M.sliding_window(W) & padding_by_position(real, positions))
    cache = make_cache("sliding", 1, H, E // H, window=W, dtype=torch.float64)
    got = _decode(mha, x, cache, lambda t: M.sliding_window(W) & padding_by_position(real, positions))
    assert (got - full)[:, 2:].abs().max().item() <= 1e-12  # real queries (padded rows see no key)

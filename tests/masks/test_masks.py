"""Masks: each kind against its definition on absolute positions, the algebra, pictures and errors."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attnkit as ak
from attnkit.errors import AttnkitTypeError, AttnkitValueError

M = ak.masks


def grid(q_pos, kv_pos):
    return q_pos[:, None], kv_pos[None, :]  # (Lq, 1), (1, Lk)


positions_strategy = st.tuples(st.integers(1, 12), st.integers(0, 12), st.integers(0, 50))


@settings(max_examples=40, deadline=None)
@given(positions_strategy, st.integers(1, 6))
def test_position_masks_match_definitions(lens, param):
    lq, extra, offset = lens
    lk = lq + extra
    kv_pos = torch.arange(lk) + offset
    q_pos = kv_pos[lk - lq:]
    p, j = grid(q_pos, kv_pos)
    expected = {
        M.causal(): j <= p,
        M.sliding_window(param): (j <= p) & (j > p - param),
        M.strided(param): (p - j) % param == 0,
        M.global_tokens([offset, offset + param]): (p == offset) | (p == offset + param) | (j == offset)
        | (j == offset + param),
    }
    for mask, want in expected.items():
        got = mask.to_dense(q_pos, kv_pos)
        assert got.shape == (1, 1, lq, lk)
        assert torch.equal(got[0, 0], want), repr(mask)


def test_int_lengths_are_bottom_right_aligned():
    dense = M.causal().to_dense(2, 5)[0, 0]
    assert dense.tolist() == [[True, True, True, True, False], [True] * 5]


def test_per_batch_positions():
    pos = torch.tensor([[0, 1, 2], [5, 6, 7]])
    assert M.causal().to_dense(pos).shape == (2, 1, 3, 3)


def test_padding_lengths_and_bool_agree():
    lengths = torch.tensor([3, 1])
    real = torch.arange(4)[None, :] < lengths[:, None]  # (B, Lk)
    a = M.padding(lengths).to_dense(4)
    b = M.padding(real).to_dense(4)
    assert a.shape == (2, 1, 4, 4) and torch.equal(a, b)
    assert a[1, 0, 0].tolist() == [True, False, False, False]


def test_document_mask_blocks_other_documents():
    docs = torch.tensor([0, 0, 1, 1, 1])
    dense = (M.document(docs) & M.causal()).to_dense(5)[0, 0]
    same = docs[:, None] == docs[None, :]
    assert torch.equal(dense, same & torch.ones(5, 5, dtype=torch.bool).tril())


def test_document_mask_with_cache_aligns_queries_to_the_end():
    docs = torch.tensor([[0, 0, 1, 1]])
    dense = M.document(docs).to_dense(1, 4)[0, 0]  # the last token (doc 1) as the only query
    assert dense.tolist() == [[False, False, True, True]]
    q_docs = torch.tensor([[0]])
    assert M.document(docs, q_docs).to_dense(1, 4)[0, 0].tolist() == [[True, True, False, False]]


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 9), st.integers(1, 5), st.integers(1, 5))
def test_algebra_matches_tensor_logic(L, w, s):
    a, b = M.sliding_window(w), M.strided(s)
    da, db = a.to_dense(L), b.to_dense(L)
    assert torch.equal((a & b).to_dense(L), da & db)
    assert torch.equal((a | b).to_dense(L), da | db)
    assert torch.equal((~a).to_dense(L), ~da)
    assert torch.equal((~(a & b)).to_dense(L), (~a | ~b).to_dense(L))  # De Morgan


def test_dense_wraps_tensors_per_head():
    t = torch.rand(1, 3, 4, 4) < 0.5
    m = M.dense(t) & M.causal()
    assert m.heads == 3
    assert torch.equal(m.to_dense(4), t & torch.ones(4, 4, dtype=torch.bool).tril())


def test_custom_mask():
    m = M.custom(lambda b, h, q_pos, kv_pos: (q_pos - kv_pos).abs() <= 1, name="band")
    assert torch.equal(m.to_dense(5)[0, 0], M.sliding_window(2).to_dense(5)[0, 0] | M.sliding_window(2).to_dense(5)[0, 0].T)
    assert repr(m) == "custom(band)"


def test_picture_and_repr():
    assert M.causal().picture(3) == "# . .\n# # .\n# # #"
    text = str(M.causal() & M.sliding_window(2))
    assert text.splitlines()[0] == "(causal() & sliding_window(2))"
    assert text.splitlines()[3] == ". # #" + " ." * 5
    big = M.causal().picture(40)
    assert "(top-left 32x32 of 40x40 shown)" in big


@pytest.mark.parametrize(
    ("build", "error", "match"),
    [
        (lambda: M.sliding_window(0), AttnkitValueError, "window must be a positive int"),
        (lambda: M.strided(-2), AttnkitValueError, "stride must be a positive int"),
        (lambda: M.global_tokens([]), AttnkitValueError, "global_tokens positions must be a non-empty"),
        (lambda: M.padding(torch.tensor([[1.0, 0.0]])), AttnkitValueError, "padding.* expects a bool tensor"),
        (lambda: M.padding(torch.tensor([3, -1])), AttnkitValueError, "padding lengths must be >= 0"),
        (lambda: M.document(torch.tensor([0.5, 1.0])), AttnkitValueError, "doc_ids must be an int tensor"),
        (lambda: M.causal() & torch.ones(2, 2, dtype=torch.bool), AttnkitTypeError, "expects another attnkit mask"),
        (lambda: M.dense(torch.ones(2, 2)), AttnkitTypeError, "dense mask must be a bool tensor"),
        (lambda: M.custom(3), AttnkitTypeError, "custom mask fn must be callable"),
    ],
)
def test_builder_errors(build, error, match):
    with pytest.raises(error, match=match):
        build()


@pytest.mark.parametrize(
    ("mask", "args", "match"),
    [
        (lambda: M.padding(torch.ones(1, 3, dtype=torch.bool)), (4,), "padding mask covers 3 keys but the call has Lk=4"),
        (lambda: M.document(torch.zeros(1, 3, dtype=torch.long)), (4,), "doc_ids has length 3 but the call has Lk=4"),
        (lambda: M.document(torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 2, dtype=torch.long)), (4,),
         "q_doc_ids has length 2 but the call has Lq=4"),
        (lambda: M.dense(torch.ones(3, 3, dtype=torch.bool)), (4,), r"does not broadcast to \(Lq, Lk\)"),
        (lambda: M.padding(torch.tensor([1, 2, 3])), (torch.zeros(2, 3, dtype=torch.long),), "batch sizes disagree"),
        (lambda: M.causal(), (torch.ones(3),), "q_positions must be an integer tensor"),
        (lambda: M.causal(), ("3",), "q_positions must be an int64 tensor"),
        (lambda: M.causal(), (-1,), "as a length must be >= 0"),
    ],
)
def test_binding_errors(mask, args, match):
    with pytest.raises((AttnkitValueError, AttnkitTypeError), match=match):
        mask().to_dense(*args)


def test_batch_mismatch_between_mask_data_and_call():
    from attnkit.masks import MaskContext

    ctx = MaskContext(torch.zeros(3, 2, dtype=torch.long), torch.zeros(3, 2, dtype=torch.long))
    with pytest.raises(AttnkitValueError, match="carries data for batch 2 but the call has batch 3"):
        M.padding(torch.tensor([1, 2])).bind(ctx)


def test_document_needs_query_ids_when_queries_outnumber_keys():
    q, k = torch.randn(1, 1, 6, 4), torch.randn(1, 1, 4, 4)
    for backend in ("math", "sdpa", "blocksparse"):
        with pytest.raises(AttnkitValueError, match="pass q_doc_ids"):
            ak.attention(q, k, k, M.document(torch.zeros(1, 4, dtype=torch.long)), backend=backend)

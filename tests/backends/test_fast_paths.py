"""The per-call fast paths: memoised checks and choices, folded GQA decode calls, shared forms of small causal
masks. Each is checked for equal outputs against the float64 reference (tests/oracle.py rule) and for never
serving what it can't prove equal: another shape, dtype, device, mask structure, registry, or edited positions.
Not timed (speed lives in ``attnkit bench dispatch``)."""

from __future__ import annotations

import pytest
import torch

import attnkit as ak
from attnkit import _validation
from attnkit.backends import cost, registry, sdpa
from attnkit.backends.base import Rank
from attnkit.errors import AttnkitTypeError, AttnkitValueError
from attnkit.functional.reference import reference_attention
from attnkit.masks import prepared as prepared_module
from oracle import assert_within_rule

M = ak.masks


def _check(q, k, v, mask=None, **kwargs):
    """ak.attention (auto) in q's dtype against the float64 reference, by the oracle rule."""
    out = ak.attention(q, k, v, mask, **kwargs)
    golden = reference_attention(q.double(), k.double(), v.double(), mask, **kwargs)
    ref_t = reference_attention(q, k, v, mask, **kwargs)
    assert_within_rule(out, ref_t, golden)
    return out


# ------------------------------------------------------------------------------- folded GQA decode calls
@pytest.fixture
def folded_calls(monkeypatch):
    """Count the calls that took the folded path (so a test can't pass by never folding)."""
    calls = []
    real = sdpa._folded

    def spy(call, attn_mask):
        calls.append((call.q_len, call.num_heads, call.num_kv_heads))
        return real(call, attn_mask)

    monkeypatch.setattr(sdpa, "_folded", spy)
    with cost.use(None):  # (routing by rank, where SDPA serves these decode calls: the tests check its fold)
        yield calls


MASKS = {
    "none": lambda B, Lk: None,
    "causal": lambda B, Lk: M.causal(),
    "causal_padding": lambda B, Lk: M.causal() & M.padding(torch.tensor([Lk - 5, Lk])[:B]),
    "window": lambda B, Lk: M.sliding_window(7),
    "bool_tensor": lambda B, Lk: torch.rand(B, 1, 1, Lk) > 0.3,
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads", [(8, 2), (8, 1), (6, 3)])
@pytest.mark.parametrize("q_len", [1, 3, 8])
@pytest.mark.parametrize("mask_name", list(MASKS))
def test_folded_gqa_decode_equals_the_reference(folded_calls, dtype, heads, q_len, mask_name):
    H, Hkv = heads
    B, Lk, D = 2, 37, 16
    q = torch.randn(B, H, q_len, D).to(dtype)
    k, v = (torch.randn(B, Hkv, Lk, D).to(dtype) for _ in range(2))
    _check(q, k, v, MASKS[mask_name](B, Lk))
    # float32 never folds (precision: issue 33 item 4); one bf16 query per head with G < 8 stays on SDPA's own
    # single-query path (sdpa.FOLD_MIN_GROUP_HALF_SINGLE_QUERY)
    unfolded = dtype == torch.float32 or (q_len == 1 and H // Hkv < 8)
    assert folded_calls == ([] if unfolded else [(q_len, H, Hkv)]), "the call's fold decision is not the rule's"


def test_fold_is_skipped_where_rows_cannot_be_regrouped(folded_calls):
    q, k, v = (torch.randn(1, h, 6, 8).bfloat16() for h in (4, 2, 2))  # half precision: the dtype that folds
    _check(q, k, v, M.causal())  # square causal: SDPA's is_causal flag, not folded
    _check(q, k, v, M.causal(), bias=ak.positions.ALiBi(4))  # a bias differs per head
    per_head = torch.rand(1, 4, 6, 6) > 0.3
    per_head[..., 0] = True
    _check(q, k, v, per_head)  # a mask that differs per head
    long_q = torch.randn(1, 4, sdpa.FOLD_MAX_QUERIES + 1, 8).bfloat16()
    kk = torch.randn(1, 2, sdpa.FOLD_MAX_QUERIES + 4, 8).bfloat16()
    _check(long_q, kk, kk.clone(), M.causal())  # a prefill, not a decode step
    _check(q.float(), k.float(), v.float(), M.causal() & M.padding(torch.tensor([5])))  # float32: never folds
    assert folded_calls == []


def test_folded_decode_keeps_nan_rows_and_empty_rows(folded_calls):
    q, k, v = (torch.randn(2, h, n, 16).bfloat16() for h, n in ((8, 3), (2, 10), (2, 10)))
    q[1, 5, 2, 0] = float("nan")
    lengths = torch.tensor([10, 0])  # row 1 sees no key at all
    out = ak.attention(q, k, v, M.padding(lengths))
    assert folded_calls, "the call did not run folded"
    assert torch.isnan(out[1, 5, 2]).all(), "the NaN query's row is not NaN"
    others = torch.ones(2, 8, 3, dtype=torch.bool)
    others[1, 5, 2] = False
    assert (out[1][others[1]] == 0).all(), "rows without a visible key must be 0"
    assert torch.isfinite(out[0]).all()


# ------------------------------------------------------------------------------- the checks' memo
def test_tensor_checks_memo_never_serves_another_signature():
    q, k = torch.randn(1, 4, 5, 8), torch.randn(1, 2, 5, 8)
    ak.attention(q, k, k)  # memoised: this (shapes, dtypes, devices) passed
    with pytest.raises(AttnkitTypeError, match="q, k, v must share one dtype"):
        ak.attention(q, k.double(), k)  # same shapes, another dtype
    with pytest.raises(AttnkitValueError, match="num_heads H=4 must be a multiple of num_kv_heads Hkv=3"):
        ak.attention(q, torch.randn(1, 3, 5, 8), torch.randn(1, 3, 5, 8))
    with pytest.raises(AttnkitValueError, match="q, k, v must be on one device"):
        ak.attention(q, k.to("meta"), k.to("meta"))
    with pytest.raises(AttnkitValueError, match="k head dim 4 differs from q head dim 8"):
        ak.attention(q, torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4))


def test_tensor_checks_memo_is_bounded(monkeypatch):
    monkeypatch.setattr(_validation._CHECKED_TENSORS, "max_entries", 3)
    _validation._CHECKED_TENSORS.clear()
    for L in range(1, 8):
        ak.attention(torch.randn(1, 1, L, 4), torch.randn(1, 1, L, 4), torch.randn(1, 1, L, 4))
        assert len(_validation._CHECKED_TENSORS) <= 3


# ------------------------------------------------------------------------------- auto's memoised choice
class _Picky:
    """A test backend that ranks first for float64 calls only; counts how often it was asked."""

    name = "picky"
    ranks_by_signature = True
    traceable = True

    def __init__(self):
        self.asked = 0

    def available(self):
        return []

    def supports(self, call):
        return []

    def rank(self, call):
        self.asked += 1
        return Rank(100 if call.q.dtype == torch.float64 else -100, "test backend")

    def plan(self, call):
        return "test"

    def __call__(self, call):
        return registry.get("math")(call)


@pytest.fixture
def picky():
    backend = _Picky()
    registry.register(backend)
    yield backend
    registry.unregister("picky")


def _chosen(q, k, v, mask=None, **kwargs):
    return registry.select(_validation.build_call(q, k, v, mask, **kwargs)).name


def test_auto_memo_serves_only_the_same_signature(picky):
    q = torch.randn(1, 2, 4, 8)
    assert _chosen(q, q, q) == "sdpa"
    asked = picky.asked
    assert _chosen(q, q, q) == "sdpa" and picky.asked == asked, "the same signature was ranked again"
    assert _chosen(q.double(), q.double(), q.double()) == "picky"  # another dtype: ranked again
    assert _chosen(q[:, :, :3], q, q) == "sdpa"  # another shape
    assert _chosen(q, q, q, return_weights=True) == "math"  # another option kind
    q.requires_grad_(True)
    assert _chosen(q, q, q) == "sdpa" and picky.asked > asked + 2
    with torch.no_grad():
        assert _chosen(q, q, q) == "sdpa"


def test_register_and_unregister_invalidate_the_memo():
    q = torch.randn(1, 2, 4, 8, dtype=torch.float64)
    assert _chosen(q, q, q) == "sdpa"
    registry.register(_Picky())
    try:
        assert _chosen(q, q, q) == "picky"
    finally:
        registry.unregister("picky")
    assert _chosen(q, q, q) == "sdpa"


def test_a_backend_that_does_not_rank_by_signature_turns_the_memo_off():
    class Moody(_Picky):
        name = "moody"
        ranks_by_signature = False

        def rank(self, call):  # depends on something outside the call
            self.asked += 1
            return Rank(100 if self.asked % 2 else -100, "changes its mind")

    moody = Moody()
    registry.register(moody)
    try:
        q = torch.randn(1, 2, 4, 8)
        assert [_chosen(q, q, q) for _ in range(4)] == ["moody", "sdpa", "moody", "sdpa"]
    finally:
        registry.unregister("moody")


@pytest.mark.parametrize("routing", ["rank", "cost"])
def test_mask_structure_and_data_are_part_of_the_choice(routing):
    L = 64 if routing == "rank" else 2048  # (by predicted cost, separate sequences pay off on longer calls)
    q = torch.randn(1, 2, L, 8)
    docs = torch.arange(L)[None] // (L // 4)
    with cost.use(None if routing == "rank" else cost.DEFAULT_CALIBRATION):
        # the same shapes: a pure causal mask (SDPA's flag), then packed documents (blocksparse's separate sequences)
        assert _chosen(q, q, q, M.causal()) == "sdpa"
        assert _chosen(q, q, q, M.document(docs) & M.causal()) == "blocksparse"
        assert _chosen(q, q, q, M.causal()) == "sdpa"
        shuffled = docs.clone()
        shuffled[0, L - 10:] = 0  # a document id that comes back later: not separate sequences any more
        assert _chosen(q, q, q, M.document(shuffled) & M.causal()) == ("sdpa" if routing == "rank" else "blocksparse")


def test_untraceable_backends_are_skipped_while_compiling(monkeypatch):
    q = torch.randn(1, 2, 4096, 8)
    call = _validation.build_call(q, q, q, M.sliding_window(64))
    assert registry.ranking(call)[0][0] == "blocksparse"
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert "blocksparse" not in dict(registry.ranking(call))
    assert registry.select(call).name == "sdpa"
    why = registry.reasons_against(registry.get("blocksparse"), call)
    assert any("traceable = False" in w for w in why)


# ------------------------------------------------------------------------------- shared forms of causal masks
def test_shared_causal_forms_never_serve_other_positions_shapes_or_batches():
    prepared_module._SHARED.clear()
    q, k = torch.randn(2, 2, 4, 8), torch.randn(2, 2, 20, 8)
    _check(q, k, k, M.causal())  # pure causal on default positions: its dense form is shared
    assert prepared_module._SHARED, "the decode mask's dense form was not shared"
    shifted = torch.arange(4) + 3  # the same shapes, other query positions: another mask
    _check(q, k, k, M.causal(), q_positions=shifted, kv_positions=torch.arange(20))
    _check(q, k[:, :, :17], k[:, :, :17], M.causal())  # another Lk
    _check(q[:1], k[:1], k[:1], M.causal())  # another batch
    _check(q[:, :, :3], k, k, M.causal())  # another Lq


def test_edited_positions_are_read_again_on_the_next_call():
    q, k = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 12, 8)
    kv_positions = torch.arange(12)
    q_positions = torch.tensor([9, 10, 11])
    first = _check(q, k, k, M.causal(), q_positions=q_positions, kv_positions=kv_positions)
    q_positions -= 6  # edited in place between two calls
    second = _check(q, k, k, M.causal(), q_positions=q_positions, kv_positions=kv_positions)
    assert not torch.equal(first, second)


def test_shared_forms_are_bounded(monkeypatch):
    monkeypatch.setattr(prepared_module._SHARED, "max_entries", 2)
    prepared_module._SHARED.clear()
    for Lk in range(4, 12):
        _check(torch.randn(1, 1, 2, 4), torch.randn(1, 1, Lk, 4), torch.randn(1, 1, Lk, 4), M.causal())
        assert len(prepared_module._SHARED) <= 2
    big = prepared_module.SHARED_MAX_ENTRIES  # a prefill-sized mask is never kept across calls
    prepared_module._SHARED.clear()
    pm = M.prepare(M.causal(), 2, big // 2 + 1)
    pm.dense()
    assert not prepared_module._SHARED


def test_every_built_in_backend_ranks_by_signature():
    import attnkit.distributed  # noqa: F401  (registers the context-parallel backend)

    missing = [name for name, b in registry._REGISTRY.items() if not getattr(b, "ranks_by_signature", False)]
    assert not missing, f"{missing} are asked on every call auto routes"
    q = torch.randn(1, 2, 4, 8)
    assert registry._choice_key(_validation.build_call(q, q, q)) is not None


def test_a_folded_decode_call_compiles_into_one_graph():
    """Under torch.compile nothing is memoised and the fold traces: fullgraph=True raises on any graph break."""
    q, k, v = torch.randn(1, 8, 3, 16), torch.randn(1, 2, 20, 16), torch.randn(1, 2, 20, 16)
    compiled = torch.compile(lambda q, k, v: ak.attention(q, k, v, M.causal()), fullgraph=True)
    out = compiled(q, k, v)
    golden = reference_attention(q.double(), k.double(), v.double(), M.causal())
    assert_within_rule(out, reference_attention(q, k, v, M.causal()), golden)

"""The tiled kernel (bias pieces) and its offset tables: against the float64 reference (2x/3x rule), the
offset-table path taken where it should be, skipped keys that change nothing, dropout replayed exactly in
backward, no subnormal weights, and nothing of size Lq x Lk. Not timed."""

from __future__ import annotations

import pytest
import torch
from test_oracle import EDGE_MASKS

import attnkit as ak
from attnkit._validation import build_call
from attnkit.backends import blocksparse, relative, tiled
from attnkit.backends.blocksparse import BlockSparseBackend
from oracle import assert_within_rule, run_with_grads

M = ak.masks
RELATIVE_MASKS = {
    "none": lambda: None,
    "causal": M.causal,
    "window70": lambda: M.sliding_window(70),
    "causal_and_window": lambda: M.causal() & M.sliding_window(200),
}


@pytest.fixture
def workspace_sizes(monkeypatch) -> list[int]:
    """Entries of every workspace buffer the tiled kernel allocates during the test."""
    sizes: list[int] = []
    original_init = tiled._Workspace.__init__

    def spy(self, *args, **kw):
        original_init(self, *args, **kw)
        sizes.extend(b.numel() for b in self.buffers)

    monkeypatch.setattr(tiled._Workspace, "__init__", spy)
    return sizes


def _qkv(B, H, Hkv, Lq, Lk, D, seed=0, dtype=torch.float32, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, Lq, D, generator=g) * scale
    k = torch.randn(B, Hkv, Lk, D, generator=g) * scale
    v = torch.randn(B, Hkv, Lk, D, generator=g)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _check(q, k, v, mask, **kw):
    out, grads = run_with_grads(lambda q, k, v: ak.attention(q, k, v, mask, backend="blocksparse", **kw), [q, k, v])
    ref, ref_grads = run_with_grads(lambda q, k, v: ak.reference_attention(q, k, v, mask, **kw), [q, k, v])
    gold, gold_grads = run_with_grads(lambda q, k, v: ak.reference_attention(q, k, v, mask, **kw),
                                      [q.double(), k.double(), v.double()])
    assert_within_rule(out, ref, gold)
    for name, got, r, gg in zip("qkv", grads, ref_grads, gold_grads):
        assert_within_rule(got, r, gg, factor=3.0, what=f"grad {name}")


@pytest.mark.parametrize("kernel", ["sdpa_pieces", "tiled"])
@pytest.mark.parametrize("mask_name", list(RELATIVE_MASKS))
@pytest.mark.parametrize("length", [1, 63, 64, 65, 127, 128, 129, 257, 1000])
def test_offset_table_path_against_reference(mask_name, length, kernel, monkeypatch):
    """Both kernels of the offset-table path: SDPA per piece with the table slice as its float mask (prefill
    from BLOCK queries on, inference: here forced with gradients too), and the tiled kernel (fewer queries,
    softcap, float64, training)."""
    if kernel == "tiled":
        monkeypatch.setattr(blocksparse, "_relative_on_sdpa", lambda call: False)
    else:
        monkeypatch.setattr(blocksparse, "_trains", lambda call: False)
    mask = RELATIVE_MASKS[mask_name]()
    q, k, v = _qkv(2, 4, 2, length, length, 16, seed=length)
    bias = ak.positions.ALiBi(4)
    assert relative.relative_groups(build_call(q, k, v, mask, bias=bias), mask) is not None
    _check(q, k, v, mask, bias=bias)


@pytest.mark.parametrize("mask_name", list(EDGE_MASKS))
@pytest.mark.parametrize("length", [65, 130])
def test_per_piece_path_on_edge_masks(mask_name, length):
    """Windows longer than the sequence, documents of length 1, empty rows, strided, padding - with ALiBi."""
    g = torch.Generator().manual_seed(length)
    mask = EDGE_MASKS[mask_name](2, length, length, g)
    q, k, v = _qkv(2, 4, 2, length, length, 16, seed=length)
    _check(q, k, v, mask, bias=ak.positions.ALiBi(4))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_offset_table_path_other_dtypes(dtype):
    q, k, v = _qkv(1, 4, 4, 200, 200, 16, dtype=dtype)
    _check(q, k, v, M.causal(), bias=ak.positions.ALiBi(4))


@pytest.mark.parametrize("lq,lk", [(37, 300), (1, 300), (130, 131)])
def test_fewer_queries_than_keys(lq, lk):
    """Default positions put the queries at the end (a chunk of prefill against a cache)."""
    q, k, v = _qkv(1, 8, 2, lq, lk, 16)
    _check(q, k, v, M.causal(), bias=ak.positions.ALiBi(8))


@pytest.mark.parametrize("call_entries", [0, relative.CALL_ENTRIES])
def test_skipped_keys_change_nothing(monkeypatch, call_entries):
    """Steep ALiBi heads reach a few hundred keys back; skipping the rest must match the reference, also when
    large q and k norms give the scores room to overcome the penalty (the reach bound widens). With calls
    free (CALL_ENTRIES = 0) heads group by reach alone; with the default, merged heads read -inf beyond theirs."""
    monkeypatch.setattr(relative, "CALL_ENTRIES", call_entries)
    for scale in (1.0, 6.0):
        q, k, v = _qkv(1, 8, 8, 1000, 1000, 16, seed=3, scale=scale)
        bias = ak.positions.ALiBi(8)
        groups = relative.relative_groups(build_call(q, k, v, M.causal(), bias=bias), M.causal())
        if scale == 1.0 and call_entries == 0:
            assert len(groups) > 1  # some heads stop early
            assert groups[0].pieces[-1].lk < 1000 - 128  # the steepest head's last piece skips the start
        _check(q, k, v, M.causal(), bias=bias)


def test_offsets_of_masks():
    assert M.causal().offsets() == (None, 0)
    assert M.sliding_window(5).offsets() == (-4, 0)
    assert (M.causal() & M.sliding_window(5)).offsets() == (-4, 0)
    assert (M.sliding_window(9) & M.sliding_window(5)).offsets() == (-4, 0)
    for mask in (M.padding([3]), M.causal() | M.sliding_window(2), ~M.causal(), M.causal() & M.padding([3]),
                 M.strided(2), M.global_tokens([0])):
        assert mask.offsets() is None, mask


def test_table_slices_equal_the_bias_and_mask():
    """Every piece's term is exactly ALiBi's score where the mask allows and -inf elsewhere."""
    for mask, lq, lk in ((M.causal(), 300, 300), (M.sliding_window(40), 300, 300), (M.causal(), 70, 333), (None, 150, 150)):
        q, k, v = _qkv(1, 4, 4, lq, lk, 8)
        bias = ak.positions.ALiBi(4)
        call = build_call(q, k, v, mask, bias=bias)
        qp, kp = call.positions()
        allowed = torch.ones(1, 1, lq, lk, dtype=torch.bool) if mask is None else mask.to_dense(qp, kp)
        dense = bias.materialize(qp, kp).masked_fill(~allowed, float("-inf"))  # (1, H, Lq, Lk)
        with torch.no_grad():
            for g in relative.relative_groups(call, mask):
                for p in g.pieces:
                    if p.mode == "empty":
                        assert not allowed[0, 0, p.q_lo:p.q_hi].any()
                        continue
                    (lo, hi), = p.kv
                    term, want = g.terms(p, slice(None), slice(None)), dense[:, g.heads, p.q_lo:p.q_hi, lo:hi]
                    kept = torch.isfinite(term)  # beyond a head's reach the table holds -inf: the bias there is
                    assert torch.equal(term[kept], want[kept])  # below the cutoff (its weight is 0 either way)
                    assert (want[~kept] <= -tiled.CUTOFF).all()
                    outside = torch.cat([allowed[0, 0, p.q_lo:p.q_hi, :lo], allowed[0, 0, p.q_lo:p.q_hi, hi:]], -1)
                    if g.heads == slice(0, 4):  # unpruned: nothing allowed lies outside the piece's keys
                        assert not outside.any()


def test_calls_that_are_not_offset_only_take_the_per_piece_path():
    q, k, v = _qkv(2, 2, 2, 50, 50, 8)
    bias = ak.positions.ALiBi(2)
    for mask, kw in ((M.causal() & M.padding([50, 30]), {}), (M.document(torch.arange(50)[None] // 10), {}),
                     (M.causal(), {"kv_positions": torch.arange(50) * 2, "q_positions": torch.arange(50) * 2}),
                     (M.causal(), {"kv_positions": torch.stack([torch.arange(50), torch.arange(50) + 1]),
                                   "q_positions": torch.stack([torch.arange(50), torch.arange(50) + 1])})):
        call = build_call(q, k, v, mask, bias=bias, **kw)
        assert relative.relative_groups(call, mask) is None
        _check(q, k, v, mask, bias=bias, **kw)
    float_bias = torch.randn(1, 2, 50, 50)
    assert relative.relative_groups(build_call(q, k, v, M.causal(), bias=float_bias), M.causal()) is None


def test_small_chunks_match(monkeypatch):
    """Rows x heads split into chunks when a piece's scores would exceed the chunk budget."""
    monkeypatch.setattr(tiled, "CHUNK_ENTRIES", 128 * 60)
    q, k, v = _qkv(2, 4, 2, 300, 300, 8)
    for mask in (M.causal(), M.sliding_window(100), None):  # table pieces cut into runs of rows
        _check(q, k, v, mask, bias=ak.positions.ALiBi(4))
    _check(q, k, v, M.causal() & M.padding([300, 200]), bias=ak.positions.ALiBi(4))


def test_rows_without_keys_are_zero_with_zero_grads():
    q, k, v = _qkv(1, 2, 2, 20, 20, 8)
    bias = torch.randn(1, 2, 20, 20)
    bias[:, :, 3] = float("-inf")  # row 3 sees nothing
    _check(q, k, v, None, bias=bias)
    out, grads = run_with_grads(lambda q, k, v: ak.attention(q, k, v, bias=bias, backend="blocksparse"), [q, k, v])
    assert torch.equal(out[:, :, 3], torch.zeros_like(out[:, :, 3]))
    assert all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("mask_name", ["causal", "padded"])
def test_dropout_is_replayed_in_backward(mask_name):
    """gradcheck on a seeded call: the backward must draw the same dropout masks as the forward."""
    mask = M.causal() if mask_name == "causal" else M.causal() & M.padding([9, 6])
    q, k, v = (t.requires_grad_() for t in _qkv(2, 2, 2, 9, 9, 4, dtype=torch.float64))
    bias = ak.positions.ALiBi(2)

    def fn(q, k, v):
        torch.manual_seed(0)
        return ak.attention(q, k, v, mask, bias=bias, dropout_p=0.3, backend="blocksparse")

    assert not torch.equal(fn(q, k, v), ak.attention(q, k, v, mask, bias=bias, backend="blocksparse"))
    assert torch.autograd.gradcheck(fn, (q, k, v))


def test_no_subnormal_weights(monkeypatch):
    """Far ALiBi keys underflow; the cutoff zeroes them instead of producing subnormal floats (slow on x86)."""
    seen = []
    original = tiled._probs

    def spy(*args, **kwargs):
        p = original(*args, **kwargs)
        seen.append(int(((p > 0) & (p < torch.finfo(p.dtype).tiny)).sum()))
        return p

    monkeypatch.setattr(tiled, "_probs", spy)
    monkeypatch.setattr(blocksparse, "_relative_on_sdpa", lambda call: False)  # the tiled kernel's offset path
    q, k, v = _qkv(1, 4, 4, 600, 600, 16, scale=3.0)
    monkeypatch.setattr(ak.positions.ALiBi, "reach", lambda self, margin: None)  # no skipping: every key computed
    ak.attention(q, k, v, M.causal(), bias=ak.positions.ALiBi(4), backend="blocksparse")
    assert seen and sum(seen) == 0


def test_nothing_of_size_lq_by_lk(monkeypatch, workspace_sizes):
    L, H = 2048, 2
    q, k, v = (t.requires_grad_() for t in _qkv(1, H, H, L, L, 8))
    monkeypatch.setattr(ak.positions.ALiBi, "materialize", lambda *a: pytest.fail("ALiBi materialised densely"))
    masks = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, attn_mask=None, **kw):
        masks.append(attn_mask.numel())
        return sdpa(*args, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(blocksparse.F, "scaled_dot_product_attention", spy)
    monkeypatch.setattr(blocksparse, "_trains", lambda call: False)  # SDPA pieces (inference) with a backward
    ak.attention(q, k, v, M.causal(), bias=ak.positions.ALiBi(H), backend="blocksparse").sum().backward()
    assert masks and max(masks) <= H * relative.BLOCK * L < L * L  # the SDPA pieces' float masks
    monkeypatch.setattr(blocksparse, "_relative_on_sdpa", lambda call: False)  # the tiled kernel's workspaces
    ak.attention(q, k, v, M.causal(), bias=ak.positions.ALiBi(H), backend="blocksparse").sum().backward()
    assert workspace_sizes and max(workspace_sizes) <= H * relative.BLOCK * L < L * L


def test_explain_names_the_tiled_kernel():
    q, k, v = _qkv(1, 8, 8, 4096, 4096, 16)
    text = str(ak.explain(q, k, v, M.causal(), bias=ak.positions.ALiBi(8)))
    assert "blocksparse" in text and "offset table" in text and "head groups" in text
    assert BlockSparseBackend().supports(build_call(q, k, v, M.causal(), bias=ak.positions.ALiBi(8))) == []


def test_bias_that_needs_a_gradient_is_refused_and_routed_to_sdpa():
    """The tiled kernel gives no gradient to the bias: blocksparse refuses, auto picks SDPA (which does)."""
    q, k, v = _qkv(1, 2, 2, 64, 64, 8)
    bias = torch.randn(1, 2, 64, 64, requires_grad=True)
    with pytest.raises(ak.errors.BackendUnsupportedError, match="no gradient to the bias"):
        ak.attention(q, k, v, M.causal(), bias=bias, backend="blocksparse")
    got, got_grads = run_with_grads(lambda q, k, v, b: ak.attention(q, k, v, M.causal(), bias=b, backend="sdpa"),
                                    [q, k, v, bias])
    ref, ref_grads = run_with_grads(lambda q, k, v, b: ak.reference_attention(q, k, v, M.causal(), bias=b),
                                    [q, k, v, bias])
    gold, gold_grads = run_with_grads(lambda q, k, v, b: ak.reference_attention(q, k, v, M.causal(), bias=b),
                                      [t.double() for t in (q, k, v, bias)])
    assert_within_rule(got, ref, gold)
    assert_within_rule(got_grads[3], ref_grads[3], gold_grads[3], factor=3.0, what="grad bias")
    long_q, long_k, long_v = _qkv(1, 2, 2, 4096, 4096, 8)
    long_bias = torch.zeros(1, 2, 4096, 4096, requires_grad=True)
    assert ak.explain(long_q, long_k, long_v, M.sliding_window(64), bias=long_bias).chosen == "sdpa"


def test_workspaces_stay_under_the_chunk_budget(monkeypatch, workspace_sizes):
    """One piece of all queries (padding, no mask) is cut into runs of rows: no Lq x Lk workspace."""
    monkeypatch.setattr(tiled, "CHUNK_ENTRIES", 128 * 60)
    q, k, v = _qkv(2, 2, 2, 600, 600, 8)
    for mask in (M.padding([600, 500]), None):
        _check(q, k, v, mask, bias=torch.randn(1, 2, 600, 600))
        _check(q, k, v, mask, bias=ak.positions.ALiBi(2))
    assert workspace_sizes and max(workspace_sizes) <= 128 * 60


def test_queries_before_every_key_see_nothing():
    """With Lq > Lk the defaults put the first Lq - Lk queries before every key (bottom-right, issue 21 item 11),
    exactly as explicit negative positions do: zero rows."""
    q, k, v = _qkv(1, 2, 2, 300, 200, 8)
    pos = {"q_positions": torch.arange(-100, 200), "kv_positions": torch.arange(200)}
    for given in ({}, pos):
        _check(q, k, v, M.causal(), bias=ak.positions.ALiBi(2), **given)
        out = ak.attention(q, k, v, M.causal(), bias=ak.positions.ALiBi(2), backend="blocksparse", **given)
        assert torch.equal(out[:, :, :100], torch.zeros_like(out[:, :, :100]))  # before every key: no visible key


def test_learnable_alibi_slopes_are_routed_to_a_backend_that_trains_them():
    """A bias is asked whether it needs a gradient (here a buffer made trainable), not only its parameters."""
    alibi = ak.positions.ALiBi(2)
    alibi.slopes.requires_grad_(True)
    q, k, v = _qkv(1, 2, 2, 4096, 4096, 8)
    assert ak.explain(q, k, v, M.sliding_window(256), bias=alibi).chosen == "sdpa"
    small = _qkv(1, 2, 2, 32, 32, 8)
    with pytest.raises(ak.errors.BackendUnsupportedError, match="no gradient to the bias"):
        ak.attention(*small, M.causal(), bias=alibi, backend="blocksparse")
    ak.attention(*small, M.causal(), bias=alibi).sum().backward()
    assert alibi.slopes.grad is not None and torch.isfinite(alibi.slopes.grad).all()


@pytest.mark.parametrize("seed", [2, 14, 17])
@pytest.mark.parametrize("mask_name", ["none", "causal"])
def test_single_query_row_is_as_accurate_as_the_reference(seed, mask_name):
    """Issue 21 item 12 (B=1, H=2, Lq=1, Lk=65, D=40, ALiBi, large logits): the row-major key copy summed a
    single row's D products one after another, ~15% more rounding than the reference's ``q @ k^T``; at these
    seeds the output missed the 2x rule. One query row now reads the keys as the reference does."""
    q, k, v = _qkv(1, 2, 2, 1, 65, 40, seed=seed, scale=4.0)
    _check(q, k, v, RELATIVE_MASKS[mask_name](), bias=ak.positions.ALiBi(2))


def test_inference_takes_the_sdpa_pieces_and_training_the_tiled_kernel(monkeypatch):
    """Without gradients ALiBi under a window runs as SDPA pieces (the forward speed; causal half precision
    takes key rows, tests/backends/test_key_rows.py); with them, the tiled kernel (whose backward is 2-3x
    faster than SDPA's with a float mask on CPU). Both against the reference."""
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(blocksparse.F, "scaled_dot_product_attention", lambda *a, **kw: calls.append(1) or sdpa(*a, **kw))
    bias = ak.positions.ALiBi(4)
    window = M.sliding_window(200)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):  # half precision: a float32 mask on the CPU
        q, k, v = _qkv(2, 4, 2, 300, 300, 16, dtype=dtype)
        with torch.no_grad():
            out = ak.attention(q, k, v, window, bias=bias, backend="blocksparse")
            golden = ak.reference_attention(q.double(), k.double(), v.double(), window, bias=bias)
            assert_within_rule(out, ak.reference_attention(q, k, v, window, bias=bias), golden)
        assert calls, dtype
        calls.clear()
    q, k, v = _qkv(2, 4, 2, 300, 300, 16)
    _check(q, k, v, M.causal(), bias=bias)
    assert not calls


def test_offset_table_is_built_once_per_prepared_mask_and_bias(monkeypatch):
    """Layers sharing a prepared mask and equal ALiBi slopes read one table; other slopes get their own (a
    window: under a causal mask these slopes would run as key rows, without a table)."""
    builds = []
    original = relative.OffsetTable._build
    monkeypatch.setattr(relative.OffsetTable, "_build", lambda self, dtype: builds.append(1) or original(self, dtype))
    q, k, v = _qkv(1, 4, 4, 300, 300, 16)
    window = M.sliding_window(200)
    prepared = ak.masks.prepare(window, 300)
    with torch.no_grad():
        first = ak.attention(q, k, v, prepared, bias=ak.positions.ALiBi(4), backend="blocksparse")
        again = ak.attention(q, k, v, prepared, bias=ak.positions.ALiBi(4), backend="blocksparse")  # another layer
        assert len(builds) == 1 and torch.equal(first, again)
        other = ak.positions.ALiBi(4, slopes=torch.tensor([0.3, 0.2, 0.1, 0.05]))
        out = ak.attention(q, k, v, prepared, bias=other, backend="blocksparse")
        assert len(builds) == 2
        golden = ak.reference_attention(q.double(), k.double(), v.double(), window, bias=other)
        assert_within_rule(out, ak.reference_attention(q, k, v, window, bias=other), golden)

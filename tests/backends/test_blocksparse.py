"""blocksparse: plans skip what the mask excludes (cost follows the unmasked entries), small tiles against the
reference, and no Lq x Lk tensor for structured masks and ALiBi. Not timed."""

from __future__ import annotations

import pytest
import torch
from test_oracle import MASKS

import attnkit as ak
from attnkit._bias import StructuredBias
from attnkit._validation import build_call
from attnkit.backends import block_groups, block_plan
from attnkit.backends.blocksparse import make_plans
from attnkit.masks import blocks
from attnkit.masks.dense import context_for
from oracle import assert_within_rule, run_with_grads

M = ak.masks
# masks whose diagonal tiles are full (not causal) on tile-aligned documents: they must never run as causal
SMALL_TILE_MASKS = {
    **MASKS,
    "aligned_docs_bidirectional": lambda B, Lq, Lk, g: M.document(torch.arange(Lk)[None].expand(B, -1) // 8),
    "aligned_docs_window": lambda B, Lq, Lk, g: M.document(torch.arange(Lk)[None] // 16) & M.sliding_window(12),
}


def _plan(mask, L, Lq=None, bias=None):
    q = torch.empty(1, 2, Lq or L, 8)
    k = torch.empty(1, 2, L, 8)
    return make_plans(build_call(q, k, k, mask, bias=bias))[0]


def test_window_plan_grows_linearly_and_is_stacked():
    for n in (4096, 16384):
        plan = _plan(M.sliding_window(256), n)
        assert plan.density() < 2.2 * 512 / n  # ~ (256 + tile slack) keys per query, not n
        assert len(plan.groups()) <= 4  # equal pieces share one kernel call


def test_documents_are_causal_squares_in_one_call():
    docs = torch.arange(16384)[None] // 2048  # 8 documents of 2048
    plan = _plan(M.document(docs) & M.causal(), 16384)
    assert [(p.lq, p.mode) for p in plan.pieces] == [(2048, "causal")] * 8
    assert len(plan.groups()) == 1


def test_strided_is_regrouped_by_residue():
    plan = _plan(M.causal() & M.strided(64), 8192)
    assert plan.q_perm is not None
    assert {p.mode for p in plan.pieces} == {"causal"} and len(plan.groups()) == 1
    assert plan.density() <= 1 / 64


def test_cover_is_sound_against_the_dense_mask():
    """Tiles marked empty hold no allowed entry; tiles marked full hold no masked one (every mask kind)."""
    g = torch.Generator().manual_seed(0)
    Lq, L, bs = 37, 70, 8  # queries are the last 37 keys: tile edges of queries and keys do not line up
    for name, make in MASKS.items():
        mask = make(2, Lq, L, g)
        if mask is None or isinstance(mask, torch.Tensor):
            mask = M.dense(mask) if mask is not None else M.causal()
        ctx = context_for(mask, Lq, L, batch=2)
        grid = blocks.BlockGrid(ctx, torch.arange(2), torch.arange(Lq), torch.arange(L), bs, bs)
        cov = blocks.cover(mask, grid)
        dense = mask.to_dense(Lq, L, batch=2)  # (2, H, Lq, L)
        has_any = torch.nn.functional.pad(dense.any(1).any(0).to(torch.int8), (0, 2, 0, 3))  # (40, 72) whole tiles
        has_any = has_any.view(5, bs, 9, bs).amax(dim=(1, 3)).bool()
        assert not (has_any & ~cov.any).any(), f"{name}: a tile marked empty holds allowed entries"
        every = dense.all(1).all(0)
        every = torch.nn.functional.pad(every.to(torch.int8), (0, 2, 0, 3), value=1).view(5, bs, 9, bs)
        assert not (cov.full & ~every.amin(dim=(1, 3)).bool()).any(), f"{name}: a tile marked full has masked entries"


@pytest.mark.parametrize("mask_name", list(SMALL_TILE_MASKS))
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("B", [1, 2])
def test_small_tiles_against_reference(monkeypatch, mask_name, bias, B):
    """Tiles of 8 make every plan multi-tile at small sizes: runs, merges, stacking and empty pieces; one batch
    row takes the views (queries, unfolded key bands) and broadcast masks, two rows the gathers."""
    monkeypatch.setattr(block_plan, "BLOCK", 8)
    monkeypatch.setattr(block_plan, "MAX_PIECE", 32)
    g = torch.Generator().manual_seed(1)
    H, Hkv, L, D = 4, 2, 61, 16
    q, k, v = torch.randn(B, H, L, D, generator=g), torch.randn(B, Hkv, L, D, generator=g), torch.randn(B, Hkv, L, D, generator=g)
    mask = SMALL_TILE_MASKS[mask_name](B, L, L, g)
    kwargs = {"bias": ak.positions.ALiBi(H)} if bias else {}
    out, grads = run_with_grads(lambda q, k, v: ak.attention(q, k, v, mask, backend="blocksparse", **kwargs), [q, k, v])
    ref, ref_grads = run_with_grads(lambda q, k, v: ak.reference_attention(q, k, v, mask, **kwargs), [q, k, v])
    gold, gold_grads = run_with_grads(lambda q, k, v: ak.reference_attention(q, k, v, mask, **kwargs),
                                      [q.double(), k.double(), v.double()])
    assert_within_rule(out, ref, gold)
    for got, r, gg in zip(grads, ref_grads, gold_grads):
        assert_within_rule(got, r, gg, factor=3.0, what="grad")


def test_alibi_and_masks_never_build_an_lq_by_lk_tensor(monkeypatch):
    """ALiBi is evaluated per piece from positions; no mask or bias tensor reaches Lq x Lk."""
    def no_materialize(self, *args):
        raise AssertionError("ALiBi materialised densely")

    monkeypatch.setattr(StructuredBias, "materialize", no_materialize)
    monkeypatch.setattr(ak.positions.ALiBi, "materialize", no_materialize)
    L = 1536
    largest = []
    original = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kw):
        if attn_mask is not None:
            largest.append(attn_mask.shape[-2] * attn_mask.shape[-1])
        return original(q, k, v, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    q = k = v = torch.randn(1, 2, L, 8)
    ak.attention(q, k, v, M.causal(), bias=ak.positions.ALiBi(2), backend="blocksparse")
    ak.attention(q, k, v, M.sliding_window(64) | M.global_tokens([0]), backend="blocksparse")
    assert largest and max(largest) <= block_plan.MAX_PIECE * L < L * L


SOFTCAP_MASKS = {"none": None, "causal": M.causal(), "window": M.sliding_window(40),
                 "docs": M.document(torch.arange(160)[None] // 50) & M.causal(), "chunked": M.chunked(48)}


@pytest.mark.parametrize("name", list(SOFTCAP_MASKS))
@pytest.mark.parametrize("bias", [None, "alibi"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_softcap_with_gradients(name, bias, dtype):
    """Logit softcapping on blocksparse, forward and backward, against the float64 reference (issue 11)."""
    mask = SOFTCAP_MASKS[name]
    bias = ak.positions.ALiBi(4) if bias else None
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, n, 160, 24, generator=g) * 3 for n in (4, 2, 2))  # * 3: scores beyond the cap
    kwargs = {"bias": bias, "softcap": 5.0}
    golden, golden_g = run_with_grads(lambda *t: ak.reference_attention(*t, mask, **kwargs),
                                      [t.double() for t in (q, k, v)])
    low = [t.to(dtype) for t in (q, k, v)]
    ref, ref_g = run_with_grads(lambda *t: ak.reference_attention(*t, mask, **kwargs), low)
    out, out_g = run_with_grads(lambda *t: ak.attention(*t, mask, backend="blocksparse", **kwargs), low)
    assert_within_rule(out, ref, golden)
    for got, want, gold, what in zip(out_g, ref_g, golden_g, "qkv"):
        assert_within_rule(got, want, gold, factor=3.0, what=f"d{what}")


def test_softcap_with_gradients_on_cpu_routes_to_blocksparse():
    """Before: softcap with gradients fell to math's full (B, H, Lq, Lk) scores on CPU."""
    q, k, v = (torch.randn(1, 2, 4096, 8, requires_grad=True) for _ in range(3))
    e = ak.explain(q, k, v, M.sliding_window(256), softcap=30.0)
    assert e.chosen == "blocksparse" and "reachable key blocks" in e.why[0]
    assert ak.explain(q, k, v, None, softcap=30.0).chosen == "blocksparse"  # no mask: tiled, still no Lq x Lk


@pytest.mark.parametrize("bias", [None, "alibi"])
def test_pieces_read_the_prepared_masks_bound_function(monkeypatch, bias):
    """Issue 20 item 5: masked pieces evaluate the prepared mask's bound function; nothing binds the mask again
    per piece group or per layer (the old evaluate_on re-bound it for every group of pieces)."""
    L = 300
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, L, 8, generator=g) for _ in range(3))
    mask = M.causal() & M.strided(3)  # masked pieces (not an offset interval: the per-piece path with a bias)
    prepared = ak.masks.prepare(mask, L)
    kw = {} if bias is None else {"bias": ak.positions.ALiBi(2)}
    first = ak.attention(q, k, v, prepared, backend="blocksparse", **kw)  # binds once, through prepared.fn
    binds = []
    for cls in {type(mask), *(type(p) for p in mask.parts)}:
        original = cls.bind
        monkeypatch.setattr(cls, "bind", lambda self, ctx, original=original: binds.append(self) or original(self, ctx))
    for _ in range(2):  # two more "layers" sharing the prepared mask
        torch.testing.assert_close(ak.attention(q, k, v, prepared, backend="blocksparse", **kw), first)
    assert binds == []
    golden = ak.attention(q.double(), k.double(), v.double(), mask, backend="math", **kw)
    assert_within_rule(first, ak.attention(q, k, v, mask, backend="math", **kw), golden)


def test_window_band_runs_as_views_with_one_broadcast_mask(monkeypatch):
    """A sliding window's band of blocks: every masked piece's mask is the same, kept once (T = 1) in the
    prepared mask's memo and broadcast by the kernel; keys enter as unfolded views (no gathered copies);
    outputs and gradients within the tolerance rule of the float64 reference."""
    L, W = 1024, 256
    mask = M.causal() & M.sliding_window(W)
    prepared = ak.masks.prepare(mask, L)
    g = torch.Generator().manual_seed(2)
    q, k, v = torch.randn(1, 8, L, 16, generator=g), torch.randn(1, 2, L, 16, generator=g), torch.randn(1, 2, L, 16, generator=g)
    masks, gathers = [], []
    original_sdpa, original_take = torch.nn.functional.scaled_dot_product_attention, block_groups._take

    def spy(q, k, v, attn_mask=None, **kw):
        if attn_mask is not None:
            masks.append(tuple(attn_mask.shape))
        return original_sdpa(q, k, v, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    monkeypatch.setattr(block_groups, "_take", lambda x, idx: gathers.append(idx.shape) or original_take(x, idx))
    out, grads = run_with_grads(lambda q, k, v: ak.attention(q, k, v, prepared, backend="blocksparse"), [q, k, v])
    assert masks == [(1, 1, 64, 64 + W)]  # one masked call of every 64-query tile, its mask shared
    assert gathers == []
    ref, ref_grads = run_with_grads(lambda q, k, v: ak.reference_attention(q, k, v, mask), [q, k, v])
    gold, gold_grads = run_with_grads(lambda q, k, v: ak.reference_attention(q, k, v, mask),
                                      [q.double(), k.double(), v.double()])
    assert_within_rule(out, ref, gold)
    for got, r, gg in zip(grads, ref_grads, gold_grads):
        assert_within_rule(got, r, gg, factor=3.0, what="grad")

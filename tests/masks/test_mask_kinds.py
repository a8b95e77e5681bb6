"""The mask kinds added through the extension points: ``chunked(C)`` (Llama 4 local layers) and the two-sided
``sliding_window(left, right)`` (flash-attn window_size). Each: its definition, a block cover (never probed),
served by blocksparse and flex, and by the caches (a ring buffer of C serves chunked decoding). Also: no
built-in mask kind falls back to per-element probing."""

from __future__ import annotations

import pytest
import torch

import attnkit as ak
from attnkit._validation import build_call
from attnkit.backends import flex
from attnkit.backends.blocksparse import make_plans
from attnkit.cache import make_cache
from attnkit.errors import AttnkitTypeError, AttnkitValueError
from attnkit.masks import blocks, spec
from attnkit.masks.blocks import cover, probe
from oracle import assert_within_rule

M = ak.masks

#: one example of every built-in mask kind (a new kind without an example fails the probing test below)
EXAMPLES = {
    M.Causal: M.causal(), M.SlidingWindow: M.sliding_window(5), M.TwoSidedWindow: M.sliding_window(3, 2),
    M.Chunked: M.chunked(6), M.Strided: M.strided(4), M.GlobalTokens: M.global_tokens([0, 9]),
    M.Padding: M.padding(torch.tensor([13, 20])), M.PositionPadding: M.padding(start=torch.tensor([4, 0])),
    M.Document: M.document(torch.tensor([[0] * 7 + [1] * 13, [0] * 20])),
    M.Dense: M.dense(torch.rand(2, 1, 1, 20) > 0.3), spec.And: M.causal() & M.chunked(8),
    spec.Or: M.sliding_window(4) | M.global_tokens([0]), spec.Not: ~M.strided(3),
}
OPAQUE = {M.Custom}  # an arbitrary function: probing is the only honest cover


def all_kinds(cls=spec.MaskSpec):
    for sub in cls.__subclasses__():
        yield sub
        yield from all_kinds(sub)


def test_no_built_in_mask_kind_falls_back_to_probing(monkeypatch):
    kinds = {k for k in all_kinds() if k.__module__.startswith("attnkit.masks.") and k is not spec.Combination}
    assert {M.Causal, M.Padding, spec.And} <= kinds  # the scan finds the kinds where they live
    assert kinds - OPAQUE <= set(EXAMPLES), f"add an example (and a block cover) for {kinds - OPAQUE - set(EXAMPLES)}"

    def refuse(mask, grid):
        raise AssertionError(f"{mask!r} fell back to per-element probing")

    monkeypatch.setattr(blocks, "probe", refuse)
    for kind, mask in EXAMPLES.items():
        assert cover.dispatch(kind) is not cover.dispatch(object), f"{kind.__name__} has no block cover"
        cover(mask, M.prepare(mask, 20, batch=2).grid(4))  # every part of combinations too


@pytest.mark.parametrize("kind", list(EXAMPLES), ids=lambda k: k.__name__)
@pytest.mark.parametrize("shift", [0, 5])
def test_covers_are_safe(kind, shift):
    """``any`` is never False where an entry is allowed; ``full`` never True where one is not."""
    mask = EXAMPLES[kind]
    kv = torch.arange(20) + shift
    pm = M.prepare(mask, kv[-13:], kv, batch=2)
    for block in (1, 3, 4, 7):
        got, truth = cover(mask, pm.grid(block)), probe(mask, pm.grid(block))
        assert not (truth.any & ~got.any).any() and not (got.full & ~truth.full).any(), (mask, block)


def test_definitions():
    p, j = torch.arange(20)[:, None], torch.arange(20)[None, :]
    assert torch.equal(M.chunked(6).to_dense(20)[0, 0], (j // 6 == p // 6) & (j <= p))
    assert torch.equal(M.sliding_window(3, 2).to_dense(20)[0, 0], (p - 3 <= j) & (j <= p + 2))
    assert torch.equal(M.sliding_window(4, 0).to_dense(20), M.sliding_window(5).to_dense(20))
    assert M.chunked(6).reach() == (-5, 0) and M.sliding_window(3, 2).reach() == (-3, 2)
    assert M.sliding_window(3, 2).offsets() == (-3, 2) and M.chunked(6).offsets() is None
    assert repr(M.chunked(6)) == "chunked(6)" and repr(M.sliding_window(3, 2)) == "sliding_window(3, 2)"


def test_constructor_errors():
    with pytest.raises(AttnkitValueError, match=r"chunk must be a positive int, got 0; use chunk >= 1"):
        M.chunked(0)
    with pytest.raises(AttnkitValueError, match=r"left must be >= 0, got -1; use ints >= 0"):
        M.sliding_window(-1, 2)
    with pytest.raises(AttnkitTypeError, match=r"right must be an int, got .*; use ints >= 0"):
        M.sliding_window(3, 1.5)


def qkv(B=2, H=4, Hkv=2, L=300, D=16, grad=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, D, generator=g).requires_grad_(grad)
    k = torch.randn(B, Hkv, L, D, generator=g).requires_grad_(grad)
    return q, k, torch.randn(B, Hkv, L, D, generator=g).requires_grad_(grad)


MASKS = {"chunked": M.chunked(96), "chunked&causal&pad": M.chunked(70) & M.padding(torch.tensor([300, 211])),
         "two-sided": M.sliding_window(40, 17), "two-sided|global": M.sliding_window(40, 0) | M.global_tokens([3])}


@pytest.mark.parametrize("name", list(MASKS))
def test_blocksparse_serves_and_skips(name):
    mask = MASKS[name]
    q, k, v = qkv(grad=True)
    out = ak.attention(q, k, v, mask, backend="blocksparse")
    golden = ak.reference_attention(*(t.double() for t in (q, k, v)), mask)
    assert_within_rule(out, ak.reference_attention(q, k, v, mask), golden)
    out.square().sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    ak.reference_attention(q, k, v, mask).square().sum().backward()
    ref = [t.grad for t in (q, k, v)]
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    ak.reference_attention(qd, kd, vd, mask).square().sum().backward()
    for g, r, gold, what in zip(grads, ref, (qd.grad, kd.grad, vd.grad), "qkv"):
        assert_within_rule(g, r, gold, factor=3.0, what=f"d{what}")



@pytest.mark.parametrize("mask", [M.chunked(256), M.sliding_window(100, 50)], ids=repr)
def test_blocksparse_skips_blocks_of_the_new_kinds(mask):
    q = torch.zeros(1, 1, 2048, 8)
    plan = make_plans(build_call(q, q, q, mask))[0]
    assert plan.density() < 0.25, plan.describe()  # chunked: 1/8 reachable; window: 151 of 2048 keys + 256-row pieces


@pytest.fixture
def _flex_cpu():
    flex.allow_cpu_compile(True)
    yield
    flex._STATE["cpu_compile"] = None


def test_flex_serves_the_new_kinds(_flex_cpu):
    q, k, v = qkv(B=1, L=256)
    for mask in (M.chunked(96), M.sliding_window(40, 17)):
        with torch.no_grad():
            out = ak.attention(q, k, v, mask, backend="flex")
        golden = ak.reference_attention(*(t.double() for t in (q, k, v)), mask)
        assert_within_rule(out, ak.reference_attention(q, k, v, mask), golden)


def decode(mha, x, mask, cache, chunks):
    outs, i = [], 0
    for n in chunks:
        outs.append(mha(x[:, i:i + n], mask, positions=torch.arange(i, i + n)[None], cache=cache))
        i += n
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize("mask, kind, window", [
    (M.chunked(5), "sliding", 5), (M.chunked(5), "dynamic", None), (M.chunked(5), "static", None),
    (M.sliding_window(3, 0), "sliding", 4), (M.chunked(4) & M.causal(), "sliding", 6)])
def test_caches_serve_the_new_kinds(mask, kind, window):
    """Decoding through a cache equals the full forward; a ring of C slots serves chunked(C)."""
    torch.manual_seed(0)
    mha = ak.nn.MultiHeadAttention(32, 4, num_kv_heads=2, positions="rope").eval()
    x = torch.randn(2, 17, 32)
    with torch.no_grad():
        full = mha(x, mask, positions=torch.arange(17)[None])
        for chunks in ([1] * 17, [6, 1, 1, 4, 5], [17]):
            cache = make_cache(kind, 2, num_kv_heads=2, head_dim=8, max_length=17, window=window)
            got = decode(mha, x, mask, cache, chunks)
            assert float((got - full).abs().max()) <= 1e-5, chunks
    if kind == "sliding":
        assert cache.memory_bytes() == 2 * 2 * 2 * window * 8 * 4 + 2 * window * 8  # O(C): k, v and positions


def test_caches_refuse_what_they_cannot_hold():
    ring = make_cache("sliding", 1, num_kv_heads=2, head_dim=8, window=4)
    with pytest.raises(AttnkitValueError, match=r"sliding-window cache of window=4 holds only the last 4 keys, but "
                                                r"mask=chunked\(8\) can see further back"):
        ring.check_mask(M.chunked(8))
    with pytest.raises(AttnkitValueError, match=r"with a KV cache the mask must be causal, got mask=sliding_window\(3, 1\)"):
        make_cache("dynamic", 1, num_kv_heads=2, head_dim=8).check_mask(M.sliding_window(3, 1))
    ring.check_mask(M.chunked(4))  # reaches 3 back: fits a ring of 4
    with pytest.raises(AttnkitValueError, match=r"returns its keys in ring order, but mask=\(chunked\(4\) & "
                                                r"padding\(lengths=\[3\]\)\) has parts defined on key indices"):
        ring.check_mask(M.chunked(4) & M.padding(torch.tensor([3])))  # key indices stop being positions on wrap

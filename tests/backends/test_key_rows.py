"""ALiBi under a causal mask as key rows: SDPA's fused CPU kernel with its causal flag and a ``(1, h, 1, Lk)``
row of key terms (relative.key_row), in query segments merged by log-sum-exp. Checked against the float64
oracle (docs/conventions.md's rule), with a spy that the path ran and how many segments each head group took.
Not timed."""

from __future__ import annotations

import pytest
import torch

import attnkit as ak
from attnkit.backends import blocksparse, relative
from oracle import assert_within_rule, run_with_grads

M = ak.masks


def _qkv(B, H, Hkv, L, D, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, h, L, D, generator=g).to(dtype) for h in (H, Hkv, Hkv))


@pytest.fixture
def key_row_segments(monkeypatch):
    """The segment count of every key-row group that ran; inference takes key rows from BLOCK queries on here
    (by default from KEY_ROW_MIN_QUERIES), so that the small shapes below exercise them."""
    monkeypatch.setattr(blocksparse, "KEY_ROW_MIN_QUERIES", relative.BLOCK)
    ran = []
    original = blocksparse._sdpa_key_row

    def spy(call, group, k, v):
        ran.append(group.key_row)
        return original(call, group, k, v)
    monkeypatch.setattr(blocksparse, "_sdpa_key_row", spy)
    return ran


@pytest.mark.parametrize("B, H, Hkv, L, D, slopes, segments", [
    (2, 4, 4, 300, 16, None, [1]),  # slopes 1/4..1/256: span 75 (table), 19, 5, 1 (one group, one segment)
    (1, 8, 8, 1024, 64, None, [4, 2, 1]),  # 1/8: span 128 in 4 segments; 1/16: 2; 1/32..1/256: 1
    (1, 4, 2, 640, 32, None, [2, 1]),  # GQA
    (1, 3, 3, 400, 16, torch.tensor([0.3, 0.15, 0.01]), [2, 1]),  # not powers of two: 0.3 falls 120 in a kernel
    # block (table), 0.15 spans 60 (2 segments), 0.01 spans 4
])
def test_key_rows_match_the_oracle(key_row_segments, B, H, Hkv, L, D, slopes, segments):
    q, k, v = _qkv(B, H, Hkv, L, D)
    bias = ak.positions.ALiBi(H, slopes=slopes)
    with torch.no_grad():
        out = ak.attention(q, k, v, M.prepare(M.causal(), L), bias=bias, backend="blocksparse")
    assert sorted(key_row_segments, reverse=True) == segments
    golden = ak.reference_attention(q.double(), k.double(), v.double(), M.causal(), bias=bias)
    assert_within_rule(out, ak.reference_attention(q, k, v, M.causal(), bias=bias), golden)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_key_rows_in_half_precision_take_one_segment(key_row_segments, dtype):
    q, k, v = _qkv(1, 4, 4, 512, 32, dtype=dtype)
    bias = ak.positions.ALiBi(4)
    with torch.no_grad():
        out = ak.attention(q, k, v, M.causal(), bias=bias, backend="blocksparse")
    assert key_row_segments == [1]  # 1/64, 1/256 (spans 8, 2); 1/16's span of 32 in one segment too
    golden = ak.reference_attention(q.double(), k.double(), v.double(), M.causal(), bias=bias)
    assert_within_rule(out, ak.reference_attention(q, k, v, M.causal(), bias=bias), golden)


def test_key_rows_with_gradients_take_one_segment(key_row_segments):
    """With autograd only one-segment heads run as key rows (the kernel's backward), the rest tiled."""
    q, k, v = _qkv(1, 8, 4, 1024, 32)
    bias = ak.positions.ALiBi(8)

    def fn(q, k, v):
        return ak.attention(q, k, v, M.causal(), bias=bias, backend="blocksparse")
    out, grads = run_with_grads(fn, [q, k, v])
    assert key_row_segments == [1]  # 1/32..1/256 (spans <= 32); 1/8 and 1/16 would need segments: tiled
    ref, ref_grads = run_with_grads(lambda q, k, v: ak.reference_attention(q, k, v, M.causal(), bias=bias), [q, k, v])
    gold, gold_grads = run_with_grads(lambda q, k, v: ak.reference_attention(q, k, v, M.causal(), bias=bias),
                                      [t.double() for t in (q, k, v)])
    assert_within_rule(out, ref, gold)
    for name, got, r, gg in zip("qkv", grads, ref_grads, gold_grads):
        assert_within_rule(got, r, gg, factor=3.0, what=f"grad {name}")


@pytest.mark.parametrize("case", ["dropout", "window", "cache", "float64", "per_row_slopes"])
def test_key_rows_only_where_exact(key_row_segments, case):
    """Dropout, windows (not every earlier key), Lq != Lk (the kernel's causal flag aligns top-left), float64
    and per-row slopes (no shared row) keep the earlier paths, matching the oracle."""
    q, k, v = _qkv(2, 4, 4, 384, 16, dtype=torch.float64 if case == "float64" else torch.float32)
    mask = M.sliding_window(100) if case == "window" else M.causal()
    bias = ak.positions.ALiBi(4, slopes=torch.rand(2, 4) / 8) if case == "per_row_slopes" else ak.positions.ALiBi(4)
    if case == "cache":
        q = q[:, :, -200:]
    if case == "dropout":
        torch.manual_seed(0)
        with torch.no_grad():
            ak.attention(q, k, v, mask, bias=bias, dropout_p=0.1, backend="blocksparse")
        assert key_row_segments == []
        return
    with torch.no_grad():
        out = ak.attention(q, k, v, mask, bias=bias, backend="blocksparse")
    assert key_row_segments == []
    golden = ak.reference_attention(q.double(), k.double(), v.double(), mask, bias=bias)
    assert_within_rule(out, ak.reference_attention(q, k, v, mask, bias=bias), golden)


def test_explain_names_the_key_rows():
    q = torch.randn(1, 4, 1024, 16)
    text = ak.explain(q, q, q, M.prepare(M.causal(), 1024), bias=ak.positions.ALiBi(4), backend="blocksparse")
    assert "3 heads as causal SDPA calls with the bias as a row of key terms" in str(text)


def test_short_float32_inference_takes_the_offset_table_pieces(monkeypatch):
    """Below KEY_ROW_MIN_QUERIES queries the fused kernel's causal flag computes the whole square (its key
    blocks hold 512 keys), so float32 inference runs every head as offset-table pieces, which compute the
    triangle; gradients still take key rows (the kernel's backward). Both against the oracle."""
    rows, pieces = [], []
    original_row, original_piece = blocksparse._sdpa_key_row, blocksparse._sdpa_piece
    monkeypatch.setattr(blocksparse, "_sdpa_key_row", lambda *a: rows.append(1) or original_row(*a))
    monkeypatch.setattr(blocksparse, "_sdpa_piece", lambda *a: pieces.append(1) or original_piece(*a))
    L = 512  # < KEY_ROW_MIN_QUERIES
    q, k, v = _qkv(1, 4, 2, L, 32)
    bias = ak.positions.ALiBi(4)
    with torch.no_grad():
        out = ak.attention(q, k, v, M.prepare(M.causal(), L), bias=bias, backend="blocksparse")
    assert not rows and pieces
    text = str(ak.explain(q, k, v, M.prepare(M.causal(), L), bias=bias, backend="blocksparse"))
    assert "SDPA with the table slice as its float mask, 4 query pieces" in text and "key terms" not in text
    golden = ak.reference_attention(q.double(), k.double(), v.double(), M.causal(), bias=bias)
    assert_within_rule(out, ak.reference_attention(q, k, v, M.causal(), bias=bias), golden)
    q.requires_grad_(True)
    ak.attention(q, k, v, M.causal(), bias=bias, backend="blocksparse").sum().backward()
    assert rows  # 1/64, 1/256 as one key-row call with gradients


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("amx, heads", [(True, [4]), (False, [3])])
def test_half_precision_inference_runs_every_head_as_one_key_row_call(monkeypatch, dtype, amx, heads):
    """Half precision inference: one key-row call for every head whose row spans at most HALF_KEY_ROW_SPAN
    (float32's rounding of the row stays far below half precision's); with AMX tiles steep heads too (their
    subnormal weights cost nothing measurable there), without them slope 1/4 (a fall of 128 in one kernel
    block) stays on the offset table. Against the oracle."""
    groups = []
    original = blocksparse._sdpa_key_row
    monkeypatch.setattr(blocksparse, "_sdpa_key_row",
                        lambda call, g, k, v: groups.append(g.heads.stop - g.heads.start) or original(call, g, k, v))
    monkeypatch.setattr(blocksparse, "_amx", lambda: amx, raising=False)
    q, k, v = _qkv(2, 4, 2, 512, 32, dtype=dtype)
    bias = ak.positions.ALiBi(4)  # slopes 1/4 .. 1/256: spans 128 .. 2
    with torch.no_grad():
        out = ak.attention(q, k, v, M.prepare(M.causal(), 512), bias=bias, backend="blocksparse")
    assert groups == heads
    golden = ak.reference_attention(q.double(), k.double(), v.double(), M.causal(), bias=bias)
    assert_within_rule(out, ak.reference_attention(q, k, v, M.causal(), bias=bias), golden)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_key_rows_near_their_span_limit_match_the_oracle(key_row_segments, dtype):
    """Rows spanning up to ~4000 (slope 3.9 over 1024 keys) in one call, large scores (q, k scaled by 3)."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 4, 1024, 32, generator=g) * s for s in (3.0, 3.0, 1.0))
    q, k, v = (t.to(dtype) for t in (q, k, v))
    bias = ak.positions.ALiBi(4, slopes=torch.tensor([3.9, 0.5, 0.01, 0.0]))
    with torch.no_grad():
        out = ak.attention(q, k, v, M.prepare(M.causal(), 1024), bias=bias, backend="blocksparse")
    assert key_row_segments == [1] or not blocksparse._amx()  # without AMX tiles 3.9 and 0.5 stay on the table
    golden = ak.reference_attention(q.double(), k.double(), v.double(), M.causal(), bias=bias)
    assert_within_rule(out, ak.reference_attention(q, k, v, M.causal(), bias=bias), golden)


def test_half_precision_key_rows_stop_at_their_span(monkeypatch):
    """A row spanning more than HALF_KEY_ROW_SPAN (slope 16 over 512 keys: 8176) stays on the offset table."""
    groups = []
    original = blocksparse._sdpa_key_row
    monkeypatch.setattr(blocksparse, "_sdpa_key_row",
                        lambda call, g, k, v: groups.append(g.heads.stop - g.heads.start) or original(call, g, k, v))
    monkeypatch.setattr(blocksparse, "_amx", lambda: True, raising=False)
    q, k, v = _qkv(1, 2, 2, 512, 32, dtype=torch.bfloat16)
    bias = ak.positions.ALiBi(2, slopes=torch.tensor([16.0, 0.01]))
    with torch.no_grad():
        out = ak.attention(q, k, v, M.causal(), bias=bias, backend="blocksparse")
    assert groups == [1]  # 0.01 only
    golden = ak.reference_attention(q.double(), k.double(), v.double(), M.causal(), bias=bias)
    assert_within_rule(out, ak.reference_attention(q, k, v, M.causal(), bias=bias), golden)


def test_key_row_is_the_last_querys_bias():
    """The row holds score(h, Lk - 1, j): query i's bias against j <= i is this entry plus a constant of i."""
    q = torch.randn(1, 2, 300, 8)
    call = ak._validation.build_call(q, q, q, None, bias=ak.positions.ALiBi(2))
    row = relative.key_row(call).double()  # (H, Lk)
    dense = ak.positions.ALiBi(2).materialize(torch.arange(300)[None], torch.arange(300)[None])[0].double()
    i = 123
    torch.testing.assert_close(dense[:, i, :i + 1] - row[:, :i + 1], (dense[:, i, :1] - row[:, :1]).expand(-1, i + 1))

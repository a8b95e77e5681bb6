"""Context parallelism in one process (no process group): layouts, the plan, the local path and every error."""

from __future__ import annotations

import pytest
import torch

import attnkit as ak
from attnkit import distributed as akd
from attnkit.distributed.kernel import merge
from oracle import assert_within_rule, run_with_grads


def _qkv(B=2, H=4, Hkv=2, L=29, D=8, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(B, H, L, D, generator=g, dtype=dtype), torch.randn(B, Hkv, L, D, generator=g, dtype=dtype),
            torch.randn(B, Hkv, L, D, generator=g, dtype=dtype))


# ----------------------------------------------------------------------------- layouts


def test_zigzag_pairs_an_early_and_a_late_chunk():
    layout = akd.zigzag(10, 2)
    assert layout.chunks == (((0, 3), (8, 10)), ((3, 6), (6, 8)))  # 2W = 4 chunks of 3, 3, 2, 2 tokens
    assert layout.index(0).tolist() == [0, 1, 2, 8, 9]


def test_contiguous_handles_lengths_not_divisible_by_world():
    layout = akd.contiguous(11, 4)
    assert [layout.length(r) for r in range(4)] == [3, 3, 3, 2]


def test_unshard_inverts_shard():
    x = torch.randn(2, 3, 13, 5)
    for layout in (akd.zigzag(13, 3), akd.contiguous(13, 4)):
        assert torch.equal(layout.unshard([layout.shard(x, r) for r in range(layout.world)]), x)


def test_by_documents_cuts_at_boundaries_and_balances_work():
    ids = torch.tensor([0] * 8 + [1] * 8 + [2] * 8 + [3] * 8)  # four equal documents
    assert akd.by_documents(ids, 2).chunks == (((0, 16),), ((16, 32),))
    assert akd.by_documents(ids, 4).chunks == (((0, 8),), ((8, 16),), ((16, 24),), ((24, 32),))
    # one huge document: no boundary near the balanced cut, so the cut goes to the balanced position
    layout = akd.by_documents(torch.zeros(100, dtype=torch.long), 2)
    assert 60 <= layout.chunks[0][0][1] <= 75  # causal work grows with position: the first rank takes more tokens


def test_layout_for_picks_by_mask():
    assert akd.layout_for(ak.masks.causal(), 16, 2).kind == "zigzag"
    assert akd.layout_for(ak.masks.sliding_window(4), 16, 2).kind == "contiguous"
    assert akd.layout_for(ak.masks.document(torch.zeros(1, 16, dtype=torch.long)) & ak.masks.causal(), 16,
                          2).kind == "documents"
    assert akd.layout_for(None, 16, 2).kind == "contiguous"


def test_layout_must_cover_the_sequence():
    with pytest.raises(ValueError, match=r"must cover 0..10 exactly once"):
        akd.ShardLayout(10, (((0, 4),), ((5, 10),)))
    with pytest.raises(ValueError, match="seq_len must be >= 1"):
        akd.zigzag(0, 2)
    with pytest.raises(ValueError, match="along dim -2 but the layout covers seq_len=10"):
        akd.contiguous(10, 2).shard(torch.zeros(1, 1, 9, 2), 0)


# ----------------------------------------------------------------------------- merge and the local path


def test_merge_is_exact_and_empty_parts_weigh_nothing():
    g = torch.Generator().manual_seed(1)
    s = torch.randn(1, 1, 3, 10, generator=g, dtype=torch.float64)
    v = torch.randn(10, 4, generator=g, dtype=torch.float64)
    whole = torch.softmax(s, -1) @ v

    def part(cols):
        ps = s[..., cols]
        return torch.softmax(ps, -1) @ v[cols], torch.logsumexp(ps, -1)

    out, lse = merge(*part(slice(0, 4)), *part(slice(4, 10)))
    assert torch.allclose(out, whole) and torch.allclose(lse, torch.logsumexp(s, -1))
    empty = (torch.zeros(1, 1, 3, 4, dtype=torch.float64), torch.full((1, 1, 3), float("-inf"), dtype=torch.float64))
    out2, lse2 = merge(out, lse, *empty)
    assert torch.equal(out2, out) and torch.equal(lse2, lse)
    out3, lse3 = merge(*empty, *empty)
    assert torch.equal(out3, empty[0]) and torch.isneginf(lse3).all()


@pytest.mark.parametrize("mask", [None, ak.masks.causal(), ak.masks.sliding_window(5),
                                  ak.masks.padding([29, 3]) & ak.masks.causal()], ids=repr)
@pytest.mark.parametrize("alibi", [None, "per_head", "per_row"])
def test_one_process_equals_reference(mask, alibi):
    q, k, v = _qkv()
    slopes = torch.rand(2, 4, generator=torch.Generator().manual_seed(3)) * 0.5 + 0.05  # (B, H): per row and head
    bias = None if alibi is None else ak.positions.ALiBi(4, slopes if alibi == "per_row" else None)
    golden = run_with_grads(lambda *t: ak.reference_attention(*t, mask, bias=bias), [t.double() for t in (q, k, v)])
    ref32 = run_with_grads(lambda *t: ak.reference_attention(*t, mask, bias=bias), [q, k, v])
    got = run_with_grads(lambda *t: akd.context_parallel_attention(*t, mask, bias=bias, tile=8), [q, k, v])
    assert_within_rule(got[0], ref32[0], golden[0])
    for g_, r_, gold in zip(got[1], ref32[1], golden[1]):
        assert_within_rule(g_, r_, gold, factor=3.0, what="grad")


def test_explain_in_one_process():
    q, k, v = _qkv()
    e = akd.explain(q, k, v, ak.masks.causal())
    assert e.strategy == "local" and "one process" in e.reason
    assert "strategy: local" in str(e)


def test_plan_skips_shards_no_query_reaches():
    from attnkit.distributed.plan import build_plan
    from attnkit.masks import MaskContext

    pos = torch.arange(64)[None]
    ctx = MaskContext(pos, pos)
    plan = build_plan(ak.masks.sliding_window(8), ctx, akd.contiguous(64, 4), rank=2, tile=4)
    assert [s for s in range(4) if plan.needs[2][s]] == [1, 2]
    assert plan.hops == (1, 1, 1, 0)
    # tiles of rank 2 against shard 1: only the last keys of shard 1 are within 8 of rank 2's first queries
    assert all(t.k0 >= 16 - 8 for t in plan.tiles[1]) and not any(t.full for t in plan.tiles[1][:1])
    # document & causal with positions restarting at each document: the cover alone would send shard 1 to
    # rank 0 (ids and restarted positions overlap); the exact check does not
    ids = torch.tensor([0] * 20 + [1] * 24 + [2] * 20)[None]
    restart = torch.cat([torch.arange(20), torch.arange(24), torch.arange(20)])[None]
    ctx = MaskContext(restart, restart)
    plan = build_plan(ak.masks.document(ids) & ak.masks.causal(), ctx, akd.contiguous(64, 2), rank=0, tile=8)
    assert plan.needs == ((True, False), (True, True))


# ----------------------------------------------------------------------------- errors


def test_errors_name_the_argument_and_the_fix():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="strategy must be one of"):
        akd.context_parallel_attention(q, k, v, strategy="tree")
    with pytest.raises(TypeError, match="layout must be an ak.distributed.ShardLayout"):
        akd.context_parallel_attention(q, k, v, layout=[(0, 29)])
    with pytest.raises(ValueError, match="layout has 2 shards but the process group has 1 ranks"):
        akd.context_parallel_attention(q, k, v, layout=akd.contiguous(29, 2))
    with pytest.raises(ValueError, match="holds q of length 29 and k of length 29 but the layout gives it 30"):
        akd.context_parallel_attention(q, k, v, layout=akd.contiguous(30, 1))
    with pytest.raises(TypeError, match="mask must be an attnkit mask, a bool tensor"):
        akd.context_parallel_attention(q, k, v, mask="causal")
    with pytest.raises(NotImplementedError, match="takes a structured bias"):
        akd.context_parallel_attention(q, k, v, bias=torch.zeros(29, 29))
    alibi = ak.positions.ALiBi(4)
    alibi.slopes.requires_grad_(True)
    with pytest.raises(NotImplementedError, match="needs a gradient"):
        akd.context_parallel_attention(q, k, v, bias=alibi)
    with pytest.raises(ValueError, match="was built for 2 heads but q has 4"):
        akd.context_parallel_attention(q, k, v, bias=ak.positions.ALiBi(2))
    with pytest.raises(ValueError, match=r"has per-row terms for batch 3 but q has batch 2; give it one row of slopes"):
        akd.context_parallel_attention(q, k, v, bias=ak.positions.ALiBi(4, torch.ones(3, 4)))
    per_row = ak.positions.ALiBi(4, torch.nn.Parameter(torch.ones(2, 4)))
    with pytest.raises(NotImplementedError, match="ALiBi needs a gradient, which context parallel attention does not"):
        akd.context_parallel_attention(q, k, v, bias=per_row)  # the probe passes b: it asks, it does not crash
    with pytest.raises(TypeError, match="positions must be an integer tensor"):
        akd.context_parallel_attention(q, k, v, positions=torch.zeros(29))
    with pytest.raises(ValueError, match=r"positions must have shape \(29,\) or \(2, 29\)"):
        akd.context_parallel_attention(q, k, v, positions=torch.arange(28))
    with pytest.raises(ValueError, match="mask distinguishes 3 heads but q has 4"):
        akd.context_parallel_attention(q, k, v, mask=torch.ones(1, 3, 29, 29, dtype=torch.bool))
    with pytest.raises(ValueError, match="tile must be a positive int, got 0"):
        akd.context_parallel_attention(q, k, v, tile=0)


# ----------------------------------------------------------------------------- the sharded scope


def test_model_inside_a_one_rank_scope_equals_the_model():
    """The backend path in one process: layers switch to context_parallel inside, back outside, same output."""
    from attnkit.models.builders import build_lm

    torch.manual_seed(0)
    model = build_lm("nano", positions="alibi")
    tokens = torch.randint(0, 200, (2, 21))
    doc_ids = torch.tensor([0] * 12 + [1] * 9).expand(2, -1)
    positions = torch.cat([torch.arange(12), torch.arange(9)])[None].expand(2, -1)
    expected = model(tokens, positions=positions, doc_ids=doc_ids)
    layout = akd.layout_for(ak.masks.document(doc_ids) & ak.masks.causal(), 21, 1)
    with akd.sharded(layout, ak.masks.document(doc_ids), positions=positions, modules=model):
        assert {m.backend for m in model.modules() if isinstance(m, ak.nn.MultiHeadAttention)} == {"context_parallel"}
        got = model(tokens, positions=positions)  # no doc_ids: the scope's document mask covers the row
    assert {m.backend for m in model.modules() if isinstance(m, ak.nn.MultiHeadAttention)} == {"auto"}
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_backend_serves_nothing_outside_a_scope():
    q, k, v = _qkv()
    assert "context_parallel" not in ak.backends.available()
    with pytest.raises(NotImplementedError, match="serves calls only inside attnkit.distributed.sharded"):
        ak.attention(q, k, v, backend="context_parallel")
    with akd.sharded(akd.contiguous(29, 1), None):
        with pytest.raises(NotImplementedError, match="has no attention dropout"):
            ak.attention(q, k, v, backend="context_parallel", dropout_p=0.1)
        with pytest.raises(NotImplementedError, match="returns no weights"):
            ak.attention(q, k, v, backend="context_parallel", return_weights=True)
        with pytest.raises(NotImplementedError, match="a dense bias tensor has no shard to split"):
            ak.attention(q, k, v, backend="context_parallel", bias=torch.zeros(29, 29))
        with pytest.raises(NotImplementedError, match="a dense mask tensor built from one shard"):
            ak.attention(q, k, v, torch.ones(29, 29, dtype=torch.bool), backend="context_parallel")


def test_gradient_checkpointing_is_refused():
    from attnkit.models.builders import build_lm

    model = build_lm("nano")
    model.gradient_checkpointing = True
    with pytest.raises(NotImplementedError, match="with gradient checkpointing"):
        akd.check_model(model)


# ----------------------------------------------------------------------------- one plan per forward


def _count_plans(monkeypatch) -> list:
    from attnkit.distributed import attention

    built, original = [], attention.build_plan
    monkeypatch.setattr(attention, "build_plan", lambda *a, **kw: built.append(a[2]) or original(*a, **kw))
    return built


def test_a_models_layers_share_one_plan_per_forward(monkeypatch):
    """The plan (who needs which shard, the tiles) is built once per forward and pattern, not once per layer."""
    from attnkit.models.builders import build_lm

    torch.manual_seed(0)
    model = build_lm("nano", num_layers=3)
    tokens = torch.randint(0, 200, (2, 21))
    expected = model(tokens)
    built = _count_plans(monkeypatch)
    for forward in (1, 2):
        with akd.sharded(akd.contiguous(21, 1), None, modules=model):
            got = model(tokens)
        assert len(built) == forward, f"{len(built)} plans after {forward} forward(s) of a 3-layer model"
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    akd.context_parallel_attention(*_qkv(), ak.masks.causal())  # a direct call: no memo, its own plan
    assert len(built) == 3


def test_a_kept_plan_serves_only_its_scope():
    """One prepared mask used in two scopes with different row masks: each gets its own plan and bound mask
    (a memo keyed on the prepared mask alone would serve the first scope's documents to the second)."""
    q, k, v = _qkv()
    prepared = ak.masks.prepare(ak.masks.causal(), 29, batch=2)
    for ids in (torch.tensor([0] * 10 + [1] * 19), torch.tensor([0] * 20 + [1] * 9)):
        documents = ak.masks.document(ids[None].expand(2, -1))
        golden = ak.reference_attention(q.double(), k.double(), v.double(), ak.masks.causal() & documents)
        ref32 = ak.reference_attention(q, k, v, ak.masks.causal() & documents)
        with akd.sharded(akd.contiguous(29, 1), documents):
            for _ in range(2):  # the second call is served from the prepared mask's memo
                got = ak.attention(q, k, v, prepared, backend="context_parallel")
                assert_within_rule(got, ref32, golden)

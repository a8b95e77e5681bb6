"""Packed causal documents as separate sequences (attnkit.backends.varlen, served by blocksparse): against the
float64 reference (docs/conventions.md 2x/3x rule, outputs and gradients), which layouts it takes and which it leaves to
the tile plans, what explain() says, and that nothing crosses from one document to another. Not timed."""

from __future__ import annotations

import pytest
import torch

import attnkit as ak
from attnkit._validation import build_call
from attnkit.backends.varlen import bucket_length, document_runs
from attnkit.training.data import restart_positions
from oracle import assert_within_rule, run_with_grads

M = ak.masks


def _docs(lengths_per_row: list[list[int]]) -> torch.Tensor:
    """Doc ids ``(B, L)``: row b holds documents of the given lengths, ids counting up."""
    return torch.stack([torch.repeat_interleave(torch.arange(len(ls)), torch.tensor(ls)) for ls in lengths_per_row])


LAYOUTS = {
    "one_row_mixed": [[1, 2, 1, 67, 1, 130, 3, 40]],  # length-1 documents, lengths across bucket edges
    "rows_differ": [[5, 17, 23, 3], [48], [1] * 48],  # a whole-row document next to packed rows
    "whole_rows": [[37], [37]],  # every row one document: the rows as they are
    "long_and_short": [[300, 16, 24, 25, 90]],
}


def _qkv(B, H, Hkv, L, D, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, L, D, generator=g).to(dtype), torch.randn(B, Hkv, L, D, generator=g).to(dtype),
            torch.randn(B, Hkv, L, D, generator=g).to(dtype))


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (4, 1)], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("restart", [True, False], ids=["restarting_positions", "default_positions"])
def test_documents_against_the_reference(layout, heads, dtype, restart):
    docs = _docs(LAYOUTS[layout])
    B, L = docs.shape
    H, Hkv = heads
    q, k, v = _qkv(B, H, Hkv, L, 24 if dtype == torch.float32 else 59, dtype)
    mask = M.document(docs) & M.causal()
    kw = {"q_positions": restart_positions(docs), "kv_positions": restart_positions(docs)} if restart else {}
    assert document_runs(build_call(q, k, v, mask, **kw)) is not None, "the documents path did not take the layout"
    out, grads = run_with_grads(lambda q, k, v: ak.attention(q, k, v, mask, backend="blocksparse", **kw), [q, k, v])
    ref, ref_grads = run_with_grads(lambda q, k, v: ak.reference_attention(q, k, v, mask, **kw), [q, k, v])
    gold, gold_grads = run_with_grads(lambda q, k, v: ak.reference_attention(q, k, v, mask, **kw),
                                      [q.double(), k.double(), v.double()])
    assert out.dtype == dtype
    assert_within_rule(out, ref, gold, what="documents output")
    for name, got, r, gg in zip("qkv", grads, ref_grads, gold_grads):
        assert_within_rule(got, r, gg, factor=3.0, what=f"documents grad {name}")


def test_explain_says_documents_run_as_separate_sequences():
    docs = _docs([[100, 200, 212], [512]])
    q, k, v = _qkv(2, 4, 4, 512, 16, torch.float32)
    e = ak.explain(q, k, v, M.document(docs) & M.causal())
    assert e.chosen == "blocksparse", str(e)
    assert "documents run as separate causal sequences" in e.why[0], e.why
    assert "4 documents as separate causal sequences" in e.plan and "SDPA is_causal calls" in e.plan, e.plan
    assert "% of the Lq x Lk entries" in e.plan
    whole = ak.explain(q, k, v, M.document(torch.zeros(2, 512, dtype=torch.long)) & M.causal())
    assert whole.chosen == "blocksparse" and "every row is one document" in whole.plan, whole.plan


@pytest.mark.parametrize("case", ["recurring_id", "positions_not_increasing", "window", "bias", "softcap",
                                  "fewer_queries"])
def test_layouts_it_does_not_describe_go_to_the_tile_plans(case):
    """Where "causal inside each contiguous run" is not the mask, the documents path declines and blocksparse's
    tile plans serve the call (still equal to the reference)."""
    docs = _docs([[20, 30, 14]])
    pos = restart_positions(docs)
    mask, kw, Lq = M.document(docs) & M.causal(), {"q_positions": pos, "kv_positions": pos}, 64
    if case == "recurring_id":  # document 0 comes back: its second run sees the first run's keys
        docs = torch.tensor([[0] * 20 + [1] * 30 + [0] * 14])
        mask = M.document(docs) & M.causal()
    elif case == "positions_not_increasing":
        kw = {"q_positions": pos.flip(-1), "kv_positions": pos.flip(-1)}
    elif case == "window":
        mask = M.document(docs) & M.sliding_window(8)
    elif case == "bias":
        kw = {**kw, "bias": ak.positions.ALiBi(4)}
    elif case == "softcap":
        kw = {**kw, "softcap": 5.0}
    elif case == "fewer_queries":
        Lq, kw = 16, {"q_positions": pos[:, -16:], "kv_positions": pos}
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 4, Lq, 16, generator=g, dtype=torch.float64)
    k, v = (torch.randn(1, 4, 64, 16, generator=g, dtype=torch.float64) for _ in range(2))
    assert document_runs(build_call(q, k, v, mask, **kw)) is None
    assert "separate causal sequences" not in ak.explain(q, k, v, mask, backend="blocksparse", **kw).plan
    golden = ak.attention(q, k, v, mask, backend="math", **kw)
    err = float((ak.attention(q, k, v, mask, backend="blocksparse", **kw) - golden).abs().max())
    assert err < 1e-10, f"{case}: blocksparse differs from the reference by {err:.2e}"


def test_nothing_crosses_between_documents():
    """A NaN in one document's keys and values stays in that document: the padding of a shorter run is a zero
    slot, never a copy of another document's token, so the other documents' outputs and gradients are exactly
    what they are with clean inputs."""
    docs = _docs([[10, 40, 9, 5]])
    q, k, v = _qkv(1, 2, 2, 64, 8, torch.float32)
    bad_k, bad_v = k.clone(), v.clone()
    bad_k[:, :, 3], bad_v[:, :, 4] = float("nan"), float("nan")  # inside document 0 (tokens 0..9)
    mask = M.document(docs) & M.causal()

    def attend(q, k, v):
        return ak.attention(q, k, v, mask, backend="blocksparse")

    out, grads = run_with_grads(attend, [q, bad_k, bad_v])
    clean, clean_grads = run_with_grads(attend, [q, k, v])
    assert torch.isnan(out[:, :, 4:10]).all(), "rows that see the NaN key must be NaN"
    others = slice(10, 64)
    for name, got, want in zip(("out", "grad q", "grad k", "grad v"), (out, *grads), (clean, *clean_grads)):
        assert torch.isfinite(got[:, :, others]).all(), f"{name}: a NaN crossed into another document"
        assert torch.equal(got[:, :, others], want[:, :, others]), f"{name}: another document changed"


def test_bucket_lengths_grow_by_at_most_one_and_a_half():
    sizes = [bucket_length(n) for n in range(1, 5000)]
    assert sizes[:16] == [16] * 16 and bucket_length(17) == 24 and bucket_length(25) == 32 and bucket_length(33) == 48
    assert all(n <= s for n, s in zip(range(1, 5000), sizes))
    classes = sorted(set(sizes))
    assert all(b / a <= 1.5 for a, b in zip(classes, classes[1:])), classes


def test_packed_lm_rows_take_the_documents_path():
    """A TransformerLM forward on packed rows (restarting positions) reaches attention with a mask the documents
    path serves: every layer shares the runs (found once per forward, in the prepared mask)."""
    from attnkit.models.lm import LMConfig, TransformerLM

    model = TransformerLM(LMConfig(embed_dim=32, num_layers=2, num_heads=2, max_seq_len=64))
    doc = _docs([[20, 30, 14], [64]])
    seen = []
    for block in model.blocks:
        block.attn.register_forward_pre_hook(lambda mod, args: seen.append(args[1]))
    model(torch.randint(0, 257, (2, 64)), positions=restart_positions(doc), doc_ids=doc).sum().backward()
    assert "varlen runs" in seen[0]._memo and seen[0]._memo["varlen runs"].count == 4

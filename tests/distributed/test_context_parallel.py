"""Context parallelism on 2 and 4 spawned gloo processes equals one process, and sends what the mask needs.

One spawn per world size runs every case (tests/distributed/cp_harness.py); each test then checks one case:
outputs, log-sum-exp and dq/dk/dv against the float64 reference by the rule of docs/conventions.md (2x / 3x the float32
reference's error), and the messages each rank sent against the shard needs read off the dense mask.
"""

from __future__ import annotations

import pytest
import torch
from cp_harness import NAMES, build, cotangents, spawn

from attnkit._validation import build_call
from attnkit.functional.reference import reference_attention, scores_of
from oracle import assert_within_rule

WORLDS = (2, 4)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return {world: spawn(world, str(tmp_path_factory.mktemp(f"cp{world}"))) for world in WORLDS}


def _reference(case, dtype):
    """One process: (out, lse, dq, dk, dv) in ``dtype`` on the global tensors."""
    leaves = [t.to(dtype).detach().requires_grad_(True) for t in (case.q, case.k, case.v)]
    kwargs = dict(bias=case.bias, softcap=case.softcap, q_positions=case.positions, kv_positions=case.positions)
    out = reference_attention(*leaves, case.mask, **kwargs)
    lse = torch.logsumexp(scores_of(build_call(*leaves, case.mask, **kwargs)), dim=-1)  # (B, H, L)
    cot_out, cot_lse = cotangents(case)
    loss = (out * cot_out.to(dtype)).sum()
    if case.with_lse_grad:
        loss = loss + (lse * cot_lse.to(dtype)).sum()
    loss.backward()
    return [out.detach(), lse.detach()] + [t.grad for t in leaves]


def _gathered(results, world, name):
    case = build(name, world)
    per_rank = [results[world][r][name]["tensors"] for r in range(world)]
    return case, [case.layout.unshard([p[i] for p in per_rank], dim=-1 if i == 1 else -2) for i in range(5)]


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("name", NAMES)
def test_equals_one_process(results, world, name):
    case, (out, lse, dq, dk, dv) = _gathered(results, world, name)
    golden, ref32 = _reference(case, torch.float64), _reference(case, torch.float32)
    assert_within_rule(out, ref32[0], golden[0], what=f"{name} W={world} output")
    empty = torch.isneginf(golden[1])
    assert torch.equal(torch.isneginf(lse), empty), f"{name}: rows with no key differ from one process"
    assert_within_rule(torch.where(empty, 0, lse), torch.where(empty, 0, ref32[1]), torch.where(empty, 0, golden[1]),
                       what=f"{name} W={world} lse")
    for what, got, r32, gold in zip(("dq", "dk", "dv"), (dq, dk, dv), ref32[2:], golden[2:]):
        assert_within_rule(got, r32, gold, factor=3.0, what=f"{name} W={world} {what}")


def test_empty_rows_are_zero_with_finite_grads(results):
    for world in WORLDS:
        for name in ("empty_shard", "padding_empty_row"):
            case, (out, lse, dq, dk, dv) = _gathered(results, world, name)
            empty = torch.isneginf(lse)
            assert empty.any(), f"{name}: the case must have rows with no key"
            assert torch.equal(out[empty.unsqueeze(-1).expand_as(out)], torch.zeros(int(empty.sum()) * out.shape[-1]))
            assert all(torch.isfinite(g).all() for g in (dq, dk, dv)), f"{name} W={world}: non-finite gradient"
            assert dq[empty.unsqueeze(-1).expand_as(dq)].abs().max() == 0


# ----------------------------------------------------------------------------- messages


def _needs(case, world):
    """needs[r][s] read off the dense mask (independent of the plan): a query of rank r sees a key of shard s."""
    L = case.layout.seq_len
    pos = torch.arange(L) if case.positions is None else case.positions
    allowed = torch.ones(1, 1, L, L, dtype=torch.bool) if case.mask is None else case.mask.to_dense(pos, pos)
    idx = [case.layout.index(r) for r in range(world)]
    return [[bool(allowed[:, :, idx[r]][:, :, :, idx[s]].any()) for s in range(world)] for r in range(world)]


def _shard_bytes(case, s):
    B, Hkv, _, D = case.k.shape
    return B * Hkv * case.layout.length(s) * (D + case.v.shape[-1]) * 4  # packed (k, v) float32


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("name", NAMES)
def test_messages_are_what_the_mask_needs(results, world, name):
    case = build(name, world)
    needs = _needs(case, world)
    sent = [m for r in range(world) for m in results[world][r][name]["messages"]]
    strategy = results[world][0][name]["strategy"]

    def total(what, phase):
        picked = [m for m in sent if m[0] == what and m[1] == phase]
        return len(picked), sum(m[3] for m in picked)

    pairs = [(r, s) for r in range(world) for s in range(world) if r != s and needs[r][s]]
    if strategy == "all_gather":
        want = (len(pairs), sum(_shard_bytes(case, s) for _, s in pairs))
        assert total("kv", "forward") == want, f"{name} W={world}: forward K/V messages"
        assert total("dkv", "backward") == want, f"{name} W={world}: dK/dV messages back to the owners"
        assert total("kv", "backward") == (0, 0), "all-gather keeps the gathered shards: no second transfer"
    else:
        assert strategy == "ring"
        hops = [max([(r - s) % world for r in range(world) if r != s and needs[r][s]], default=0)
                for s in range(world)]
        want = (sum(hops), sum(h * _shard_bytes(case, s) for s, h in enumerate(hops)))
        assert total("kv", "forward") == want, f"{name} W={world}: ring forward hops {hops}"
        assert total("kv", "backward") == want, f"{name} W={world}: ring backward hops {hops}"
        assert total("dkv", "backward")[0] == sum(max(h - 1, 0) for h in hops), "accumulators follow the shards"
        assert total("dkv-home", "backward")[0] == sum(h > 0 for h in hops), "each travelled accumulator goes home"


def test_message_counts_by_hand(results):
    """The needs above, spelled out for the shapes of the cases (W=4, L=45: shards of 12, 11, 11, 11 tokens)."""
    sent = {name: [m for r in range(4) for m in results[4][r][name]["messages"]] for name in NAMES}
    fwd = {name: [m for m in msgs if m[1] == "forward"] for name, msgs in sent.items()}
    shard0 = 2 * 4 * 12 * 16 * 4  # B=2, Hkv=4, 12 tokens, k|v 8+8, float32
    # sliding window 6 over contiguous shards of >= 11 tokens: rank r needs only shard r - 1 (3 messages)
    assert [(m[0], m[2]) for m in fwd["window_ring"]] == [("kv", 1), ("kv", 2), ("kv", 3)]
    assert fwd["window_ring"][0][3] == shard0
    # causal zigzag: everyone needs everyone (W * (W - 1) = 12 transfers, balanced work)
    assert len(fwd["causal_zigzag"]) == 12
    # causal contiguous all-gather: rank r needs shards < r only (6 messages, none to rank 0)
    assert len(fwd["causal_contiguous_all_gather"]) == 6 and all(m[2] != 0 for m in fwd["causal_contiguous_all_gather"])
    # chunks of 8 over shards starting at 0, 12, 23, 34: only chunks straddling a shard edge (16-23 and
    # 32-39) reach back, so ranks 2 and 3 need their left neighbour; rank 1's chunk 8-15 starts inside shard 0
    assert sorted((m[2]) for m in fwd["chunked"]) == [1, 2, 3]
    # the last rank's queries see nothing: nobody sends to it
    assert all(m[2] != 3 for m in sent["empty_shard"] if m[0] == "kv")


def test_strategy_choice_and_reason(results):
    chosen = {name: (results[4][0][name]["strategy"], results[4][0][name]["reason"]) for name in NAMES}
    assert chosen["causal_zigzag"][0] == "ring"
    assert chosen["window_ring"][0] == "ring"
    assert chosen["window_alibi_gqa"][0] == "all_gather" and "GQA" in chosen["window_alibi_gqa"][1]
    assert chosen["document"][0] == "all_gather"
    assert chosen["alibi_causal_mqa_ring"] == ("ring", "strategy='ring' was requested")


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2 or
                    not torch.distributed.is_nccl_available(), reason="nccl context parallelism needs 2 CUDA devices")
def test_nccl_on_two_gpus_equals_one_process(tmp_path):
    names = ["causal_zigzag", "window_alibi_gqa", "document", "empty_shard"]
    got = {2: spawn(2, str(tmp_path), names, backend="nccl")}
    for name in names:
        case, (out, lse, dq, dk, dv) = _gathered(got, 2, name)
        golden, ref32 = _reference(case, torch.float64), _reference(case, torch.float32)
        assert_within_rule(out, ref32[0], golden[0], what=f"nccl {name} output")
        for what, g_, r32, gold in zip(("dq", "dk", "dv"), (dq, dk, dv), ref32[2:], golden[2:]):
            assert_within_rule(g_, r32, gold, factor=3.0, what=f"nccl {name} {what}")

"""Cases and the spawned worker of the context-parallel tests.

Every case is built identically in the parent and in each worker from its name and the world size (seeded
global tensors, the mask over the global sequence, the layout). Workers run their shard with gradients and
save what they computed and the messages they sent; the parent puts the shards back together and checks
them against one process (float64 golden, float32 reference for the 2x rule).

Shape legend: B batch, H heads, Hkv KV heads, L global length, D head dim.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

import attnkit as ak
from attnkit import distributed as akd


@dataclass
class Case:
    q: torch.Tensor  # (B, H, L, D) float32, global
    k: torch.Tensor  # (B, Hkv, L, D)
    v: torch.Tensor
    mask: object
    bias: object
    layout: akd.ShardLayout
    strategy: str
    softcap: float | None = None
    positions: torch.Tensor | None = None
    with_lse_grad: bool = True  # rows with no key have lse = -inf: keep lse out of the loss there
    tile: int = 8


def _tensors(seed: int, B: int, H: int, Hkv: int, L: int, D: int):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, L, D, generator=g), torch.randn(B, Hkv, L, D, generator=g),
            torch.randn(B, Hkv, L, D, generator=g))


def _docs(L: int) -> torch.Tensor:
    sizes = [7, 3, 11, 1, 9, 5, 13, 4, 8, 6]
    ids, doc = [], 0
    while len(ids) < L:
        ids += [doc] * sizes[doc % len(sizes)]
        doc += 1
    return torch.tensor(ids[:L])


def length(world: int) -> int:
    return {1: 29, 2: 37, 4: 45}[world]  # not divisible by the world size


def build(name: str, world: int) -> Case:
    L = length(world)
    B, H, D = 2, 4, 8
    q, k, v = _tensors(sum(map(ord, name)), B, H, 4, L, D)
    causal = ak.masks.causal()
    if name == "causal_zigzag":
        return Case(q, k, v, causal, None, akd.zigzag(L, world), "auto")
    if name == "causal_contiguous_all_gather":
        return Case(q, k, v, causal, None, akd.contiguous(L, world), "all_gather")
    if name == "window_ring":
        m = ak.masks.sliding_window(6)
        return Case(q, k, v, m, None, akd.layout_for(m, L, world), "auto")
    if name == "window_alibi_gqa":
        q, k, v = _tensors(3, B, H, 2, L, D)
        m = ak.masks.sliding_window(9)
        return Case(q, k, v, m, ak.positions.ALiBi(H), akd.layout_for(m, L, world), "auto")
    if name == "alibi_causal_mqa_ring":
        q, k, v = _tensors(4, B, H, 1, L, D)
        return Case(q, k, v, causal, ak.positions.ALiBi(H), akd.zigzag(L, world), "ring")
    if name == "alibi_per_row_ring":  # slopes per (batch row, head): the kernel must pass the row index b
        slopes = torch.rand(B, H, generator=torch.Generator().manual_seed(6)) * 0.5 + 0.05  # (B, H)
        return Case(q, k, v, causal, ak.positions.ALiBi(H, slopes), akd.zigzag(L, world), "ring")
    if name in ("document", "document_ring"):
        ids = _docs(L)
        starts = torch.cat([torch.ones(1, dtype=torch.bool), ids[1:] != ids[:-1]])  # (L,) token opens a doc
        index = torch.arange(L)
        restart = index - torch.where(starts, index, 0).cummax(0).values  # (L,) position inside its document
        m = ak.masks.document(ids[None].expand(B, -1)) & causal
        if name == "document":
            return Case(q, k, v, m, None, akd.layout_for(m, L, world), "auto", positions=restart)
        return Case(q, k, v, m, None, akd.contiguous(L, world), "ring", positions=restart)
    if name == "padding_causal":
        m = ak.masks.padding([L - 5, 7]) & causal
        return Case(q, k, v, m, None, akd.zigzag(L, world), "auto")
    if name == "padding_empty_row":  # batch row 1 has no real key at all: every row of it is empty
        m = ak.masks.padding([L, 0])
        return Case(q, k, v, m, None, akd.contiguous(L, world), "ring", with_lse_grad=False)
    if name == "empty_shard":  # the last rank's queries see no key
        layout = akd.contiguous(L, world)
        allowed = torch.ones(L, L, dtype=torch.bool).tril()
        allowed[layout.index(world - 1)] = False
        return Case(q, k, v, ak.masks.dense(allowed), None, layout, "auto", with_lse_grad=False)
    if name == "chunked":  # Llama 4 local layers: causal inside chunks of 8 (a custom rule: probed exactly)
        m = causal & ak.masks.custom(lambda b, h, q_pos, kv_pos: q_pos // 8 == kv_pos // 8, "chunk8")
        return Case(q, k, v, m, None, akd.contiguous(L, world), "auto")
    if name == "bidirectional_softcap_gqa":
        q, k, v = _tensors(5, B, H, 2, L, D)
        return Case(q, k, v, None, None, akd.contiguous(L, world), "auto", softcap=3.0)
    raise KeyError(name)


NAMES = ["causal_zigzag", "causal_contiguous_all_gather", "window_ring", "window_alibi_gqa",
         "alibi_causal_mqa_ring", "alibi_per_row_ring", "document", "document_ring", "padding_causal", "padding_empty_row",
         "empty_shard", "bidirectional_softcap_gqa", "chunked"]


def cotangents(case: Case):
    g = torch.Generator().manual_seed(99)
    shape = case.q.shape[:3]
    return torch.randn(*shape, case.v.shape[-1], generator=g), torch.randn(*shape, generator=g)


def run_shard(case: Case, rank: int, group=None, device: str = "cpu"):
    """This rank's forward + backward: returns (out, lse, dq, dk, dv) shards and the message log."""
    layout = case.layout
    q, k, v = (layout.shard(t, rank).to(device).requires_grad_(True) for t in (case.q, case.k, case.v))
    cot_out, cot_lse = cotangents(case)
    cot_out, cot_lse = layout.shard(cot_out, rank).to(device), layout.shard(cot_lse, rank, dim=-1).to(device)
    with akd.count_messages() as log:
        out, lse = akd.context_parallel_attention(
            q, k, v, case.mask, bias=case.bias, softcap=case.softcap, positions=case.positions, layout=layout,
            group=group, strategy=case.strategy, tile=case.tile, return_lse=True)
        loss = (out * cot_out).sum()
        if case.with_lse_grad:
            loss = loss + (lse * cot_lse).sum()
        loss.backward()
    return tuple(t.cpu() for t in (out.detach(), lse.detach(), q.grad, k.grad, v.grad)), log


def worker(rank: int, world: int, init_file: str, out_dir: str, names: list[str], backend: str = "gloo") -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    device = "cpu"
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = f"cuda:{rank}"
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        results = {}
        for name in names:
            case = build(name, world)
            tensors, log = run_shard(case, rank, device=device)
            explanation = akd.explain(*(case.layout.shard(t, rank) for t in (case.q, case.k, case.v)), case.mask,
                                      bias=case.bias, positions=case.positions, layout=case.layout,
                                      strategy=case.strategy, tile=case.tile)
            results[name] = {"tensors": tensors, "messages": [(m.what, m.phase, m.peer, m.nbytes) for m in log.sent],
                             "strategy": explanation.strategy, "reason": explanation.reason}
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def spawn(world: int, tmp_dir: str, names: list[str] = NAMES, backend: str = "gloo") -> list[dict]:
    """Run ``names`` on ``world`` spawned processes (gloo on CPU, nccl on one GPU each); each rank's results."""
    import torch.multiprocessing as mp

    init_file = os.path.join(tmp_dir, "init")
    mp.start_processes(worker, args=(world, init_file, tmp_dir, names, backend), nprocs=world, start_method="spawn")
    return [torch.load(os.path.join(tmp_dir, f"rank{r}.pt"), weights_only=False) for r in range(world)]

"""Context-parallel attention: each rank holds a shard of the sequence; the result equals one process.

    out = context_parallel_attention(q, k, v, mask, layout=layout)      # q: (B, H, L_r, D) this rank's shard

Two strategies move the key/value shards (``attnkit.distributed.plan``), both as custom autograd
Functions whose backward sends the key/value gradients back to the shard's owner:

- ``all_gather``: one batch of messages delivers every needed shard directly; the backward returns each
  partial ``dK/dV`` to its owner, who sums them (a reduce-scatter restricted to the pairs that have work).
  The gathered shards are kept for the backward (no second transfer).
- ``ring``: shard ``r - t`` reaches rank r at step t, sent while step ``t - 1`` computes; the ring stops
  after the farthest hop any query needs. The backward rings the shards again, each with a travelling
  ``dK/dV`` accumulator that every visiting rank adds to (from the first visitor on); the last holder sends
  it home, where the owner adds its own part. Memory: two shards.

Masks and biases see global indices and positions, so RoPE (applied before, at the shard's global
positions), ALiBi, documents, padding and dense masks mean the same as in one process.

Shape legend: B batch, H query heads, Hkv KV heads, L global length, L_r this rank's length, D/Dv head dims.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from attnkit._bias import StructuredBias
from attnkit._checks import number, position_ids, positive_int
from attnkit._validation import bias_needs_grad, check_bias, check_tensors
from attnkit.distributed.comm import Comm, Recv, Send
from attnkit.distributed.kernel import TileKernel, acc_dtype
from attnkit.distributed.layout import ShardLayout, contiguous
from attnkit.distributed.plan import STRATEGIES, Plan, build_plan, choose
from attnkit.errors import AttnkitTypeError, AttnkitValueError, BackendUnsupportedError, describe
from attnkit.masks import MaskContext, MaskSpec, dense

KV, DKV, HOME = 0, 1, 2  # message tags


@dataclass
class _Run:
    """Everything one call needs besides the tensors."""

    comm: Comm
    plan: Plan
    kernel: TileKernel
    q_index: torch.Tensor  # (L_r,) global indices of this rank's queries (and keys)
    kv_index: list[torch.Tensor]  # per shard s: (L_s,) global indices
    d: int  # head dim of k (packed messages are cat([k, v], -1))

    def shard_shape(self, like: torch.Tensor, s: int, width: int) -> tuple[int, ...]:
        B, Hkv = like.shape[0], like.shape[1]
        return (B, Hkv, self.plan.layout.length(s), width)


def _unpack(kv: torch.Tensor, d: int):
    return kv[..., :d], kv[..., d:]


class _AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, run: _Run):
        plan, comm, r = run.plan, run.comm, run.plan.rank
        dt = acc_dtype(q.dtype)
        local = torch.cat([k, v], dim=-1)  # (B, Hkv, L_r, D + Dv)
        others = [s for s in plan.sources() if s != r]
        buffers = {s: local.new_empty(run.shard_shape(k, s, local.shape[-1])) for s in others}
        pending = comm.start([Send(p, local, KV, "kv") for p in plan.needers()],
                             [Recv(s, buffers[s], KV) for s in others], "forward")
        qf = q.to(dt)
        out = q.new_zeros(*q.shape[:3], v.shape[-1], dtype=dt)  # (B, H, L_r, Dv)
        lse = q.new_full(q.shape[:3], float("-inf"), dtype=dt)  # (B, H, L_r)
        if plan.needs[r][r]:  # own shard while the others arrive
            run.kernel.forward(qf, k.to(dt), v.to(dt), list(plan.tiles[r]), run.q_index, run.kv_index[r], out, lse)
        pending.wait()
        for s in others:
            ks, vs = _unpack(buffers[s].to(dt), run.d)
            run.kernel.forward(qf, ks, vs, list(plan.tiles[s]), run.q_index, run.kv_index[s], out, lse)
        ctx.run, ctx.others = run, others
        ctx.save_for_backward(q, k, v, out, lse, *[buffers[s] for s in others])
        return out.to(q.dtype), lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, *gathered = ctx.saved_tensors
        run, others = ctx.run, ctx.others
        plan, r, dt = run.plan, run.plan.rank, out.dtype
        qf, do = q.to(dt), dout.to(dt)
        delta = _delta(do, out, dlse)
        dq = torch.zeros_like(qf)
        partial = {}
        for s, buf in zip(others, gathered):  # remote shards first, so their gradients leave early
            ks, vs = _unpack(buf.to(dt), run.d)
            dks, dvs = torch.zeros_like(ks), torch.zeros_like(vs)
            run.kernel.backward(qf, ks, vs, list(plan.tiles[s]), run.q_index, run.kv_index[s], do, lse, delta,
                                dq, dks, dvs)
            partial[s] = torch.cat([dks, dvs], dim=-1)  # (B, Hkv, L_s, D + Dv)
        width = k.shape[-1] + v.shape[-1]
        incoming = {p: out.new_empty(run.shard_shape(k, r, width)) for p in plan.needers()}
        pending = run.comm.start([Send(s, partial[s], DKV, "dkv") for s in others],
                                 [Recv(p, incoming[p], DKV) for p in incoming], "backward")
        dk, dv = torch.zeros_like(k, dtype=dt), torch.zeros_like(v, dtype=dt)
        if plan.needs[r][r]:
            run.kernel.backward(qf, k.to(dt), v.to(dt), list(plan.tiles[r]), run.q_index, run.kv_index[r], do,
                                lse, delta, dq, dk, dv)
        pending.wait()
        for buf in incoming.values():
            dkp, dvp = _unpack(buf, run.d)
            dk += dkp
            dv += dvp
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None


class _Ring(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, run: _Run):
        plan, comm, kernel = run.plan, run.comm, run.kernel
        W, r, dt = plan.world, plan.rank, acc_dtype(q.dtype)
        qf = q.to(dt)
        out = q.new_zeros(*q.shape[:3], v.shape[-1], dtype=dt)  # (B, H, L_r, Dv)
        lse = q.new_full(q.shape[:3], float("-inf"), dtype=dt)  # (B, H, L_r)
        current = torch.cat([k, v], dim=-1)  # (B, Hkv, L_r, D + Dv): shard r at step 0
        for t in range(max(plan.hops) + 1):
            s, nxt = (r - t) % W, (r - t - 1) % W  # shard held now, shard arriving for step t + 1
            sends, recvs, arriving = [], [], None
            if current is not None and t + 1 <= plan.hops[s]:
                sends.append(Send((r + 1) % W, current, KV, "kv"))
            if t + 1 <= plan.hops[nxt]:
                arriving = k.new_empty(run.shard_shape(k, nxt, k.shape[-1] + v.shape[-1]))
                recvs.append(Recv((r - 1) % W, arriving, KV))
            pending = comm.start(sends, recvs, "forward")
            if current is not None and plan.needs[r][s]:
                ks, vs = _unpack(current.to(dt), run.d)
                kernel.forward(qf, ks, vs, list(plan.tiles[s]), run.q_index, run.kv_index[s], out, lse)
            pending.wait()
            current = arriving
        ctx.run = run
        ctx.save_for_backward(q, k, v, out, lse)
        return out.to(q.dtype), lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        run = ctx.run
        plan, comm, kernel = run.plan, run.comm, run.kernel
        W, r, dt = plan.world, plan.rank, out.dtype
        qf, do = q.to(dt), dout.to(dt)
        delta = _delta(do, out, dlse)
        dq = torch.zeros_like(qf)
        width = k.shape[-1] + v.shape[-1]
        current = torch.cat([k, v], dim=-1)  # (B, Hkv, L_r, D + Dv): shard r at step 0
        incoming = None  # (accumulator tensor, its batch): the held shard's dK/dV so far
        mine, in_flight = None, []
        for t in range(max(plan.hops) + 1):
            s, nxt = (r - t) % W, (r - t - 1) % W  # shard held now, shard arriving for step t + 1
            # 1. prefetch the next shard; its accumulator follows once the sender has added to it
            arriving, arriving_acc, kv_pending = _prefetch(run, current, t, s, nxt, k, out, width)
            # 2. this rank's contribution to shard s, added to what the shard's earlier holders sent
            sends, recvs = [], []
            if current is not None:
                part = out.new_zeros(current.shape)  # (B, Hkv, L_s, D + Dv)
                if plan.needs[r][s]:
                    ks, vs = _unpack(current.to(dt), run.d)
                    kernel.backward(qf, ks, vs, list(plan.tiles[s]), run.q_index, run.kv_index[s], do, lse, delta,
                                    dq, part[..., :run.d], part[..., run.d:])
                if incoming is not None:
                    incoming[1].wait()
                    part += incoming[0]
                # 3. keep it (own shard), pass it on, or send it home from the shard's last holder
                if t == 0:
                    mine = part
                elif t + 1 <= plan.hops[s]:
                    sends.append(Send((r + 1) % W, part, DKV, "dkv"))
                else:
                    sends.append(Send(s, part, HOME, "dkv-home"))
            if arriving_acc is not None:
                recvs.append(Recv((r - 1) % W, arriving_acc, DKV))
            home = None
            if t > 0 and t == plan.hops[r]:
                home = out.new_empty(run.shard_shape(k, r, width))
                recvs.append(Recv((r + t) % W, home, HOME))
            acc_pending = comm.start(sends, recvs, "backward")
            in_flight.append(acc_pending)
            kv_pending.wait()
            if home is not None:
                acc_pending.wait()
                mine = mine + home
            incoming = (arriving_acc, acc_pending) if arriving_acc is not None else None
            current = arriving
        for pending in in_flight:
            pending.wait()
        dk, dv = _unpack(mine, run.d)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None


def _prefetch(run, current, t: int, s: int, nxt: int, k: torch.Tensor, out: torch.Tensor, width: int):
    """Step ``t`` of the backward ring's first half: pass the held shard ``s`` (``current``, ``(B, Hkv, L_s, D + Dv)``)
    on and receive shard ``nxt`` with, after the first step, a buffer for its dK/dV accumulator. Returns
    ``(arriving, arriving_acc, pending)``: the buffers (None when nothing arrives) and the started exchange."""
    plan = run.plan
    W, r = plan.world, plan.rank
    arriving = arriving_acc = None
    kv_sends, kv_recvs = [], []
    if current is not None and t + 1 <= plan.hops[s]:
        kv_sends.append(Send((r + 1) % W, current, KV, "kv"))
    if t + 1 <= plan.hops[nxt]:
        arriving = k.new_empty(run.shard_shape(k, nxt, width))  # (B, Hkv, L_nxt, D + Dv)
        kv_recvs.append(Recv((r - 1) % W, arriving, KV))
        if t >= 1:  # the owner keeps its own part: accumulators start at the shard's first visitor
            arriving_acc = out.new_empty(run.shard_shape(k, nxt, width))  # (B, Hkv, L_nxt, D + Dv)
    return arriving, arriving_acc, run.comm.start(kv_sends, kv_recvs, "backward")


def _delta(dout: torch.Tensor, out: torch.Tensor, dlse: torch.Tensor | None) -> torch.Tensor:
    """``rowsum(dout * out) - dlse`` ``(B, H, L_r)``: the softmax backward's row term (lse's gradient folded in)."""
    delta = (dout * out).sum(dim=-1)
    return delta if dlse is None else delta - dlse.to(delta.dtype)


_FUNCTIONS = {"all_gather": _AllGather, "local": _AllGather, "ring": _Ring}


# ---------------------------------------------------------------------------------------- front door


@dataclass(frozen=True)
class CPExplanation:
    """What :func:`context_parallel_attention` does for a call: strategy, reason, layout and traffic."""

    strategy: str
    reason: str
    layout: str
    needs: tuple[tuple[bool, ...], ...]
    hops: tuple[int, ...]
    tiles: int  # this rank's non-empty tiles
    work: int  # score entries this rank computes (sum of its tiles' areas): compute per step is ~ work x H x D
    kv_shard_bytes: tuple[int, ...]  # per shard: bytes of its packed K/V message

    def forward_bytes(self) -> dict[str, int]:
        """Bytes all ranks send in one forward: this strategy, and the minimum (each needed shard once)."""
        W = len(self.needs)
        minimum = sum(self.kv_shard_bytes[s] for r in range(W) for s in range(W) if r != s and self.needs[r][s])
        ring = sum(self.kv_shard_bytes[s] * self.hops[s] for s in range(W))
        return {"minimum": minimum, "strategy": ring if self.strategy == "ring" else minimum}

    def __str__(self) -> str:
        W = len(self.needs)
        rows = "\n".join(f"  rank {r} needs shards {[s for s in range(W) if self.needs[r][s]]}" for r in range(W))
        b = self.forward_bytes()
        return (f"strategy: {self.strategy} ({self.reason})\nlayout: {self.layout}\n{rows}\n"
                f"forward K/V bytes (all ranks): {b['strategy']} (minimum {b['minimum']})")


def _prepare(q, k, v, mask, bias, scale, softcap, positions, layout, group, strategy, tile, memo=None):
    check_tensors(q, k, v)
    if strategy not in STRATEGIES:
        raise AttnkitValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}; use 'auto' to let "
                                "attnkit choose (ak.distributed.explain says why).")
    tile = positive_int(tile, "tile", "use tile >= 1 (queries and keys per tile, e.g. 256).")
    comm = Comm(group)
    if layout is None:
        layout = _gathered_contiguous(q.shape[2], comm)
    if not isinstance(layout, ShardLayout):
        raise AttnkitTypeError(f"layout must be an ak.distributed.ShardLayout, got {describe(layout)}; build one "
                               "with ak.distributed.layout_for(mask, seq_len, world).")
    if layout.world != comm.world:
        raise AttnkitValueError(f"layout has {layout.world} shards but the process group has {comm.world} ranks; "
                                "build the layout with world=dist.get_world_size(group).")
    if q.shape[2] != layout.length(comm.rank) or k.shape[2] != layout.length(comm.rank):
        raise AttnkitValueError(
            f"rank {comm.rank} holds q of length {q.shape[2]} and k of length {k.shape[2]} but the layout gives it "
            f"{layout.length(comm.rank)} tokens; shard the inputs with layout.shard(x, rank).")
    B, H, Hkv, L = q.shape[0], q.shape[1], k.shape[1], layout.seq_len
    if isinstance(mask, torch.Tensor):
        mask = dense(mask)
    elif mask is not None and not isinstance(mask, MaskSpec):
        raise AttnkitTypeError(f"mask must be an attnkit mask, a bool tensor (B|1, H|1, L, L) over the global "
                               f"sequence or None, got {describe(mask)}.")
    if bias is not None:
        if not isinstance(bias, StructuredBias):
            raise BackendUnsupportedError(
                f"context parallel attention takes a structured bias (ak.positions.ALiBi) evaluated from global "
                f"positions, got bias={describe(bias)}; a dense (B, H, L, L) bias has no shard to split - express "
                "it as a StructuredBias.")
        check_bias(bias, (B, H, L, L), H)  # heads, and per-row terms (ALiBi slopes (B, H)) for this batch
        if bias_needs_grad(bias, q.device):
            raise BackendUnsupportedError(f"bias {type(bias).__name__} needs a gradient, which context parallel "
                                          "attention does not compute; freeze it (requires_grad_(False)).")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else number(
        scale, "scale", low=0.0, low_open=True, fix="omit it for the default 1/sqrt(head_dim).")
    if softcap is not None:
        softcap = number(softcap, "softcap", low=0.0, low_open=True, fix="use a positive cap, or None.")
    pos = _global_positions(positions, B, L, q.device)
    ctx = MaskContext(pos.expand(B, -1), pos.expand(B, -1))
    if mask is not None and mask.heads not in (1, H):
        raise AttnkitValueError(f"mask distinguishes {mask.heads} heads but q has {H}; give it 1 or {H} heads.")

    def bind():  # what the mask, the global positions, the layout, the rank and the tile determine
        return build_plan(mask, ctx, layout, comm.rank, tile), None if mask is None else mask.bind(ctx)

    plan, mask_fn = bind() if memo is None else memo(bind)
    chosen, reason = choose(plan, H, Hkv, strategy)
    kernel = TileKernel(mask_fn=mask_fn, mask_heads=mask.heads if mask else 1,
                        bias=bias, positions=pos, scale=scale, softcap=softcap, batch=B, num_heads=H)
    run = _Run(comm, plan, kernel, layout.index(comm.rank, q.device),
               [layout.index(s, q.device) for s in range(layout.world)], k.shape[-1])
    return run, chosen, reason, layout


def _global_positions(positions, batch: int, seq_len: int, device) -> torch.Tensor:
    if positions is None:
        return torch.arange(seq_len, device=device).unsqueeze(0)  # (1, L)
    positions = position_ids(positions, length=seq_len, batch=batch,
                             note=" (the whole sequence, every rank the same)")  # (B|1, L)
    return positions.to(device)


def _gathered_contiguous(local_len: int, comm: Comm) -> ShardLayout:
    """Without a layout, shards are contiguous runs in rank order; their lengths are gathered once."""
    if comm.world == 1:
        return contiguous(local_len, 1)
    lengths = [torch.zeros(1, dtype=torch.long) for _ in range(comm.world)]
    dist.all_gather(lengths, torch.tensor([local_len]), group=comm.group)
    bounds = torch.tensor([0] + [int(n) for n in lengths]).cumsum(0).tolist()
    return ShardLayout(bounds[-1], tuple(((bounds[r], bounds[r + 1]),) for r in range(comm.world)), "contiguous")


def context_parallel_attention(q, k, v, mask=None, *, bias=None, scale=None, softcap=None, positions=None,
                               layout: ShardLayout | None = None, group=None, strategy: str = "auto",
                               tile: int = 256, return_lse: bool = False, memo=None):
    """Attention over a sequence split across the ranks of ``group``; equal to one process's attention.

    Args:
        q: ``(B, H, L_r, D)`` this rank's queries; k, v: ``(B, Hkv, L_r, D|Dv)`` its keys/values (GQA:
            ``H % Hkv == 0``). RoPE, if any, is applied before, at the tokens' global positions.
        mask: an ``ak.masks`` mask over the *global* sequence (document ids, padding, dense tensors cover all L
            tokens; every rank passes the same), a bool tensor ``(B|1, H|1, L, L)``, or None.
        bias: a structured bias (``ak.positions.ALiBi``), evaluated at global positions.
        positions: global positions ``(L,)`` or ``(B|1, L)`` of all tokens; default ``arange(L)``.
        layout: which global tokens each rank holds (``ak.distributed.layout_for``); default contiguous runs
            in rank order with the ranks' lengths.
        group: the context-parallel process group (default: the whole world; one process without init).
        strategy: "auto", "ring" or "all_gather" (see :func:`explain`).
        tile: queries/keys per tile of the local compute (memory ``B * H * tile^2`` floats per tile).
        return_lse: also return the row log-sum-exp ``(B, H, L_r)`` float32 (``-inf`` for rows with no key).
        memo: where the plan (who needs which shard, the tiles) and the bound mask are kept for the rest of a
            forward: ``memo(build)`` returns ``build()``, built once. Pass it only for calls whose mask,
            positions, layout, group and tile are the same objects, unchanged (the :func:`sharded` scope passes
            its prepared mask's memo, so a model's layers share one plan per forward); None builds it per call.

    Returns:
        ``(B, H, L_r, Dv)`` in q's dtype (rows with no visible key give 0), or ``(out, lse)``.
    """
    run, chosen, _, _ = _prepare(q, k, v, mask, bias, scale, softcap, positions, layout, group, strategy, tile, memo)
    out, lse = _FUNCTIONS[chosen].apply(q, k, v, run)
    return (out, lse) if return_lse else out


def explain(q, k, v, mask=None, *, bias=None, scale=None, softcap=None, positions=None, layout=None, group=None,
            strategy: str = "auto", tile: int = 256) -> CPExplanation:
    """Which strategy :func:`context_parallel_attention` uses for these arguments and why, the shards each
    rank needs, the ring hops and the bytes each strategy sends. Communicates nothing (given a layout)."""
    run, chosen, reason, layout = _prepare(q, k, v, mask, bias, scale, softcap, positions, layout, group,
                                           strategy, tile)
    B, Hkv, width = k.shape[0], k.shape[1], k.shape[-1] + v.shape[-1]
    shard_bytes = tuple(B * Hkv * layout.length(s) * width * k.element_size() for s in range(layout.world))
    tiles = [t for ts in run.plan.tiles for t in ts]
    return CPExplanation(chosen, reason, layout.kind, run.plan.needs, run.plan.hops, len(tiles),
                         sum((t.q1 - t.q0) * (t.k1 - t.k0) for t in tiles), shard_bytes)

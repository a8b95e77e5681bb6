"""A tiled softmax-attention kernel for scores with an additive term (ALiBi, a float bias), any device.

Why not SDPA with a float mask: PyTorch's fused CPU kernel is fast for ``is_causal`` and for no mask, but
with a float mask it reads an Lq x Lk tensor, and with ALiBi it feeds underflowing exponentials (subnormal
floats, which cost x86 cores ~100x per operation) into its matrix products. Here each piece of queries
runs against the keys it can reach as two batched matrix products and a softmax on preallocated
workspaces; nothing of size Lq x Lk is built or kept: pieces are cut so that one chunk of scores stays
under :data:`CHUNK_ENTRIES`, and the backward pass recomputes each piece's probabilities (from the row
maxima kept by the forward pass), as flash attention does.

Scores more than :data:`CUTOFF` below their row's maximum are set to ``-inf`` before the softmax. Their
weights (< e^-60, about 9e-27 of the largest) are far below float32 resolution; cutting them keeps
subnormals out of the products (prototype at N = 4096, ALiBi: 289 -> 87 ms forward). Rows with no
visible key give 0 with zero gradients.

The additive term of a chunk comes from a callback ``terms(piece, rows, heads) -> (r|1, h|1, lq, lk)``
(``-inf`` where the mask forbids), so the same kernel serves a Toeplitz table slice
(:mod:`attnkit.backends.relative`) and a per-piece evaluation of any mask and bias
(:mod:`attnkit.backends.blocksparse`). Gradients flow to q, k and v, not to the term (the backends refuse
calls whose bias needs a gradient). Dropout masks come from a generator seeded once per call, so the
backward pass draws the very same masks on any device.

Shape legend: R batch rows, H heads, Lq/Lk lengths, lq/lk a piece's query/key counts, D/Dv head dims,
n = rows x heads of one chunk.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from attnkit.backends.block_plan import Piece

#: scores this far below their row's maximum get weight exactly 0 (instead of < e^-60 of the largest)
CUTOFF = 60.0
#: score entries one chunk may hold: pieces are cut into runs of rows, rows x heads into chunks, to stay
#: under it (a single query row against more keys is the only excess)
CHUNK_ENTRIES = 1 << 22

#: ``terms(piece, rows, heads) -> (r|1, h|1, lq, lk)``: the additive term of a piece for batch rows ``rows``
#: and heads ``heads`` (slices), ``-inf`` where the mask forbids. The kernel adds ``scale * q k^T`` onto it in
#: float32, so a term must carry no large constant part (producers subtract each row's or head's maximum:
#: softmax ignores it, and an offset of 10^4 would otherwise cost ~100x the scores' rounding error)
Terms = Callable[[Piece, slice, slice], torch.Tensor]


def tiled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pieces: Sequence[Piece], terms: Terms,
                    scale: float, dropout_p: float = 0.0, softcap: float | None = None) -> torch.Tensor:
    """``softmax(cap(q k^T * scale) + terms) v`` piece by piece: ``(R, H, Lq, Dv)``, where ``cap(x)`` is
    ``softcap * tanh(x / softcap)`` (the identity when ``softcap`` is None; the score order of docs/conventions.md).

    ``q (R, H, Lq, D)``, ``k (R, H, Lk, D)`` and ``v (R, H, Lk, Dv)`` share heads (expand GQA before).
    ``pieces`` cover the queries; a piece sees only its key ranges ``piece.kv``, with the additive term
    ``terms(piece, rows, heads)``. Half-precision inputs are computed in float32 and the output cast back.
    """
    dtype = q.dtype
    compute = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    q, k, v = (t.to(compute).contiguous() for t in (q, k, v))
    pieces = split_rows(pieces, CHUNK_ENTRIES)
    seed = int(torch.randint(0, 2**62, (1,))) if dropout_p else None  # from the global RNG: manual_seed repeats it
    out = _Tiled.apply(q, k, v, pieces, terms, float(scale), float(dropout_p), seed,
                       None if softcap is None else float(softcap))
    return out.to(dtype)


def split_rows(pieces: Sequence[Piece], max_entries: int) -> tuple[Piece, ...]:
    """Cut pieces into runs of rows with at most ``max_entries`` scores per head (at least one row each)."""
    out = []
    for p in pieces:
        rows = max(1, max_entries // max(1, p.lk))
        if p.mode == "empty" or p.lq <= rows:
            out.append(p)
            continue
        out.extend(replace(p, q_lo=lo, q_hi=min(lo + rows, p.q_hi)) for lo in range(p.q_lo, p.q_hi, rows))
    return tuple(out)


class _Tiled(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, pieces, terms, scale, dropout_p, seed, softcap):
        R, H, Lq, _ = q.shape
        out = q.new_zeros(R, H, Lq, v.shape[-1])
        tops = q.new_empty(R, H, Lq, 1)  # each row's largest score, kept for backward (no second max pass)
        kT = k.transpose(-1, -2).contiguous()  # (R, H, D, Lk): row-major keys make q @ k^T ~1.5x faster
        gen = _generator(q.device, seed)
        work = _Workspace(q, pieces, n_buffers=2)
        for piece, rs, hs, add, keys in _chunks(pieces, terms, R, H):
            rows = slice(piece.q_lo, piece.q_hi)
            p = _probs(q[rs, hs, rows], keys.transposed(k[rs, hs], kT[rs, hs], piece.lq), add, scale, work, softcap,
                       top_out=_flat(tops[rs, hs, rows]))  # (n, lq, lk)
            if dropout_p:
                p = p * _keep(p, dropout_p, gen)
            torch.bmm(p, _flat(keys(v[rs, hs], -2)), out=_flat(out[rs, hs, rows]))  # (n, lq, Dv) into out
        ctx.save_for_backward(q, k, v, out, tops)
        ctx.pieces, ctx.terms, ctx.scale, ctx.dropout_p, ctx.seed = pieces, terms, scale, dropout_p, seed
        ctx.softcap = softcap
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, d_out):
        q, k, v, out, tops = ctx.saved_tensors
        pieces, terms, scale, dropout_p, softcap = ctx.pieces, ctx.terms, ctx.scale, ctx.dropout_p, ctx.softcap
        R, H = q.shape[:2]
        d_out = d_out.contiguous()
        delta = (d_out * out).sum(-1, keepdim=True) if dropout_p else None  # (R, H, Lq, 1) = rowsum(dP * P)
        kT, vT = k.transpose(-1, -2).contiguous(), v.transpose(-1, -2).contiguous()  # (R, H, D|Dv, Lk)
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        work = _Workspace(q, pieces, n_buffers=3 if softcap is None else 4)  # 4th: the softcap's tanh
        gen = _generator(q.device, ctx.seed)  # the forward's dropout masks, drawn again in the same order
        for piece, rs, hs, add, keys in _chunks(pieces, terms, R, H):
            rows = slice(piece.q_lo, piece.q_hi)
            qs, dos = _flat(q[rs, hs, rows]), _flat(d_out[rs, hs, rows])  # (n, lq, D), (n, lq, Dv)
            p = _probs(q[rs, hs, rows], keys.transposed(k[rs, hs], kT[rs, hs], piece.lq), add, scale, work, softcap,
                       top=_flat(tops[rs, hs, rows]))  # (n, lq, lk), the forward's probabilities
            keep = _keep(p, dropout_p, gen) if dropout_p else None
            pd = p if keep is None else p * keep
            dp = work.take(2, p.shape)
            torch.bmm(dos, _flat(keys(vT[rs, hs], -1)), out=dp)  # (n, lq, lk) = dO V^T
            if keep is None:  # fused softmax backward p * (dp - rowsum(dp * p)) into the free score buffer
                ds = torch.ops.aten._softmax_backward_data.out(dp, p, -1, p.dtype, grad_input=work.take(0, p.shape))
            else:
                ds = dp.mul_(keep).sub_(_flat(delta[rs, hs, rows])).mul_(p)  # (n, lq, lk); delta = rowsum(dO * O)
            if softcap is not None:  # d cap(x) / dx = 1 - tanh(x / cap)^2, with the tanh kept by _probs
                ds.mul_(work.take(3, ds.shape).square_().neg_().add_(1.0))
            _flat(dq[rs, hs, rows]).baddbmm_(ds, _flat(keys(k[rs, hs], -2)))
            keys.add_product(dk[rs, hs], ds.transpose(1, 2), qs)  # += (n, lk, D)
            keys.add_product(dv[rs, hs], pd.transpose(1, 2), dos)  # += (n, lk, Dv)
        dq.mul_(scale)
        dk.mul_(scale)
        return dq, dk, dv, None, None, None, None, None, None


def _flat(x: torch.Tensor) -> torch.Tensor:
    """``(r, h, l, d) -> (r*h, l, d)``: always a view for the slices used here (``view`` raises otherwise)."""
    return x.view(-1, *x.shape[2:])  # (n, l, d)


class _Workspace:
    """Flat buffers reused by every piece: fresh multi-MB tensors per piece cost page faults."""

    def __init__(self, q: torch.Tensor, pieces: Sequence[Piece], n_buffers: int):
        R, H = q.shape[:2]
        size = max((_chunk_rows(p, R, H)[0] * p.lq * p.lk for p in pieces if p.mode != "empty"), default=0)
        self.buffers = [q.new_empty(size) for _ in range(n_buffers)]

    def take(self, i: int, shape: torch.Size) -> torch.Tensor:
        n = 1
        for s in shape:
            n *= s
        return self.buffers[i][:n].view(shape)


def _probs(q: torch.Tensor, kT: torch.Tensor, add: torch.Tensor, scale: float, work: _Workspace,
           softcap: float | None = None, *, top: torch.Tensor | None = None,
           top_out: torch.Tensor | None = None) -> torch.Tensor:
    """Probabilities ``(n, lq, lk)`` for queries ``(r, h, lq, D)`` against keys ``kT (r, h, D, lk)``.

    Each row's largest score ``(n, lq, 1)`` is computed and written to ``top_out``, or read from ``top``
    (the backward pass recomputing the forward's scores). With ``softcap`` the tanh of the capped scores is
    left in workspace buffer 3 when the workspace has one (the backward pass needs it)."""
    r, h, lq, _ = q.shape
    lk = kT.shape[-1]
    s4 = work.take(0, (r, h, lq, lk))
    s = s4.view(r * h, lq, lk)
    if softcap is None:
        s4.copy_(add)  # the additive term, broadcast over rows and heads
        s.baddbmm_(_flat(q), _flat(kT), alpha=scale)  # (n, lq, lk) = term + scale * q k^T
    else:
        torch.bmm(_flat(q), _flat(kT), out=s)  # (n, lq, lk) = q k^T
        s.mul_(scale / softcap).tanh_()
        if len(work.buffers) > 3:
            work.take(3, s.shape).copy_(s)  # tanh(scale * q k^T / cap), for the backward pass
        s.mul_(softcap)
        s4.add_(add)  # cap(scale * q k^T) + term
    if top is None:
        top = s.amax(dim=-1, keepdim=True)  # (n, lq, 1)
        if top_out is not None:
            top_out.copy_(top)
    empty = torch.isneginf(top)
    any_empty = bool(empty.any())
    if any_empty:
        top = top.masked_fill(empty, 0.0)
    s.sub_(top)
    F.threshold_(s, -CUTOFF, float("-inf"))  # keep subnormal weights out of the products
    p = work.take(1, s.shape)
    torch.ops.aten._softmax.out(s, -1, False, out=p)
    if any_empty:
        p.masked_fill_(empty, 0.0)  # rows with no visible key: 0 (the softmax gave NaN)
    return p


def _keep(p: torch.Tensor, dropout_p: float, gen: torch.Generator) -> torch.Tensor:
    """Dropout multipliers ``(n, lq, lk)``: 0 or 1 / (1 - p), drawn from the call's generator."""
    return torch.empty_like(p).bernoulli_(1.0 - dropout_p, generator=gen).div_(1.0 - dropout_p)


def _generator(device: torch.device, seed: int | None) -> torch.Generator | None:
    """A generator on ``device`` seeded with the call's seed (forward and backward build the same one)."""
    return None if seed is None else torch.Generator(device=device).manual_seed(seed)


class _Keys:
    """A piece's keys: views of the ranges when there is one, a gathered copy otherwise."""

    def __init__(self, piece: Piece, device: torch.device):
        self.ranges = piece.kv
        self.index = None if len(piece.kv) == 1 else torch.cat(
            [torch.arange(lo, hi, device=device) for lo, hi in piece.kv])  # (lk,)

    def __call__(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """The piece's keys of ``x`` along ``dim`` (a view when contiguous)."""
        if self.index is None:
            lo, hi = self.ranges[0]
            return x.narrow(dim, lo, hi - lo)
        return x.index_select(dim, self.index)

    def transposed(self, k: torch.Tensor, kT: torch.Tensor, lq: int) -> torch.Tensor:
        """The piece's keys as ``(r, h, D, lk)`` for ``q k^T``: from the row-major copy ``kT (r, h, D, Lk)``
        (~1.5x faster products), except for a single query row, where the transposed view of ``k (r, h, Lk, D)``
        makes the product a dot product per key, summed in blocks: as accurate as the reference's ``q @ k^T``
        (the row-major form sums the D products one after another, ~15% more rounding error: issue 21 item 12)."""
        return self(k, -2).transpose(-1, -2) if lq == 1 else self(kT, -1)

    def add_product(self, grad: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
        """Add ``a @ b`` ``(n, lk, d)`` into the key rows of ``grad (r, h, Lk, d)``."""
        if self.index is None:
            _flat(self(grad, -2)).baddbmm_(a, b)  # in place on the key rows: no temporary
        else:
            part = torch.bmm(a, b).view(*grad.shape[:2], a.shape[1], b.shape[-1])  # (r, h, lk, d)
            grad.index_add_(-2, self.index, part)


def _chunk_rows(piece: Piece, R: int, H: int) -> tuple[int, int]:
    """(rows x heads per chunk, heads per chunk) keeping a chunk's scores under :data:`CHUNK_ENTRIES`."""
    per_head = max(1, piece.lq * piece.lk)
    if R * H * per_head <= CHUNK_ENTRIES:
        return R * H, H
    heads = max(1, min(H, CHUNK_ENTRIES // per_head))
    return heads, heads


def _chunks(pieces: Sequence[Piece], terms: Terms, R: int, H: int):
    """For every non-empty piece and chunk of (rows, heads): the piece, row slice, head slice, the chunk's
    additive term ``(r|1, h|1, lq, lk)`` and the piece's keys."""
    for piece in pieces:
        if piece.mode == "empty":
            continue
        n, heads = _chunk_rows(piece, R, H)
        chunks = [(slice(None), slice(None))] if n == R * H else [
            (slice(r, r + 1), slice(h0, min(h0 + heads, H))) for r in range(R) for h0 in range(0, H, heads)]
        keys = None
        for rs, hs in chunks:
            add = terms(piece, rs, hs)  # (r|1, h|1, lq, lk)
            keys = keys or _Keys(piece, add.device)
            yield piece, rs, hs, add, keys

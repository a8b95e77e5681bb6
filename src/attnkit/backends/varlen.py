"""Packed documents as separate sequences ("varlen", as flash-attn calls it), on SDPA's fused causal kernel.

``causal() & document(ids)`` on rows where every document is one contiguous run of tokens with increasing
positions is exactly causal attention inside each run: no query sees a key of another run, and inside a run
"position <= mine" is "index <= mine". :func:`document_runs` finds the runs (once per prepared mask: every
layer of a forward shares them) and groups runs of similar length into buckets (lengths up to 16, 24, 32,
48, 64, 96, ...: at most 1.5x apart); :func:`run_documents` gathers each bucket's runs into a batch
``(n, H, l, D)`` padded at the end to its longest run (causal queries never see the padding) and runs it as
one ``scaled_dot_product_attention(is_causal=True)``. The work is ``sum(l**2) / 2`` over the runs instead of
``Lq x Lk`` per row, and forward and backward are the fused kernel's (blocksparse's tiled pieces paid for
their masks and their many small calls in the backward).

Masks it does not describe exactly (a document id that comes back later in a row, positions that do not
increase inside a document, any other conjunct, Lq != Lk, a bias or a softcap) get ``None`` from :func:`document_runs`, and the
caller plans them otherwise.

Shape legend: B batch, H query heads, Hkv key/value heads, L = Lq = Lk, D/Dv head dims, S runs in the batch,
n runs in a bucket, l a bucket's (padded) length, N = B * (L + 1) token slots (one zero slot closes each row).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from attnkit._validation import AttentionCall
from attnkit.masks import PreparedMask

MIN_BUCKET = 16  # the shortest bucket length: runs shorter than this share one bucket


@dataclass(frozen=True)
class Bucket:
    """Runs of similar length as one kernel call: ``index (n, l)`` their token slots (into ``(N,)``, the
    zero slot where a run is shorter than ``l``)."""

    index: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.index.shape)


@dataclass(frozen=True)
class Runs:
    """The document runs of a batch: ``buckets``, and ``gather (B * L,)``, the slot of every token in the
    buckets' outputs laid end to end (bucket by bucket, run by run, position in the run). ``buckets == ()``
    when every row is one whole document: the rows run as they are (``gather`` None)."""

    buckets: tuple[Bucket, ...]
    gather: torch.Tensor | None
    count: int
    batch: int
    length: int

    @property
    def whole_rows(self) -> bool:
        return not self.buckets

    def density(self) -> float:
        """Fraction of the ``B x Lq x Lk`` entries computed (a causal square counts half, padding included)."""
        if self.whole_rows:
            return 0.5
        work = sum(n * l * l / 2 for n, l in (b.shape for b in self.buckets))
        return work / max(1, self.batch * self.length * self.length)

    def describe(self) -> str:
        if self.whole_rows:
            return "every row is one document: one SDPA is_causal call on the rows as they are; computes 50.0% of " \
                   "the Lq x Lk entries"
        lengths = ", ".join(f"{n}x{l}" for n, l in (b.shape for b in self.buckets))
        return (f"{self.count} documents as separate causal sequences: {len(self.buckets)} SDPA is_causal calls "
                f"(runs x padded length: {lengths}); computes {100 * self.density():.1f}% of the Lq x Lk entries")


def bucket_length(n: int) -> int:
    """The length class of a run of ``n`` tokens: the smallest of 16, 24, 32, 48, 64, 96, ... >= n."""
    size = MIN_BUCKET
    while size < n:
        size = size * 3 // 2 if size & (size - 1) == 0 else size * 4 // 3  # 2^k -> 1.5 * 2^k -> 2^(k+1)
    return size


def document_runs(call: AttentionCall) -> Runs | None:
    """The call's document runs when its mask is exactly causal attention inside contiguous documents and
    nothing else enters the scores (no bias, no softcap); kept in the prepared mask's memo. Else None."""
    prepared = call.prepared
    if prepared is None or prepared.is_tensor or call.q_len != call.kv_len or call.bias is not None or \
            call.softcap is not None or call.sinks is not None or torch.compiler.is_compiling():
        return None
    if prepared.structure.kinds != ("causal", "document"):
        return None
    return prepared.memo("varlen runs", lambda: _runs(prepared))


def _runs(prepared: PreparedMask) -> Runs | None:
    ctx = prepared.ctx
    q_doc, kv_doc = prepared.structure.doc_ids  # (B, L) each
    pos = ctx.q_positions  # (B, L)
    if not (torch.equal(q_doc, kv_doc) and torch.equal(pos, ctx.kv_positions)):
        return None
    B, L = kv_doc.shape
    dev = kv_doc.device
    start = torch.ones(B, L, dtype=torch.bool, device=dev)  # (B, L): a run starts here
    start[:, 1:] = kv_doc[:, 1:] != kv_doc[:, :-1]
    if not bool(((pos[:, 1:] > pos[:, :-1]) | start[:, 1:]).all()):
        return None  # positions that do not increase inside a run: "position <= mine" is not "index <= mine"
    rows, cols = start.nonzero(as_tuple=True)  # (S,) each, in row-major order
    if torch.unique(torch.stack([rows, kv_doc[rows, cols]], dim=1), dim=0).shape[0] != rows.numel():
        return None  # a document id comes back later in its row: its runs see each other
    first = rows * L + cols  # (S,) index of each run's first token in the flat (B * L) tokens
    lengths = torch.diff(first, append=first.new_tensor([B * L]))  # (S,) (every row starts a run)
    if rows.numel() == B:  # one run per row: plain causal rows, no gathering
        return Runs((), None, B, B, L)
    slot0 = rows * (L + 1) + cols  # (S,) its first token slot; slot rows * (L + 1) + L is the row's zero slot
    zero = rows * (L + 1) + L  # (S,)
    classes = torch.tensor([bucket_length(n) for n in lengths.tolist()], device=dev)  # (S,)
    gather = torch.empty(B * L, dtype=torch.long, device=dev)
    buckets, offset = [], 0
    for size in torch.unique(classes).tolist():
        ids = (classes == size).nonzero().flatten()  # (n,) runs of this class
        n, l = ids.numel(), int(lengths[ids].max())
        t = torch.arange(l, device=dev)[None]  # (1, l)
        real = t < lengths[ids, None]  # (n, l)
        buckets.append(Bucket(torch.where(real, slot0[ids, None] + t, zero[ids, None])))  # (n, l)
        out_slot = offset + torch.arange(n, device=dev)[:, None] * l + t  # (n, l) slots in the laid-out outputs
        gather[(first[ids, None] + t)[real]] = out_slot[real]
        offset += n * l
    return Runs(tuple(buckets), gather, rows.numel(), B, L)


def _token_slots(x: torch.Tensor) -> torch.Tensor:
    """``x (B, h, L, d)`` token-major with a zero slot closing each row: ``(B * (L + 1), h, d)`` (one copy)."""
    return F.pad(x.transpose(1, 2), (0, 0, 0, 0, 0, 1)).flatten(0, 1)  # (B, L + 1, h, d) -> (N, h, d)


def run_documents(call: AttentionCall, runs: Runs) -> torch.Tensor:
    """Causal attention inside every run: ``(B, H, L, Dv)``."""
    B, H, L, Dv = call.batch, call.num_heads, call.q_len, call.v.shape[-1]
    gqa = call.num_kv_heads != call.num_heads
    if runs.whole_rows:
        return F.scaled_dot_product_attention(call.q, call.k, call.v, dropout_p=call.dropout_p, is_causal=True,
                                              scale=call.scale, enable_gqa=gqa)  # (B, H, L, Dv)
    q, k, v = (_token_slots(t) for t in (call.q, call.k, call.v))  # (N, H|Hkv, D|Dv)
    outs = []
    for bucket in runs.buckets:
        n, l = bucket.shape
        idx = bucket.index.flatten()  # (n * l,)
        qs, ks, vs = (t.index_select(0, idx).view(n, l, *t.shape[1:]).transpose(1, 2)
                      for t in (q, k, v))  # (n, H|Hkv, l, D|Dv); index_select: its backward is one index_add_
        out = F.scaled_dot_product_attention(
            qs, ks, vs, dropout_p=call.dropout_p, is_causal=True, scale=call.scale,
            enable_gqa=gqa)  # (n, H, l, Dv)
        outs.append(out.transpose(1, 2).reshape(n * l, H, Dv))  # (n * l, H, Dv), token-major
    laid = outs[0] if len(outs) == 1 else torch.cat(outs)  # (sum n * l, H, Dv)
    return laid.index_select(0, runs.gather).view(B, L, H, Dv).transpose(1, 2)  # (B, H, L, Dv)

"""Attention of one rank's queries against one shard of keys, tile by tile, with the row log-sum-exp.

The context-parallel strategies only move key/value shards; this module does the arithmetic. Queries and
keys are addressed by their *global* token indices, so masks (documents, padding, dense tensors) and
position rules (causal, windows, ALiBi, RoPE done before) see the same coordinates as in one process.

Per tile (``lq`` queries x ``lk`` keys) the forward computes, in float32 (float64 for float64 inputs)::

    s   = scale * q k^T  (-> softcap * tanh(s / softcap)) + bias, masked entries -inf    # (B, H, lq, lk)
    lse = logsumexp(s)        # -inf for a row with no allowed key
    o   = exp(s - lse) @ v    # 0 for such a row

and merges ``(o, lse)`` into the running result through :func:`merge`, which is exact: the merged
``lse`` is ``logaddexp`` of the parts and each part is weighted by ``exp(lse_part - lse)``. Fully masked
parts weigh 0 and a row that no part reaches stays ``(0, -inf)``. The backward recomputes each tile from
the final ``lse`` (FlashAttention's recipe): ``p = exp(s - lse)``, ``ds = p * (dp - delta + dlse)`` with
``delta = rowsum(dout * out)``.

GQA without copies: query heads are grouped by KV head, ``(B, H, lq, D) -> (B, Hkv, G * lq, D)``, so one
matmul per tile serves the G query heads that read a KV head and the key gradients sum over them for free.

Shape legend: B batch, H query heads, Hkv KV heads, G = H // Hkv, lq/lk tile lengths, D/Dv head dims.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnkit._bias import StructuredBias
from attnkit.masks import BoundMask


@dataclass(frozen=True)
class Tile:
    """Local query rows ``[q0, q1)`` of this rank against local key rows ``[k0, k1)`` of one shard."""

    q0: int
    q1: int
    k0: int
    k1: int
    full: bool  # every entry allowed: no mask to evaluate


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype: float64 for float64 inputs, float32 for everything else."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def merge(out: torch.Tensor, lse: torch.Tensor, part_out: torch.Tensor, part_lse: torch.Tensor):
    """Exact merge of two partial attentions over disjoint key sets: ``(B, H, lq, Dv)``, ``(B, H, lq)`` each.

    Rows where both parts are empty stay ``(0, -inf)``; a NaN propagates (never a silent zero).
    """
    total = torch.logaddexp(lse, part_lse)  # (B, H, lq); -inf only when both are -inf
    empty = torch.isneginf(total)
    base = torch.where(empty, torch.zeros_like(total), total)
    w_old = torch.where(empty, torch.zeros_like(total), torch.exp(lse - base))  # (B, H, lq)
    w_new = torch.where(empty, torch.zeros_like(total), torch.exp(part_lse - base))
    return out * w_old.unsqueeze(-1) + part_out * w_new.unsqueeze(-1), total


def _safe(lse: torch.Tensor) -> torch.Tensor:
    """``lse`` with -inf rows set to 0, so ``exp(-inf - safe) = 0`` instead of NaN."""
    return torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)


class TileKernel:
    """Scores, forward and backward of tiles for one call; masks and biases on global indices/positions.

    ``mask_fn`` is the mask bound to the *global* sequence (``None``: everything allowed); ``positions``
    ``(B|1, L)`` are the global positions (the bias reads them); ``mask_heads`` the heads the mask tells apart.
    """

    def __init__(self, *, mask_fn: BoundMask | None, mask_heads: int, bias: StructuredBias | None,
                 positions: torch.Tensor, scale: float, softcap: float | None, batch: int, num_heads: int):
        self.mask_fn, self.bias, self.positions = mask_fn, bias, positions
        self.scale, self.softcap, self.num_heads = scale, softcap, num_heads
        device = positions.device
        self.b = torch.arange(batch, device=device).view(-1, 1, 1, 1)  # (B, 1, 1, 1)
        self.h_mask = torch.arange(mask_heads, device=device).view(1, -1, 1, 1)  # (1, heads, 1, 1)
        self.h_bias = torch.arange(num_heads, device=device).view(1, -1, 1, 1)  # (1, H, 1, 1)

    # ------------------------------------------------------------------ shared scoring
    def _scores(self, qg: torch.Tensor, k: torch.Tensor, qi: torch.Tensor, ki: torch.Tensor, full: bool):
        """Scores ``(B, H, lq, lk)`` of grouped queries ``qg (B, Hkv, G*lq, D)`` against ``k (B, Hkv, lk, D)``.

        ``qi (lq,)``/``ki (lk,)`` are global indices. Returns ``(s, tanh)``; ``tanh`` is the softcap's
        ``tanh(raw / softcap)`` (for the backward) or None.
        """
        B, lk = k.shape[0], k.shape[2]
        lq = qi.numel()
        s = (qg @ k.transpose(-2, -1)) * self.scale  # (B, Hkv, G*lq, lk)
        s = s.view(B, self.num_heads, lq, lk)  # (B, H, lq, lk): head h = kv head h // G
        tanh = None
        if self.softcap is not None:
            tanh = torch.tanh(s / self.softcap)
            s = self.softcap * tanh
        if self.bias is not None:
            q_pos = self.positions[:, qi].view(-1, 1, lq, 1)  # (B|1, 1, lq, 1)
            kv_pos = self.positions[:, ki].view(-1, 1, 1, lk)  # (B|1, 1, 1, lk)
            s = s + self.bias.score(self.h_bias, q_pos, kv_pos, b=self.b).to(s.dtype)  # b: per-row terms
        if not full and self.mask_fn is not None:
            allowed = self.mask_fn(self.b, self.h_mask, qi.view(1, 1, lq, 1), ki.view(1, 1, 1, lk))
            s = s.masked_fill(~allowed, float("-inf"))
        return s, tanh

    @staticmethod
    def _group(x: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
        """``(B, H, l, D) -> (B, Hkv, G*l, D)``: query heads grouped by the KV head they read."""
        B, H, l, D = x.shape
        return x.reshape(B, num_kv_heads, (H // num_kv_heads) * l, D)  # (B, Hkv, G*l, D)

    # ------------------------------------------------------------------ forward
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tiles: list[Tile],
                q_index: torch.Tensor, kv_index: torch.Tensor, out: torch.Tensor, lse: torch.Tensor) -> None:
        """Merge the tiles of ``q (B, H, Lr, D)`` against one shard ``k, v (B, Hkv, Ls, D|Dv)`` into the
        accumulators ``out (B, H, Lr, Dv)`` / ``lse (B, H, Lr)`` in place (all in the accumulation dtype)."""
        Hkv = k.shape[1]
        for t in tiles:
            qi, ki = q_index[t.q0:t.q1], kv_index[t.k0:t.k1]
            s, _ = self._scores(self._group(q[:, :, t.q0:t.q1], Hkv), k[:, :, t.k0:t.k1], qi, ki, t.full)
            part_lse = torch.logsumexp(s, dim=-1)  # (B, H, lq)
            p = torch.exp(s - _safe(part_lse).unsqueeze(-1))  # (B, H, lq, lk)
            part = self._ungroup(self._group(p, Hkv) @ v[:, :, t.k0:t.k1], q.shape[1])  # (B, H, lq, Dv)
            out[:, :, t.q0:t.q1], lse[:, :, t.q0:t.q1] = merge(out[:, :, t.q0:t.q1], lse[:, :, t.q0:t.q1],
                                                               part, part_lse)

    @staticmethod
    def _ungroup(x: torch.Tensor, num_heads: int) -> torch.Tensor:
        """``(B, Hkv, G*l, E) -> (B, H, l, E)``."""
        B, _, gl, E = x.shape
        return x.reshape(B, num_heads, gl * x.shape[1] // num_heads, E)  # (B, H, l, E)

    # ------------------------------------------------------------------ backward
    def backward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tiles: list[Tile],
                 q_index: torch.Tensor, kv_index: torch.Tensor, dout: torch.Tensor, lse: torch.Tensor,
                 delta_minus_dlse: torch.Tensor, dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor) -> None:
        """Accumulate the tiles' gradients in place: ``dq (B, H, Lr, D)`` and the shard's ``dk, dv``.

        ``lse (B, H, Lr)`` is the final log-sum-exp, ``delta_minus_dlse = rowsum(dout * out) - dlse``.
        """
        Hkv, H = k.shape[1], q.shape[1]
        for t in tiles:
            qi, ki = q_index[t.q0:t.q1], kv_index[t.k0:t.k1]
            qg = self._group(q[:, :, t.q0:t.q1], Hkv)  # (B, Hkv, G*lq, D)
            kt, vt = k[:, :, t.k0:t.k1], v[:, :, t.k0:t.k1]
            s, tanh = self._scores(qg, kt, qi, ki, t.full)
            p = torch.exp(s - _safe(lse[:, :, t.q0:t.q1]).unsqueeze(-1))  # (B, H, lq, lk); 0 where masked
            pg = self._group(p, Hkv)  # (B, Hkv, G*lq, lk)
            dog = self._group(dout[:, :, t.q0:t.q1], Hkv)  # (B, Hkv, G*lq, Dv)
            dv[:, :, t.k0:t.k1] += pg.transpose(-2, -1) @ dog  # (B, Hkv, lk, Dv), summed over the G heads
            dp = (dog @ vt.transpose(-2, -1)).view_as(p)  # (B, H, lq, lk)
            ds = p * (dp - delta_minus_dlse[:, :, t.q0:t.q1].unsqueeze(-1))
            if tanh is not None:
                ds = ds * (1 - tanh * tanh)
            dsg = self._group(ds * self.scale, Hkv)  # (B, Hkv, G*lq, lk)
            dq[:, :, t.q0:t.q1] += self._ungroup(dsg @ kt, H)  # (B, H, lq, D)
            dk[:, :, t.k0:t.k1] += dsg.transpose(-2, -1) @ qg  # (B, Hkv, lk, D)

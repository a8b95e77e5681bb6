"""The protocol of structured biases: additive score terms computed from positions.

A structured bias (ALiBi is the built-in one) is evaluated from the absolute positions of queries and keys,
so a backend can compute it per block instead of materialising an ``(B, H, Lq, Lk)`` tensor.

Shape legend: B batch, H query heads, Lq/Lk query/key lengths.
"""

from __future__ import annotations

import torch


class StructuredBias:
    """Base class: an additive score term ``score(h, q_pos, kv_pos)`` evaluated elementwise.

    Subclasses implement :meth:`score`; it must use only elementwise, broadcasting tensor operations so
    the same code serves dense materialisation, per-block evaluation and flex attention's ``score_mod``.
    """

    num_heads: int
    #: batch rows the bias distinguishes (1 = the same for every row); >1 means ``score`` needs ``b``
    batch: int = 1
    #: True when ``score`` depends on the positions only through ``kv_pos - q_pos`` (ALiBi): backends may
    #: then tabulate it once per offset instead of per entry
    relative: bool = False
    #: True when, on keys at or before the query (``kv_pos <= q_pos``), ``score`` is linear in the offset
    #: (ALiBi: ``-m_h (q_pos - kv_pos)``): under a causal mask it is then a term of the key alone up to a
    #: per-row constant, which softmax ignores (backends may pass it as one ``(H, Lk)`` row beside a causal flag)
    causal_linear: bool = False

    def score(self, h: torch.Tensor, q_pos: torch.Tensor, kv_pos: torch.Tensor,
              b: torch.Tensor | None = None) -> torch.Tensor:
        """Bias for head index ``h``, query position ``q_pos`` and key position ``kv_pos`` (broadcasting); the
        batch row ``b`` is passed by every backend (a bias with ``batch > 1`` needs it)."""
        raise NotImplementedError

    def reach(self, margin: torch.Tensor) -> torch.Tensor | None:
        """For a relative bias that is 0 at offset 0 and falls with distance: per head, the largest
        ``|offset|`` at which the bias is still ``>= -margin[h]`` (float ``(H,)``); None when it has no such
        bound. Backends may skip keys beyond it when ``margin`` covers what the scores can add back."""
        return None

    def needs_grad(self, device: torch.device) -> bool:
        """Whether autograd must reach the bias (asked with grad mode on): by default, whether the score of one
        entry on ``device`` requires grad (a trainable parameter, anything)."""
        zero = torch.zeros((), dtype=torch.long, device=device)
        return bool(self.score(zero, zero, zero, b=zero).requires_grad)

    def memo_key(self):
        """A hashable value that equals another bias's exactly when the two score alike (e.g. ALiBi's slopes),
        or None (the default) when it can't say: backends then build their tables per call."""
        return None

    def materialize(self, q_positions: torch.Tensor, kv_positions: torch.Tensor) -> torch.Tensor:
        """Dense float32 bias ``(B|1, H, Lq, Lk)`` for positions ``(B|1, Lq)`` and ``(B|1, Lk)`` (B when the
        bias has per-row terms)."""
        h = torch.arange(self.num_heads, device=q_positions.device)[None, :, None, None]  # (1, H, 1, 1)
        q_pos = q_positions[:, None, :, None]  # (B|1, 1, Lq, 1)
        kv_pos = kv_positions[:, None, None, :]  # (B|1, 1, 1, Lk)
        rows = max(q_positions.shape[0], kv_positions.shape[0], self.batch)
        b = torch.arange(rows, device=q_positions.device)[:, None, None, None] if self.batch > 1 else None  # (B,1,1,1)
        return self.score(h, q_pos, kv_pos, b=b).float()

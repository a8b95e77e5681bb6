"""What the labs swap into a model: attention computed another way around the same projections, and the
recurrent and convolutional baselines.

:func:`lab_attention` registers a layer kind (``attnkit.models.blocks.register_attention_layer``) whose layers keep
:class:`~attnkit.nn.MultiHeadAttention`'s projections and positions and change only the attention computation:
a different ``scale`` (``1.0`` = no 1/sqrt(d_k)), a fixed mask instead of the model's (strided patterns), or a
``kernel(q, k, v) -> out`` written out by hand (the mask-after-softmax bug). The model, its init and its
training loop stay the library's.

Shape legend: B batch, H heads, L length, D head_dim, E width, V vocabulary.
"""

from __future__ import annotations

import torch
from torch import nn

from attnkit.backends import attention
from attnkit.models.blocks import ATTENTION_LAYERS, register_attention_layer, softmax_attention
from attnkit.nn import MultiHeadAttention


class LabAttention(nn.Module):
    """``MultiHeadAttention``'s projections around the attention computation a lab studies.

    ``forward(x (B, L, E), mask, *, positions=None) -> (B, L, E)``; no KV cache (labs score full sequences)."""

    def __init__(self, inner: MultiHeadAttention, *, scale: float | None = None, mask=None, kernel=None):
        super().__init__()
        self.inner, self.scale, self.fixed_mask, self.kernel = inner, scale, mask, kernel

    @property
    def out_proj(self) -> nn.Linear:  # the model's init scales residual projections found by this name
        return self.inner.out_proj

    def forward(self, x: torch.Tensor, mask=None, *, positions=None) -> torch.Tensor:
        B, L, _ = x.shape
        q, k, v = self.inner.project(x, positions)  # (B, H, L, D), (B, Hkv, L, D) x2
        if self.kernel is not None:
            out = self.kernel(q, k, v)  # (B, H, L, D)
        else:
            dropout = self.inner.dropout if self.training else 0.0
            out = attention(q, k, v, self.fixed_mask if self.fixed_mask is not None else mask,
                            bias=self.inner.score_bias, scale=self.scale if self.scale is not None else self.inner.scale,
                            dropout_p=dropout,
                            q_positions=positions, kv_positions=positions)
        out = out.transpose(1, 2).reshape(B, L, -1)  # (B, L, H*D)
        return self.inner.out_proj(out)


def lab_attention(name: str, *, scale: float | None = None, mask=None, kernel=None) -> str:
    """Register (once) the layer kind ``"lab-<name>"`` and return its name for ``LMConfig(attention=...)``."""
    kind = f"lab-{name}"
    if kind not in ATTENTION_LAYERS:
        register_attention_layer(kind, lambda config, index: LabAttention(
            softmax_attention(config, index), scale=scale, mask=mask, kernel=kernel))
    return kind


def mask_after_softmax(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The bug: softmax over every key, then zero the future (rows no longer sum to 1, and the normaliser
    still reads the future keys). q, k, v ``(B, H, L, D)`` (MHA, no GQA)."""
    L = q.shape[-2]
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5  # (B, H, L, L)
    allowed = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()  # (L, L)
    return scores.softmax(-1).masked_fill(~allowed, 0.0) @ v  # (B, H, L, D)


class LSTMLM(nn.Module):
    """Embedding -> LSTM -> head: ``tokens (B, L) -> logits (B, L, V)``."""

    def __init__(self, vocab: int, dim: int, hidden: int, layers: int = 2):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.rnn = nn.LSTM(dim, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(self.embed(tokens))[0])


class ConvLM(nn.Module):
    """Embedding -> residual causal Conv1d blocks (kernel ``kernel``, no dilation) -> head.

    The receptive field is ``layers * (kernel - 1) + 1`` tokens: farther information cannot arrive."""

    def __init__(self, vocab: int, dim: int, layers: int = 4, kernel: int = 5):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.kernel = kernel
        self.convs = nn.ModuleList(nn.Conv1d(dim, 2 * dim, kernel) for _ in range(layers))
        self.norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(layers))
        self.head = nn.Linear(dim, vocab)

    @property
    def receptive_field(self) -> int:
        return len(self.convs) * (self.kernel - 1) + 1

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)  # (B, L, E)
        for conv, norm in zip(self.convs, self.norms):
            h = nn.functional.pad(norm(x).transpose(1, 2), (self.kernel - 1, 0))  # (B, E, L + k - 1): causal
            x = x + nn.functional.glu(conv(h), dim=1).transpose(1, 2)  # (B, L, E)
        return self.head(x)

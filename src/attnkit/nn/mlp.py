"""Feed-forward blocks: ``MLP`` (``down(act(up(x)))``, GPT-2 / BERT) and ``GatedMLP``
(``down(act(gate(x)) * up(x))``: SwiGLU with ``silu`` as in LLaMA / Mistral / Qwen2, GeGLU with ``gelu_tanh``).

``make_mlp(kind, dim, hidden, ...)`` builds one by name from :data:`MLPS` (register a factory to add a kind).

Shape legend: ``(B, L, E) -> (B, L, E)`` through a hidden width F.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from attnkit.errors import AttnkitValueError

#: activation name -> elementwise function
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu_tanh": partial(F.gelu, approximate="tanh"),  # GPT-2's "gelu_new"
    "gelu": F.gelu,  # exact erf GELU (BERT)
    "silu": F.silu,
    "relu": F.relu,
}


def active_dropout(dropout: nn.Dropout, x: torch.Tensor) -> torch.Tensor:
    """``dropout(x)`` in training mode with ``p > 0``; else ``x`` itself, without the module call (an identity
    dropout costs a module dispatch per layer per decode step)."""
    return dropout(x) if dropout.training and dropout.p > 0 else x


def _activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    if name not in ACTIVATIONS:
        raise AttnkitValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {name!r}.")
    return ACTIVATIONS[name]


class MLP(nn.Module):
    """``dropout(down(act(up(x))))``: ``(B, L, E) -> (B, L, F) -> (B, L, E)``."""

    def __init__(self, dim: int, hidden: int, *, bias: bool = True, activation: str = "gelu_tanh",
                 dropout: float = 0.0):
        super().__init__()
        self.activation, self.act = activation, _activation(activation)
        self.up = nn.Linear(dim, hidden, bias=bias)
        self.down = nn.Linear(hidden, dim, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return active_dropout(self.dropout, self.down(self.act(self.up(x))))

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}"


class GatedMLP(nn.Module):
    """``dropout(down(act(gate(x)) * up(x)))``: ``(B, L, E) -> (B, L, F) -> (B, L, E)`` (SwiGLU / GeGLU)."""

    def __init__(self, dim: int, hidden: int, *, bias: bool = False, activation: str = "silu", dropout: float = 0.0):
        super().__init__()
        self.activation, self.act = activation, _activation(activation)
        self.gate = nn.Linear(dim, hidden, bias=bias)
        self.up = nn.Linear(dim, hidden, bias=bias)
        self.down = nn.Linear(hidden, dim, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return active_dropout(self.dropout, self.down(self.act(self.gate(x)) * self.up(x)))

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}"


#: MLP kind -> factory(dim, hidden, bias, dropout) -> module
MLPS: dict[str, Callable[[int, int, bool, float], nn.Module]] = {
    "gelu": lambda d, f, b, p: MLP(d, f, bias=b, activation="gelu_tanh", dropout=p),  # GPT-2 (tanh GELU)
    "gelu_exact": lambda d, f, b, p: MLP(d, f, bias=b, activation="gelu", dropout=p),  # BERT
    "relu": lambda d, f, b, p: MLP(d, f, bias=b, activation="relu", dropout=p),
    "swiglu": lambda d, f, b, p: GatedMLP(d, f, bias=b, activation="silu", dropout=p),  # LLaMA, Mistral, Qwen2
    "geglu": lambda d, f, b, p: GatedMLP(d, f, bias=b, activation="gelu_tanh", dropout=p),  # Gemma
}


def make_mlp(kind: str, dim: int, hidden: int, *, bias: bool = True, dropout: float = 0.0) -> nn.Module:
    """An MLP by name (see :data:`MLPS`)."""
    if kind not in MLPS:
        raise AttnkitValueError(f"mlp must be one of {sorted(MLPS)}, got {kind!r}; register a new kind in "
                                "attnkit.nn.mlp.MLPS.")
    return MLPS[kind](dim, hidden, bias, dropout)

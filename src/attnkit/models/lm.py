"""``TransformerLM``: a decoder-only (or, with ``causal=False``, encoder) Transformer built from attnkit modules.

Pre-norm blocks ``x + attn(norm(x))``, ``x + mlp(norm(x))``, a final norm and a language-model head that may
share the token embedding's weight (``tie_embeddings``). Every layer's attention module is chosen per layer by
name from :data:`ATTENTION_LAYERS` (``"softmax"`` = :class:`attnkit.nn.MultiHeadAttention`), so another kind
(linear attention) registers a factory and drops in without touching this file.

Positions: ``"rope"`` and ``"alibi"`` act inside attention; ``"sinusoidal"`` and ``"learned"`` are added to the
token embeddings; ``"none"`` uses none. Masks: causal (or a sliding window of ``window`` keys) for decoders,
``& document(doc_ids)`` for packed rows, ``& padding(key_is_real)`` for padded batches.

Init (GPT-2): every Linear and Embedding from normal(0, ``init_std``), biases zero, and the projections that
write into the residual stream (attention ``out_proj``, MLP ``down``) from normal(0, init_std / sqrt(2 n_layers)).

Shape legend: B batch, L new tokens, Lk all keys (cache included), E dim, V vocab_size.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from attnkit import masks
from attnkit._checks import positive_int
from attnkit.errors import AttnkitTypeError, AttnkitValueError, describe
from attnkit.nn import LinearAttention, MultiHeadAttention
from attnkit.positions import Learned, Sinusoidal

POSITIONS = ("rope", "alibi", "sinusoidal", "learned", "none")


@dataclass(frozen=True)
class LMConfig:
    """Everything that defines a :class:`TransformerLM` (JSON-serialisable: checkpoints store it).

    ``attention`` is one layer kind for all layers or a tuple with one kind per layer (names from
    :data:`ATTENTION_LAYERS`). ``window`` turns causal attention into a sliding window of that many keys.
    """

    vocab_size: int = 257
    dim: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int | None = None
    mlp_ratio: float = 4.0
    max_seq_len: int = 256
    positions: str = "rope"
    window: int | None = None
    causal: bool = True
    backend: str = "auto"
    dropout: float = 0.0
    bias: bool = False
    tie_embeddings: bool = True
    init_std: float = 0.02
    attention: str | tuple[str, ...] = "softmax"

    def __post_init__(self):
        for name in ("vocab_size", "dim", "n_layers", "n_heads", "max_seq_len"):
            positive_int(getattr(self, name), name)
        if self.positions not in POSITIONS:
            raise AttnkitValueError(f"positions must be one of {POSITIONS}, got {self.positions!r}; 'rope' is the default.")
        if self.window is not None:
            positive_int(self.window, "window")
            if not self.causal:
                raise AttnkitValueError(f"window={self.window} needs causal=True (a sliding window is causal); "
                                        "drop window for a bidirectional encoder.")
        if not 0.0 <= self.dropout < 1.0:
            raise AttnkitValueError(f"dropout must be in [0, 1), got {self.dropout}; use e.g. 0.1, or 0.0.")
        if isinstance(self.attention, list):
            object.__setattr__(self, "attention", tuple(self.attention))  # JSON gives lists
        kinds = (self.attention,) * self.n_layers if isinstance(self.attention, str) else self.attention
        if len(kinds) != self.n_layers:
            raise AttnkitValueError(f"attention has {len(kinds)} entries but n_layers={self.n_layers}; give one kind "
                                    "for all layers or one per layer.")

    def layer_kind(self, index: int) -> str:
        return self.attention if isinstance(self.attention, str) else self.attention[index]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> LMConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise AttnkitValueError(f"unknown LMConfig fields {unknown}; known fields are {sorted(known)}.")
        return cls(**data)

    def replace(self, **changes) -> LMConfig:
        return replace(self, **changes)




def softmax_attention(config: LMConfig, index: int) -> nn.Module:
    """The default layer kind: :class:`attnkit.nn.MultiHeadAttention` configured from ``config``."""
    return MultiHeadAttention(
        config.dim, config.n_heads, num_kv_heads=config.n_kv_heads, dropout=config.dropout, bias=config.bias,
        positions=config.positions if config.positions in ("rope", "alibi") else None, backend=config.backend,
    )


def linear_attention(config: LMConfig, index: int) -> nn.Module:
    """:class:`attnkit.nn.LinearAttention` (O(n), a recurrent state for decoding); it has no positional term,
    so position information comes from embeddings or the softmax layers of a hybrid."""
    return LinearAttention(config.dim, config.n_heads, num_kv_heads=config.n_kv_heads, dropout=config.dropout,
                           bias=config.bias)


#: layer kind -> factory(config, layer_index) -> module with forward(x, mask, *, positions=None[, cache=None])
ATTENTION_LAYERS: dict[str, Callable[[LMConfig, int], nn.Module]] = {
    "softmax": softmax_attention, "linear": linear_attention}


def register_attention_layer(name: str, factory: Callable[[LMConfig, int], nn.Module]) -> None:
    """Make ``LMConfig(attention=name)`` (or a per-layer tuple naming it) build layers with ``factory``."""
    ATTENTION_LAYERS[name] = factory


class MLP(nn.Module):
    """``down(gelu(up(x)))``: ``(B, L, E) -> (B, L, E)`` through a hidden width ``mlp_ratio * E``."""

    def __init__(self, dim: int, hidden: int, bias: bool, dropout: float):
        super().__init__()
        self.up = nn.Linear(dim, hidden, bias=bias)
        self.down = nn.Linear(hidden, dim, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.down(F.gelu(self.up(x), approximate="tanh")))


class Block(nn.Module):
    """Pre-norm residual block around any attention module: ``(B, L, E) -> (B, L, E)``."""

    def __init__(self, config: LMConfig, attn: nn.Module):
        super().__init__()
        self.norm1 = nn.LayerNorm(config.dim, bias=config.bias)
        self.attn = attn
        self.norm2 = nn.LayerNorm(config.dim, bias=config.bias)
        self.mlp = MLP(config.dim, int(config.mlp_ratio * config.dim), config.bias, config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x, mask, positions=None, cache=None):
        kwargs = {"positions": positions} if cache is None else {"positions": positions, "cache": cache}
        x = x + self.resid_dropout(self.attn(self.norm1(x), mask, **kwargs))
        return x + self.mlp(self.norm2(x))


class TransformerLM(nn.Module):
    """Decoder-only Transformer LM (or a bidirectional encoder with ``config.causal=False``).

    ``forward(tokens (B, L) int64, *, positions=None, cache=None, key_is_real=None, doc_ids=None) -> logits
    (B, L, V)``. ``positions`` ``(B|1, L)`` are absolute token positions (default ``arange`` after the cached
    tokens); ``doc_ids`` ``(B, L)`` restricts attention to each packed document (give positions that restart
    per document with it); ``key_is_real`` ``(B, Lk)`` marks real keys (cache included) in padded batches.
    ``encode`` returns the final hidden states ``(B, L, E)`` instead of logits.

    ``gradient_checkpointing = True`` recomputes each block in the backward pass (less memory, more time).
    """

    def __init__(self, config: LMConfig):
        super().__init__()
        if not isinstance(config, LMConfig):
            raise AttnkitTypeError(f"config must be an LMConfig, got {describe(config)}; build one with "
                                   "attnkit.models.builders.lm_config('tiny').")
        self.config = config
        self.gradient_checkpointing = False
        self.embed = nn.Embedding(config.vocab_size, config.dim)
        self.pos_embed = {"sinusoidal": Sinusoidal(config.dim), "learned": Learned(config.max_seq_len, config.dim,
                                                                                   config.init_std)}.get(config.positions)
        self.dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList([Block(config, _attention_layer(config, i)) for i in range(config.n_layers)])
        self.norm = nn.LayerNorm(config.dim, bias=config.bias)
        self.head = nn.Linear(config.dim, config.vocab_size, bias=False)
        self.reset_parameters()
        if config.tie_embeddings:
            self.head.weight = self.embed.weight

    def reset_parameters(self) -> None:
        """GPT-2 init: normal(0, init_std); residual projections normal(0, init_std / sqrt(2 n_layers))."""
        std = self.config.init_std
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
        resid_std = std / math.sqrt(2 * self.config.n_layers)
        for block in self.blocks:
            for proj in (getattr(block.attn, "out_proj", None), block.mlp.down):
                if isinstance(proj, nn.Linear):
                    nn.init.normal_(proj.weight, mean=0.0, std=resid_std)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def mask(self, *, doc_ids=None, key_is_real=None, positions=None, cached: bool = False):
        """The mask spec for this call: causal / sliding window (decoders), & document, & padding.

        With a cache, padding is evaluated on positions (:func:`~attnkit.models.generation.padding_by_position`,
        right for every cache kind, which may reorder its slots); without, on key indices."""
        c = self.config
        parts = []
        if c.causal:
            parts.append(masks.sliding_window(c.window) if c.window else masks.causal())
        if doc_ids is not None:
            parts.append(masks.document(doc_ids))
        if key_is_real is not None:
            if cached:
                from attnkit.models.generation import padding_by_position

                parts.append(padding_by_position(key_is_real, positions))
            else:
                parts.append(masks.padding(key_is_real))
        if not parts:
            return None
        return parts[0] if len(parts) == 1 else masks.And(*parts)

    def encode(self, tokens: torch.Tensor, *, positions=None, cache=None, key_is_real=None, doc_ids=None):
        """Final hidden states ``(B, L, E)`` (after the last norm)."""
        self._check_tokens(tokens)
        B, L = tokens.shape
        if cache is not None and positions is None:
            raise AttnkitValueError("positions must be given with cache=: pass the absolute positions (B|1, L) of the "
                                    "new tokens, e.g. torch.arange(n_cached, n_cached + L)[None].")
        x = self.embed(tokens)  # (B, L, E)
        if self.pos_embed is not None:
            pos = torch.arange(L, device=tokens.device) if positions is None else positions.clamp(min=0)  # pads < 0
            x = x + self.pos_embed(pos).to(x.dtype)  # (B|1, L, E) broadcast
        x = self.dropout(x)
        mask = self.mask(doc_ids=doc_ids, key_is_real=key_is_real, positions=positions, cached=cache is not None)
        if doc_ids is not None and cache is None and key_is_real is None and self.config.causal:
            mask = packed_mask(doc_ids, positions, self.config.window, mask)  # built once, not per layer
        if cache is not None and len(cache) != len(self.blocks):
            raise AttnkitValueError(f"cache has {len(cache)} entries but the model has {len(self.blocks)} layers; "
                                    "build it with model.new_cache(batch_size).")
        # linear-attention layers read padding by key index (their state has no slots to reorder)
        state_mask = mask if cache is None or key_is_real is None else self.mask(key_is_real=key_is_real)
        for i, block in enumerate(self.blocks):
            layer_cache = None if cache is None else cache[i]
            layer_mask = state_mask if isinstance(block.attn, LinearAttention) else mask
            if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
                x = checkpoint(block, x, layer_mask, positions, layer_cache, use_reentrant=False)
            else:
                x = block(x, layer_mask, positions, layer_cache)
        return self.norm(x)

    def forward(self, tokens: torch.Tensor, *, positions=None, cache=None, key_is_real=None, doc_ids=None):
        return self.head(self.encode(tokens, positions=positions, cache=cache, key_is_real=key_is_real,
                                     doc_ids=doc_ids))  # (B, L, V)

    def new_cache(self, batch_size: int, *, kind: str = "dynamic", max_length: int | None = None) -> list:
        """One KV cache per layer (``attnkit.cache``): ``"dynamic"`` grows, ``"static"`` preallocates
        ``max_length``, ``"sliding"`` keeps the last ``window`` keys."""
        from attnkit.cache import make_cache

        if not self.config.causal:
            raise AttnkitValueError("new_cache needs a causal decoder (config.causal=True); an encoder runs in one pass "
                                    "without a cache.")
        param = self.embed.weight

        def layer_cache(i: int):
            attn = self.blocks[i].attn
            if hasattr(attn, "new_cache"):  # a layer with its own decoding state (linear attention)
                return attn.new_cache(batch_size)
            return make_cache(kind, batch_size, self._kv_heads(i), self._head_dim(i), max_length=max_length,
                              window=self.config.window, dtype=param.dtype, device=param.device)

        return [layer_cache(i) for i in range(len(self.blocks))]

    def _kv_heads(self, index: int) -> int:
        return getattr(self.blocks[index].attn, "num_kv_heads", self.config.n_kv_heads or self.config.n_heads)

    def _head_dim(self, index: int) -> int:
        return getattr(self.blocks[index].attn, "head_dim", self.config.dim // self.config.n_heads)

    def _check_tokens(self, tokens: object) -> None:
        if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.dtype.is_floating_point \
                or tokens.dtype == torch.bool:
            raise AttnkitTypeError(f"tokens must be an int64 tensor (B, L), got {describe(tokens)}; pass token ids, "
                                   "e.g. torch.tensor([[1, 2, 3]]).")


def packed_mask(doc_ids: torch.Tensor, positions: torch.Tensor | None, window: int | None, spec):
    """The dense mask ``(B, 1, L, L)`` of ``causal() [& sliding_window(W)] & document(doc_ids)`` for packed rows,
    built with two broadcast comparisons instead of evaluating ``spec`` per element.

    Valid when positions count up by one inside each document (what packing produces: they restart at 0 at
    each document), because then causality and windows on positions equal those on indices. Any other
    positions get ``spec`` back unchanged (evaluated on positions by the backend)."""
    B, L = doc_ids.shape
    doc = doc_ids.reshape(B, L)  # (B, L)
    if positions is not None:
        pos = positions.reshape(-1, L).expand(B, L)  # (B, L)
        steps_ok = (pos[:, 1:] - pos[:, :-1] == 1) | (doc[:, 1:] != doc[:, :-1])  # (B, L-1)
        if not bool(steps_ok.all()):
            return spec
    i = torch.arange(L, device=doc.device)
    allowed = i[None, :] <= i[:, None]  # (L, L): key index <= query index
    if window is not None:
        allowed = allowed & (i[:, None] - i[None, :] < window)
    return allowed & (doc[:, None, :, None] == doc[:, None, None, :])  # (B, 1, L, L)


def _attention_layer(config: LMConfig, index: int) -> nn.Module:
    kind = config.layer_kind(index)
    if kind not in ATTENTION_LAYERS:
        raise AttnkitValueError(f"attention layer kind {kind!r} (layer {index}) is not registered; choose one of "
                                f"{sorted(ATTENTION_LAYERS)} or add it with register_attention_layer(name, factory).")
    return ATTENTION_LAYERS[kind](config, index)

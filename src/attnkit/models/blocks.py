"""Transformer blocks from injected parts, and the builders that make those parts from an :class:`LMConfig`.

``Block(attn, mlp, norm1, norm2, post_norm=False, mask=None)`` composes any attention module, any MLP and any
two norms; nothing inside it knows which family it belongs to:

>>> import torch, attnkit as ak
>>> attn = ak.nn.MultiHeadAttention(512, 8, num_kv_heads=2, bias=False, rotary=ak.positions.RoPE(64, base=1e6))
>>> block = Block(attn, ak.nn.GatedMLP(512, 1408), torch.nn.RMSNorm(512), torch.nn.RMSNorm(512),
...               mask=ak.masks.sliding_window(4096))                    # a Mistral layer

:func:`block_from_config` is the builder the presets and the converters use; every layer's attention module is
chosen per layer by name from :data:`ATTENTION_LAYERS` (``"softmax"`` = :class:`attnkit.nn.MultiHeadAttention`),
so another kind (linear attention) registers a factory and drops in without touching this file.

Shape legend: B batch, L length, E dim, D head_dim.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from attnkit import masks
from attnkit.errors import AttnkitValueError
from attnkit.models.config import LMConfig
from attnkit.nn import LinearAttention, MultiHeadAttention
from attnkit.nn.mlp import active_dropout, make_mlp
from attnkit.nn.norms import make_norm
from attnkit.positions import ALiBi, RoPE


class Block(nn.Module):
    """A residual block around injected parts: ``(B, L, E) -> (B, L, E)``.

    Pre-norm (default; GPT-2, LLaMA): ``x = x + attn(norm1(x)); x = x + mlp(norm2(x))``.
    Post-norm (``post_norm=True``; BERT, the original Transformer): ``x = norm1(x + attn(x));
    x = norm2(x + mlp(x))``. Sandwich (``attn_out_norm``, ``mlp_out_norm``; Gemma-2/3): pre-norm with a norm on
    each sublayer's output, ``x = x + attn_out_norm(attn(norm1(x)))``, ``x = x + mlp_out_norm(mlp(norm2(x)))``.

    ``mask``: this layer's own attention pattern (e.g. ``masks.sliding_window(4096)`` on a Mistral layer, or
    on every other Gemma-2 layer) that replaces the model's default (causal for a decoder); the model still
    adds its document and padding masks to it. None = the model's default. ``dropout`` is applied to the
    attention output before the residual add (the MLP carries its own).
    """

    def __init__(self, attn: nn.Module, mlp: nn.Module, norm1: nn.Module, norm2: nn.Module, *,
                 post_norm: bool = False, mask: masks.MaskSpec | None = None, dropout: float = 0.0,
                 attn_out_norm: nn.Module | None = None, mlp_out_norm: nn.Module | None = None):
        super().__init__()
        self.norm1, self.attn, self.norm2, self.mlp = norm1, attn, norm2, mlp
        if attn_out_norm is not None:  # sandwich norms (Gemma-2/3): on each sublayer's output, pre-norm stacks
            self.attn_out_norm, self.mlp_out_norm = attn_out_norm, mlp_out_norm
        self.post_norm, self.mask = post_norm, mask
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x, mask, positions=None, cache=None):
        kwargs = {"positions": positions} if cache is None else {"positions": positions, "cache": cache}
        if self.post_norm:
            x = self.norm1(x + active_dropout(self.resid_dropout, self.attn(x, mask, **kwargs)))
            return self.norm2(x + self.mlp(x))
        if "attn_out_norm" in self._modules:
            x = x + active_dropout(self.resid_dropout, self.attn_out_norm(self.attn(self.norm1(x), mask, **kwargs)))
            return x + self.mlp_out_norm(self.mlp(self.norm2(x)))
        x = x + active_dropout(self.resid_dropout, self.attn(self.norm1(x), mask, **kwargs))
        return x + self.mlp(self.norm2(x))

    def extra_repr(self) -> str:
        return f"post_norm={self.post_norm}, mask={self.mask}"


# --------------------------------------------------------------------------------------- builders from config


def rotary_from_config(config: LMConfig, index: int = 0) -> RoPE | None:
    """Layer ``index``'s rotary embedding (None on a layer without RoPE: another scheme, or a NoPE layer)."""
    if config.layer_positions(index) != "rope":
        return None
    if config.local_rope_base is not None and config.layer_window(index):  # Gemma-3's local layers
        return RoPE(config.resolved_head_dim, base=config.local_rope_base, style=config.rope_style)
    return RoPE(config.resolved_head_dim, base=config.rope_base, style=config.rope_style, scaling=config.rope_scaling)


def softmax_attention(config: LMConfig, index: int) -> nn.Module:
    """The default layer kind: :class:`attnkit.nn.MultiHeadAttention` with the config's parts injected."""
    D = config.resolved_head_dim
    qk_norm = (lambda: make_norm(config.norm, D, eps=config.norm_eps, bias=config.bias)) if config.qk_norm else None
    return MultiHeadAttention(
        config.embed_dim, config.num_heads, num_kv_heads=config.num_kv_heads, head_dim=config.head_dim,
        dropout=config.dropout, bias=config.bias, qkv_bias=config.qkv_bias, rotary=rotary_from_config(config, index),
        score_bias=ALiBi(config.num_heads) if config.layer_positions(index) == "alibi" else None,
        q_norm=qk_norm and qk_norm(), k_norm=qk_norm and qk_norm(), backend=config.backend, scale=config.attn_scale,
    )


def linear_attention(config: LMConfig, index: int) -> nn.Module:
    """:class:`attnkit.nn.LinearAttention` (O(n), a recurrent state for decoding); it has no positional term,
    so position information comes from embeddings or the softmax layers of a hybrid."""
    return LinearAttention(config.embed_dim, config.num_heads, num_kv_heads=config.num_kv_heads, dropout=config.dropout,
                           bias=config.bias)


#: layer kind -> factory(config, layer_index) -> module with forward(x, mask, *, positions=None[, cache=None])
ATTENTION_LAYERS: dict[str, Callable[[LMConfig, int], nn.Module]] = {
    "softmax": softmax_attention, "linear": linear_attention}


def register_attention_layer(name: str, factory: Callable[[LMConfig, int], nn.Module]) -> None:
    """Make ``LMConfig(attention=name)`` (or a per-layer tuple naming it) build layers with ``factory``."""
    ATTENTION_LAYERS[name] = factory


def attention_from_config(config: LMConfig, index: int) -> nn.Module:
    kind = config.layer_kind(index)
    if kind not in ATTENTION_LAYERS:
        raise AttnkitValueError(f"attention layer kind {kind!r} (layer {index}) is not registered; choose one of "
                                f"{sorted(ATTENTION_LAYERS)} or add it with register_attention_layer(name, factory).")
    return ATTENTION_LAYERS[kind](config, index)


def norm_from_config(config: LMConfig) -> nn.Module:
    return make_norm(config.norm, config.embed_dim, eps=config.norm_eps, bias=config.bias)


def block_from_config(config: LMConfig, index: int, mask: masks.MaskSpec | None = None) -> Block:
    """Layer ``index`` of the model ``config`` describes (``mask``: its pattern, default from ``config.window``)."""
    window = config.layer_window(index)
    if mask is None and window:
        mask = masks.sliding_window(window)
    return Block(attention_from_config(config, index),
                 make_mlp(config.mlp, config.embed_dim, config.resolved_mlp_hidden, bias=config.bias, dropout=config.dropout),
                 norm_from_config(config), norm_from_config(config), post_norm=config.post_norm, mask=mask,
                 dropout=config.dropout, **({"attn_out_norm": norm_from_config(config),
                                             "mlp_out_norm": norm_from_config(config)} if config.sandwich_norm else {}))


def blocks_from_config(config: LMConfig) -> list[Block]:
    """Every layer; layers with the same window share one mask object, so the model builds their mask once."""
    windows = {w: masks.sliding_window(w) for w in map(config.layer_window, range(config.num_layers)) if w}
    return [block_from_config(config, i, windows.get(config.layer_window(i))) for i in range(config.num_layers)]


def layer_window(block: nn.Module) -> int | None:
    """The sliding window a block's own mask keeps (None: no window of its own)."""
    return getattr(getattr(block, "mask", None), "window", None)


__all__ = ["ATTENTION_LAYERS", "Block", "attention_from_config", "block_from_config", "blocks_from_config", "layer_window",
           "linear_attention", "norm_from_config", "register_attention_layer", "rotary_from_config",
           "softmax_attention"]

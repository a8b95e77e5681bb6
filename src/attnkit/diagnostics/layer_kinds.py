"""What each layer of a model is: full, sliding, chunked or local softmax attention, or a layer of another kind
(linear attention, a recurrent or state-space mixer) that has no attention weights to show.

Two sources, each for what it can tell:

- :func:`mask_kind` reads the mask an attention call received (the truth of what ran): ``full (causal)``,
  ``full (bidirectional)``, ``sliding 4``, ``chunked 4``, ``local (2, 2)`` (a two-sided window), ``strided 8``,
  or the mask's own name for anything else.
- :func:`model_layers` reads the model's structure: every layer in order with ``attends`` False and the reason
  for those that make no softmax attention call (an attnkit block whose attention is not
  :class:`attnkit.nn.MultiHeadAttention`; a Hugging Face config's ``layer_types`` entry other than full, sliding
  or chunked attention, e.g. Qwen3-Next's ``linear_attention``). None when the structure does not say.

>>> from attnkit import masks
>>> mask_kind(masks.sliding_window(4)), mask_kind(masks.causal() & masks.padding([3])), mask_kind(None)
('sliding 4', 'full (causal)', 'full (bidirectional)')
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from torch import nn

#: Hugging Face ``layer_types`` entries that are softmax attention (everything else is listed and skipped)
HF_ATTENTION_TYPES = {"full_attention": "full", "sliding_attention": "sliding", "chunked_attention": "chunked"}
_HF_SKIPPED = {"linear_attention": "linear attention (a recurrent state, no softmax weights)",
               "mamba": "a state-space (Mamba) mixer, no attention weights",
               "conv": "a convolution mixer, no attention weights"}


@dataclass(frozen=True)
class LayerInfo:
    """One layer of the model: its index among all layers, its name, whether it makes a softmax attention call,
    and for those that don't, what it is instead (the reason it is skipped)."""

    index: int
    name: str
    attends: bool
    skipped: str = ""


#: how a layer that one kind shapes is named, by the kind's name (``mask.kind``)
_SHAPED = {"sliding_window": lambda m: f"sliding {m.window}", "two_sided_window": lambda m: f"local ({m.left}, {m.right})",
           "chunked": lambda m: f"chunked {m.chunk}", "strided": lambda m: f"strided {m.stride}"}
#: kinds that only take keys away from a pattern (they do not change a layer's kind)
_TAKE_AWAY = ("padding", "padding_by_position", "document")


def mask_kind(spec) -> str:
    """The layer kind one attention call's mask spec says (see the module docstring); padding and documents
    (which only take keys away from a pattern) do not change it. An ``|`` or ``~`` is one part: no single pattern."""
    if spec is None:
        return "full (bidirectional)"
    if not callable(getattr(spec, "conjuncts", None)):  # a tensor mask (bool or additive): no pattern to name
        return "dense mask"
    parts = spec.conjuncts()
    for part in parts:
        if part.kind in _SHAPED:
            return _SHAPED[part.kind](part)
        if part.kind == "custom":  # transformers' chunked layers may arrive as a named custom mask
            found = re.fullmatch(r"chunked\((\d+)\)", part.name)
            if found:
                return f"chunked {found.group(1)}"
    if any(p.kind == "causal" for p in parts):
        return "full (causal)"
    known = [p for p in parts if p.kind not in _TAKE_AWAY]
    return "full (bidirectional)" if not known else repr(spec)


def model_layers(model: nn.Module) -> list[LayerInfo] | None:
    """Every layer of ``model`` in order (see the module docstring), or None when its structure does not say."""
    blocks = getattr(model, "blocks", None)
    if isinstance(blocks, nn.ModuleList) and all(hasattr(b, "attn") for b in blocks) and len(blocks):
        from attnkit.nn import MultiHeadAttention

        return [LayerInfo(i, f"blocks.{i}.attn", isinstance(b.attn, MultiHeadAttention),
                          "" if isinstance(b.attn, MultiHeadAttention) else
                          f"{type(b.attn).__name__} (no softmax weights to show)") for i, b in enumerate(blocks)]
    config = getattr(model, "config", None)
    types = getattr(config, "layer_types", None)
    if isinstance(types, (list, tuple)) and types and all(isinstance(t, str) for t in types):
        return [LayerInfo(i, f"layer {i}", t in HF_ATTENTION_TYPES,
                          "" if t in HF_ATTENTION_TYPES else _HF_SKIPPED.get(t, f"layer type {t!r} (not softmax attention)"))
                for i, t in enumerate(types)]
    layers = getattr(config, "num_hidden_layers", None)
    if isinstance(layers, int) and layers > 0 and not getattr(config, "is_encoder_decoder", False):
        return [LayerInfo(i, f"layer {i}", True) for i in range(layers)]
    return None


def attention_layers(model: nn.Module) -> list[LayerInfo] | None:
    """The layers of :func:`model_layers` that make a softmax attention call, in call order."""
    layers = model_layers(model)
    return None if layers is None else [x for x in layers if x.attends]


__all__ = ["HF_ATTENTION_TYPES", "LayerInfo", "attention_layers", "mask_kind", "model_layers"]

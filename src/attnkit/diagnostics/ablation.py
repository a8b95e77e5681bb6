"""Head ablation and activation patching on any attnkit model, on any backend.

>>> import torch
>>> from attnkit.models.builders import build_lm
>>> from attnkit.diagnostics.ablation import ablate, patch, record_heads
>>> model = build_lm("nano").eval()
>>> a, b = torch.randint(0, 257, (2, 1, 12))
>>> with ablate(model, [(0, 1)]):               # layer 0, head 1 outputs zeros
...     logits = model(b)
>>> with record_heads(model) as rec:            # every head's output on input a
...     _ = model(a)
>>> with patch(model, [(1, 0)], rec):           # input b, with layer 1 head 0 taken from input a
...     patched = model(b)

The seam: :func:`attnkit.attention` returns each call's per-head output ``(B, H, Lq, Dv)``, the heads before
they are merged and mixed by the output projection. These context managers register an editor
(``attnkit._hooks``) that replaces the chosen heads' slices of that tensor and nothing else, so the same code
serves every backend (SDPA, flex, blocksparse, math), every attnkit model (:class:`attnkit.nn.MultiHeadAttention`,
``TransformerLM``) and Hugging Face models loaded with ``attn_implementation="attnkit"``.

Heads are ``(layer, head)`` pairs. ``layer``: for attnkit models the index of the
:class:`~attnkit.nn.MultiHeadAttention` module in ``model.named_modules()`` order (the block index of a
``TransformerLM``; linear-attention layers are not counted), found by hooks on those modules; for other models
(Hugging Face) the index of the attention call within one forward of ``model`` (a forward pre-hook on ``model``
restarts the count), which is the i-th softmax attention layer (a hybrid's linear-attention layers make no
call). ``head`` is a query head (with GQA, one of the H query heads, not a KV head). Out-of-range pairs raise a
``ValueError`` before the forward when the model's structure tells its layers (:func:`attention_layout`), else
while it runs.

In an attnkit ``model``, attention calls made outside its ``MultiHeadAttention`` modules are left alone (so
``ablate(model.blocks[3].attn, [(0, 2)])`` edits that one layer while the whole model runs). For other models
an attention call outside a forward of ``model`` can't be given a layer (another model, or activation
checkpointing recomputing a Hugging Face layer in the backward pass) and raises a ``RuntimeError``.

Shape legend: B batch, H query heads, Lq query length, Dv head dim of the values, h the chosen heads of a layer.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from attnkit import _hooks
from attnkit.errors import (
    AttnkitTypeError,
    AttnkitValueError,
    BackendUnsupportedError,
    EnvironmentUnsupportedError,
    describe,
)

MODES = ("zero", "mean")


def attention_layout(model: nn.Module) -> list[int] | None:
    """Query heads of each attention layer of ``model``, in call order, when its structure says so: its
    :class:`~attnkit.nn.MultiHeadAttention` modules, or a Hugging Face config's softmax attention layers (its
    ``layer_types`` without linear-attention layers, else ``num_hidden_layers``) x ``num_attention_heads``
    (decoder-only or encoder-only). None when unknown."""
    from attnkit.diagnostics.subjects import attnkit_attention_modules

    found = attnkit_attention_modules(model)
    if found:
        return [m.num_heads for _, m in found]
    from attnkit.diagnostics.layer_kinds import attention_layers

    config = getattr(model, "config", None)
    layers, heads = attention_layers(model), getattr(config, "num_attention_heads", None)
    if layers is not None and isinstance(heads, int):  # a hybrid's linear layers make no call: not counted
        return [heads] * len(layers)
    return None


def _pairs(heads, layout: list[int] | None) -> dict[int, list[int]]:
    """``{layer: sorted heads}`` from ``(layer, head)`` pairs, checked against ``layout`` when it is known."""
    if isinstance(heads, (str, bytes)) or not isinstance(heads, Iterable):
        raise AttnkitTypeError(f"heads must be a list of (layer, head) pairs, got {describe(heads)}; e.g. "
                               "heads=[(0, 1), (2, 3)].")
    by_layer: dict[int, set[int]] = {}
    for i, pair in enumerate(heads):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2 or not all(
                isinstance(x, int) and not isinstance(x, bool) for x in pair):
            raise AttnkitTypeError(f"heads[{i}] must be a (layer, head) pair of ints, got {describe(pair)}; e.g. "
                                   "heads=[(0, 1)] (a list of pairs, even for one head).")
        layer, head = pair
        _check_layer(layer, None if layout is None else len(layout), f"heads[{i}]")
        _check_head(layer, head, None if layout is None else layout[layer], f"heads[{i}]")
        by_layer.setdefault(layer, set()).add(head)
    return {layer: sorted(hs) for layer, hs in by_layer.items()}


def _check_layer(layer: int, n_layers: int | None, where: str) -> None:
    if layer < 0 or (n_layers is not None and layer >= n_layers):
        valid = "a layer index >= 0" if n_layers is None else f"layers 0..{n_layers - 1}"
        raise AttnkitValueError(f"{where}: layer={layer} is out of range: the model has "
                                f"{'?' if n_layers is None else n_layers} attention layers ({valid}); pick a layer "
                                "in that range.")


def _check_head(layer: int, head: int, n_heads: int | None, where: str) -> None:
    if head < 0 or (n_heads is not None and head >= n_heads):
        valid = "a head index >= 0" if n_heads is None else f"heads 0..{n_heads - 1}"
        raise AttnkitValueError(f"{where}: head={head} is out of range: layer {layer} has "
                                f"{'?' if n_heads is None else n_heads} query heads ({valid}); pick a head in that "
                                "range.")


class _HeadEditor:
    """The shared machinery: tells each attention call's layer and hands its output ``(B, H, Lq, Dv)`` with the
    layer index to :meth:`_apply`, which returns the output to use.

    The layer of a call: in a model built from :class:`~attnkit.nn.MultiHeadAttention` modules, the index of the
    module that is running (hooks on each module: right for ``model.encode``, a module called on its own, or
    a recomputed layer); otherwise the call's index within the current forward of ``model``."""

    def __init__(self, model: nn.Module, heads=()):
        if not isinstance(model, nn.Module):
            raise AttnkitTypeError(f"model must be a torch.nn.Module, got {describe(model)}; pass the model whose "
                                   "attention heads should be edited.")
        from attnkit.diagnostics.subjects import attnkit_attention_modules

        self.model = model
        self.layers = [m for _, m in attnkit_attention_modules(model)]  # empty: count calls per forward of model
        self.layout = attention_layout(model)
        self.heads = _pairs(heads, self.layout)
        self._active: list[int] = []  # the layers (or forwards of model) in progress, innermost last
        self._calls = 0  # attention calls seen in the current forward of model (no attnkit modules)
        self._handles: list = []

    def __enter__(self):
        implementation = getattr(getattr(self.model, "config", None), "_attn_implementation", None)
        if not self.layers and isinstance(implementation, str) and "attnkit" not in implementation:
            raise AttnkitValueError(
                f"{type(self.model).__name__} runs its attention with attn_implementation={implementation!r}, which "
                "attnkit can't edit; call model.set_attn_implementation('attnkit') (after import "
                "attnkit.integrations.hf) first.")
        for index, module in enumerate(self.layers or [self.model]):
            self._handles += [module.register_forward_pre_hook(self._start(index)),
                              module.register_forward_hook(self._finish, always_call=True)]
        _hooks.add_editor(self._edit)
        return self

    def __exit__(self, *exc) -> None:
        _hooks.remove_editor(self._edit)
        for handle in self._handles:
            handle.remove()
        self._handles, self._active = [], []

    def _start(self, index: int):
        def hook(module, args) -> None:
            if not self._active:
                self._calls = 0
            self._active.append(index)

        return hook

    def _finish(self, module, args, output) -> None:
        if self._active:
            self._active.pop()
        if self._active or self.layers:
            return
        if self._calls == 0 and self.heads:
            raise AttnkitValueError(
                f"no attention call of {type(self.model).__name__} went through attnkit.attention, so no head was "
                "edited; build the model from attnkit modules, or load a Hugging Face model with "
                "attn_implementation='attnkit'.")
        if self.layout is None:  # only now is the number of layers known
            for layer in self.heads:
                _check_layer(layer, self._calls, "heads")
        elif 0 < self._calls < len(self.layout):
            raise BackendUnsupportedError(
                f"{type(self.model).__name__} made {self._calls} attention calls through attnkit.attention in one "
                f"forward but has {len(self.layout)} layers (a hybrid whose other layers attend another way?), so "
                "call order is not the layer number; edit a submodule whose layers all call attnkit.attention.",
                ["fewer attention calls than layers"])

    def _edit(self, call, out: torch.Tensor) -> torch.Tensor:
        if not self._active:
            if self.layers:  # every attention module of the model is hooked: this call is not the model's
                return out
            raise EnvironmentUnsupportedError(
                f"an attention call ran outside a forward of the {type(self.model).__name__} given to "
                f"{type(self).__name__}(...) while it was active (another model, or activation checkpointing "
                "recomputing a layer in the backward pass), so its layer is unknown; run other models outside the "
                "with block and turn gradient checkpointing off.")
        if self.layers:
            layer = self._active[-1]
        else:
            layer, self._calls = self._calls, self._calls + 1
        if self.layout is not None and layer >= len(self.layout):
            raise BackendUnsupportedError(
                f"{type(self.model).__name__} made more than {len(self.layout)} attention calls in one forward but "
                f"has {len(self.layout)} attention layers (cross-attention or a layer called twice); heads are "
                "addressed by call order, which this model breaks: edit a submodule with one call per layer.",
                ["more attention calls than layers"])
        for head in self.heads.get(layer, ()):
            _check_head(layer, head, call.num_heads, "heads")
        return self._apply(layer, out)

    def _apply(self, layer: int, out: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class ablate(_HeadEditor):  # noqa: N801 - a context manager, like torch.no_grad
    """Remove chosen heads while active: their slice of the attention output is replaced before the output
    projection.

    Args:
        model: the model (any ``nn.Module`` whose attention runs through :func:`attnkit.attention`).
        heads: ``(layer, head)`` pairs; an empty list changes nothing (the outputs are bitwise unchanged).
        mode: ``"zero"``: the head outputs zeros. ``"mean"``: the head outputs, at every position of every
            sequence, a mean of its own output: without ``means``, over the ``B x Lq`` query rows of that same
            call, i.e. over every position and every batch item of the input being run (padded query rows
            included: run unpadded input for a clean mean); the mean of a later layer's head is taken with the
            earlier ablations in effect. A call with one query row (``B * Lq == 1``: KV-cached decoding of one
            token) would be its own mean, i.e. not ablated at all: it raises ``NotImplementedError``; pass
            ``means`` for it. Accumulated in float32 for float16/bfloat16 outputs.
        means: with ``mode="mean"``, a :class:`record_heads` of a reference input (a full forward): each head
            outputs its mean over that recording's ``B x Lq`` rows at every call, whatever the call's length, so
            cached decoding is ablated the same way at every step.
    """

    def __init__(self, model: nn.Module, heads, mode: str = "zero", means: record_heads | None = None):
        if mode not in MODES:
            raise AttnkitValueError(f"mode={mode!r} is not an ablation; use one of {list(MODES)}.")
        if means is not None and mode != "mean":
            raise AttnkitValueError(f"means= is used by mode='mean' only, got mode={mode!r}; drop means or pass "
                                    "mode='mean'.")
        if means is not None and not isinstance(means, record_heads):
            raise AttnkitTypeError(f"means must be a record_heads(...) of a reference input, got {describe(means)}; "
                                   "run `with record_heads(model) as means: model(reference)` first.")
        super().__init__(model, heads)
        if means is not None:
            _check_recorded(self.heads, means, "means")
        self.mode, self.means = mode, means

    def _apply(self, layer: int, out: torch.Tensor) -> torch.Tensor:
        heads = self.heads.get(layer)
        if not heads:
            return out
        idx = torch.tensor(heads, device=out.device)
        if self.mode == "zero":
            return out.index_fill(1, idx, 0.0)
        B, _, Lq, Dv = out.shape
        source = out if self.means is None else self.means.outputs[layer].to(out.device)  # (B', H, Lq', Dv)
        if self.means is None and B * Lq == 1:
            raise BackendUnsupportedError(
                f"ablate(mode='mean'): layer {layer}'s attention call has B * Lq = {B} * {Lq} = 1 query row, whose "
                "mean over the call is the row itself, so the head would not be ablated (KV-cached decoding of one "
                "token); record the means on a reference input and pass them: `with record_heads(model) as means: "
                "model(reference)`, then ablate(model, heads, mode='mean', means=means), or ablate the full forward.",
                ["mean ablation of a one-row call"])
        if source.shape[-1] != Dv:
            raise AttnkitValueError(f"means: layer {layer}'s recorded output has head dim {source.shape[-1]} but this "
                                    f"call's is {Dv}; record the means on the same model.")
        acc = torch.promote_types(out.dtype, torch.float32)
        mean = source.index_select(1, idx).mean(dim=(0, 2), keepdim=True, dtype=acc)  # (1, h, 1, Dv)
        return out.index_copy(1, idx, mean.to(out.dtype).expand(B, len(heads), Lq, Dv))  # (B, h, Lq, Dv)


def _check_recorded(heads: dict[int, list[int]], source: record_heads, name: str) -> None:
    """Refuse a recording that lacks a layer the editor needs."""
    missing = sorted(set(heads) - set(source.outputs))
    if missing:
        raise AttnkitValueError(f"{name} holds no output for layer(s) {missing} (it recorded layers "
                                f"{sorted(source.outputs)}); record a full forward of the model on the "
                                f"{'source' if name == 'source' else 'reference'} input first.")


class record_heads(_HeadEditor):  # noqa: N801
    """Record every head's output while active, changing nothing: ``outputs[layer]`` is the per-head output
    ``(B, H, Lq, Dv)`` of that layer in the last forward of ``model`` (detached), the source for :class:`patch`."""

    def __init__(self, model: nn.Module):
        super().__init__(model)
        self.outputs: dict[int, torch.Tensor] = {}

    def _apply(self, layer: int, out: torch.Tensor) -> torch.Tensor:
        self.outputs[layer] = out.detach()
        return out


class patch(_HeadEditor):  # noqa: N801
    """Activation patching: while active, the chosen heads output what they output in ``source`` (a
    :class:`record_heads` of another input), position by position; every other head runs on the current input.

    The current call must have the same ``(B, Lq, Dv)`` as the recorded one (input A and input B of the same
    length: pad or choose inputs of equal length).
    """

    def __init__(self, model: nn.Module, heads, source: record_heads):
        if not isinstance(source, record_heads):
            raise AttnkitTypeError(f"source must be a record_heads(...) of another input, got {describe(source)}; "
                                   "run `with record_heads(model) as source: model(input_a)` first.")
        super().__init__(model, heads)
        _check_recorded(self.heads, source, "source")
        self.source = source

    def _apply(self, layer: int, out: torch.Tensor) -> torch.Tensor:
        heads = self.heads.get(layer)
        if not heads:
            return out
        src = self.source.outputs[layer]  # (B, H, Lq, Dv) of the source input
        if src.shape[0] != out.shape[0] or src.shape[2:] != out.shape[2:]:
            raise AttnkitValueError(
                f"patch: layer {layer}'s recorded output has shape {tuple(src.shape)} (B, H, Lq, Dv) but this call's "
                f"is {tuple(out.shape)}; patching copies position by position, so run inputs of the same batch size "
                "and length.")
        idx = torch.tensor(heads, device=out.device)
        return out.index_copy(1, idx, src.index_select(1, idx).to(device=out.device, dtype=out.dtype))

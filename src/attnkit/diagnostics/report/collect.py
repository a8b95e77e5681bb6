"""What a report shows, gathered from a model run on one sequence: per layer the probabilities of every head,
the mask, the KV-head grouping and the per-head metrics.

Weights come from :class:`attnkit.diagnostics.capture` (any attnkit backend: fused backends are recomputed
exactly by the reference path). A Hugging Face model whose attention does not go through ``attnkit.attention``
is switched to ``attn_implementation="attnkit"`` (``attnkit.integrations.hf``) for the run, so its calls are
captured with the masks transformers built; where that can't be done it runs with ``output_attentions=True`` on
eager attention, and the mask is then the model type's (causal for decoders, none for encoders), as the report
states.

Shape legend: H query heads, Hkv key/value heads, L tokens (Lq = Lk = L, one sequence).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from attnkit.diagnostics.capture import capture
from attnkit.diagnostics.detectors import layer_scores
from attnkit.diagnostics.layer_kinds import model_layers
from attnkit.diagnostics.metrics import HealthThresholds, head_metrics
from attnkit.errors import AttnkitTypeError, AttnkitValueError, describe

METRIC_KEYS = ("entropy", "norm_entropy", "max_prob", "sink_mass", "distance", "prev_token", "masked_mass")


@dataclass
class Layer:
    """One attention layer on the sequence. ``weights`` ``(H, L, L)`` float32, ``allowed`` ``(1|H, L, L)``
    bool (True = may attend) or None (all visible), ``kv_heads`` Hkv (query head h reads KV head h // (H/Hkv))."""

    name: str
    weights: torch.Tensor
    allowed: torch.Tensor | None
    kv_heads: int
    metrics: dict[str, list[float]] = field(default_factory=dict)
    verdicts: list[str] = field(default_factory=list)
    #: what the call's mask says the layer is ("full (causal)", "sliding 4", "chunked 4", ...), "" when unknown
    kind: str = ""
    head_dim: int = 0  # D of q and k
    v_head_dim: int = 0  # Dv (MLA: differs from D)
    scale: float | None = None
    sinks: bool = False  # learned attention sinks take part of each row's mass (gpt-oss)

    @property
    def num_heads(self) -> int:
        return self.weights.shape[0]


@dataclass
class Collected:
    """Everything gathered from the run: the tokens, their labels, the layers and where the mask came from."""

    tokens: list[int]
    labels: list[str]
    layers: list[Layer]
    source: str  # "attnkit capture" or "transformers output_attentions (eager)"
    mask_note: str = ""
    #: layers that make no softmax attention call, listed with what they are instead: (name, reason)
    skipped: list[tuple[str, str]] = field(default_factory=list)


def prev_token_score(weights: torch.Tensor, allowed: torch.Tensor | None) -> list[float]:
    """Mean probability each head puts on the key just before the query, ``(H, Lq, Lk) -> H floats``, over the
    rows whose previous key is visible (NaN when none is). Reads one diagonal (keys bottom-right aligned: query
    i sits at position ``Lk - Lq + i``, its previous key is column ``Lk - Lq + i - 1``), summed in float64."""
    H, Lq, Lk = weights.shape
    offset = Lk - Lq - 1  # column - row of the previous key
    prev = torch.diagonal(weights, offset, dim1=-2, dim2=-1).double()  # (H, n): one entry per row that has one
    ok = torch.ones_like(prev, dtype=torch.bool) if allowed is None else \
        torch.diagonal(allowed.expand(H, Lq, Lk), offset, dim1=-2, dim2=-1)  # (H, n)
    n = ok.sum(-1)  # (H,)
    total = torch.where(ok, prev, torch.zeros_like(prev)).sum(-1)  # (H,)
    return torch.where(n > 0, total / n.clamp_min(1), torch.full_like(total, math.nan)).tolist()


def learned_sink_mass(weights: torch.Tensor) -> list[float]:
    """The mean probability each head's learned sink takes, ``(H, Lq, Lk) -> H floats``: what a row's weights over
    the keys leave of 1 (summed in float64)."""
    return (1 - weights.double().sum(-1)).clamp_min(0).mean(-1).tolist()


def layer_metrics(layer: Layer, thresholds: HealthThresholds) -> None:
    """Fill ``layer.metrics`` (the :func:`head_metrics` fields plus ``prev_token``) and ``layer.verdicts``."""
    allowed = None if layer.allowed is None else layer.allowed[None]  # (1, 1|H, L, L)
    m = head_metrics(layer.weights[None], allowed)
    layer.metrics = {**m.to_dict(), "prev_token": prev_token_score(layer.weights, layer.allowed)}
    if layer.sinks:
        layer.metrics["learned_sink"] = learned_sink_mass(layer.weights)
    layer.verdicts = m.verdicts(thresholds)


def _is_hf(model: nn.Module) -> bool:
    return type(model).__module__.startswith("transformers.") and hasattr(model, "config")


def _kv_heads_of(model: nn.Module, name: str, num_heads: int) -> int:
    module = dict(model.named_modules()).get(name)
    for attr in ("num_kv_heads", "num_key_value_heads"):
        value = getattr(module, attr, None) if module is not None else None
        if isinstance(value, int):
            return value
    config = getattr(model, "config", None)
    value = getattr(config, "num_key_value_heads", None) or getattr(config, "num_kv_heads", None)
    return value if isinstance(value, int) and num_heads % value == 0 else num_heads


def _hf_switch(model: nn.Module) -> tuple[str | None, str]:
    """Route a Hugging Face model's attention through attnkit (``attn_implementation="attnkit"``, so capture sees
    every call with its real mask), or through eager (the one built-in implementation that returns weights) when
    the integration can't be loaded. Returns ``(implementation to restore or None, the one used)``."""
    config = getattr(model, "config", None)
    current = getattr(config, "_attn_implementation", None)
    if not _is_hf(model) or not hasattr(model, "set_attn_implementation") or "attnkit" in str(current):
        return None, str(current)
    try:
        from attnkit.integrations.hf import NAME

        model.set_attn_implementation(NAME)
        return current, NAME
    except Exception:  # noqa: BLE001 - an architecture the integration does not serve: eager returns the weights
        if current != "eager":
            model.set_attn_implementation("eager")
        return current, "eager"


def _forward(model: nn.Module, tokens: torch.Tensor, implementation: str):
    """One forward. Through attnkit, capture sees every call and recomputes the weights of fused backends once;
    only eager attention must return them (``output_attentions``: a second copy of every layer's weights)."""
    if _is_hf(model):
        return model(input_ids=tokens, output_attentions="attnkit" not in implementation)
    return model(tokens)


def _captured_layers(model: nn.Module, cap, structure) -> list[Layer]:
    """One :class:`Layer` per attention layer capture saw (its last call), named by the model's structure."""
    layers, attending, calls = [], [x for x in structure if x.attends], cap.by_layer()
    for i, (name, records) in enumerate(calls.items()):
        if _is_hf(model) and name.startswith("call"):  # transformers' attention modules are not attnkit's:
            # the i-th call is the i-th attention layer (a hybrid's linear layers make none)
            name = attending[i].name if len(attending) == len(calls) else f"layer {i}"
        record = records[-1]  # the last call of the layer (one forward: the only one)
        allowed = record.allowed
        if allowed is not None:
            allowed = allowed[0].cpu()  # (1|H, L, L)
            if allowed.shape[-2] == 1:  # a row-broadcast mask (padding only): one row for all queries
                allowed = allowed.expand(allowed.shape[0], record.weights.shape[2], allowed.shape[-1])
        weights = record.weights[0].float().cpu()  # (H, L, L)
        layers.append(Layer(name, weights, allowed, record.kv_heads or _kv_heads_of(model, name, weights.shape[0]),
                            kind=record.kind, head_dim=record.head_dim, v_head_dim=record.v_head_dim,
                            scale=record.scale, sinks=record.sinks))
    return layers


def collect(model: nn.Module, tokens: torch.Tensor, labels: list[str], *,
            thresholds: HealthThresholds | None = None) -> Collected:
    """Run ``model`` on ``tokens (1, L)`` and gather every attention layer (see the module docstring)."""
    if not isinstance(model, nn.Module):
        raise AttnkitTypeError(f"report(model=...) must be a torch.nn.Module, got {describe(model)}.")
    thresholds = thresholds or HealthThresholds()
    was_training = model.training
    model.eval()
    restore, used = _hf_switch(model)
    try:
        with torch.no_grad(), capture(model) as cap:
            out = _forward(model, tokens, used)
    finally:
        model.train(was_training)
        if restore is not None and restore != used:
            model.set_attn_implementation(restore)
    layers, source, note = [], "attnkit capture", "the mask each attention call received"
    if _is_hf(model):
        source = f"attnkit capture (transformers attn_implementation={used!r})"
    structure = model_layers(model) or []
    layers = _captured_layers(model, cap, structure)
    skipped = [(x.name, x.skipped) for x in structure if not x.attends]
    if not layers and _is_hf(model):
        attentions = getattr(out, "attentions", None)
        if not attentions:
            raise AttnkitValueError(
                f"{type(model).__name__} returned no attention weights with output_attentions=True; load it with "
                "attn_implementation='eager' (or the attnkit implementation) to report its attention.")
        L = tokens.shape[1]
        causal = not (getattr(model.config, "model_type", "") in _hf_encoder_types()
                      or getattr(model.config, "is_encoder_decoder", False))
        allowed = torch.ones(L, L, dtype=torch.bool).tril()[None] if causal else None  # (1, L, L)
        source = "transformers output_attentions (eager)"
        note = ("causal" if causal else "none: every key visible") + " (from the model type; transformers does " \
            "not return the mask it applied)"
        for i, a in enumerate(attentions):
            weights = a[0].float().cpu()  # (H, L, L)
            layers.append(Layer(f"layer {i}", weights, allowed, _kv_heads_of(model, "", weights.shape[0]),
                                kind="full (causal)" if causal else "full (bidirectional)"))
    if not layers:
        raise AttnkitValueError(
            f"no attention calls were seen while running {type(model).__name__}: its attention does not go through "
            "attnkit.attention. Build the model from attnkit modules, or pass a Hugging Face model.")
    for layer in layers:
        layer_metrics(layer, thresholds)
        if layer.weights.shape[-1] == layer.weights.shape[-2]:  # one sequence, every query: the head detectors
            layer.metrics.update({f"det_{k}": v for k, v in layer_scores(layer.weights, tokens[0]).items()})
    return Collected(tokens[0].tolist(), labels, layers, source, note, skipped)


def _hf_encoder_types() -> set[str]:
    from attnkit.integrations.hf.folders import HF_ENCODER_TYPES

    return HF_ENCODER_TYPES

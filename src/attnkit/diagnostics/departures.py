"""What a model's config says it does on purpose that plain ``softmax(q k^T / sqrt(d)) v`` does not.

The doctor's checks hold a model to plain scaled dot-product attention; a family that departs from it by design
(Gemma's ``query_pre_attn_scalar``, Granite's ``attention_multiplier``, softcapping, attention sinks, Llama 4's
attention temperature on NoPE layers, MLA's head sizes, per-layer sliding / chunked / linear layers) would read as a
bug. Each departure is one entry of a table keyed by the config field that declares it: a reader
``reader(config, model) -> Departure | None`` registered with :func:`departure`. The checks ask :func:`departures`
what the model intends (the ``scale`` it sets, the probes that do not apply to it) and state it (INFO, naming the
field) instead of failing it; the ``departures`` check lists them all. Adding a family's departure is adding one
reader here (or anywhere, with ``@departure``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from attnkit.errors import AttnkitValueError

#: the probe names a departure may say do not apply (the checks read them)
LEFT_PADDING = "left padding"


@dataclass(frozen=True)
class Departure:
    """One intended departure: the config field that declares it, its value, and what the model does instead."""

    field: str
    value: object
    says: str
    #: the softmax scale the config intends instead of 1/sqrt(head_dim) (the ``scale`` check expects it); a tuple
    #: gives one per layer index
    scale: float | tuple[float, ...] | None = None
    #: probes of the checks that do not apply to this model, and why (``{LEFT_PADDING: "..."}``)
    untested: dict[str, str] = field(default_factory=dict)

    def line(self) -> str:
        return f"config.{self.field}={_short(self.value)}: {self.says}"

    def scale_at(self, layer: int | None) -> float | None:
        """The intended scale of layer index ``layer`` (None: this departure sets none there, or the layer is
        unknown and the scale is per layer)."""
        if not isinstance(self.scale, tuple):
            return self.scale
        return self.scale[layer] if layer is not None and 0 <= layer < len(self.scale) else None


Reader = Callable[[object, object], "Departure | None"]
READERS: dict[str, Reader] = {}


def departure(name: str):
    """Register ``reader(config, model) -> Departure | None`` under ``name`` (the config field it reads; a module
    part such as ``sinks`` when no field declares it). Returning None means the model does not depart."""
    if not isinstance(name, str) or not name:
        raise AttnkitValueError(f"departure name must be a non-empty string (the config field), got {name!r}.")

    def register(reader: Reader) -> Reader:
        READERS[name] = reader
        return reader

    return register


def departures(model) -> list[Departure]:
    """Every registered departure ``model`` declares (none for a model without a ``config``)."""
    config = getattr(model, "config", None)
    if config is None:
        return []
    found = (reader(config, model) for reader in READERS.values())
    return [d for d in found if d is not None]


def intended_scale(model) -> Departure | None:
    """The departure that sets the softmax scale, if any."""
    return next((d for d in departures(model) if d.scale is not None), None)


def untested(model, probe: str) -> list[Departure]:
    """The departures that say ``probe`` does not apply to ``model``."""
    return [d for d in departures(model) if probe in d.untested]


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _get(config, name: str):
    return getattr(config, name, None)


def _plain_scale(config) -> float | None:
    """1/sqrt(head_dim) of the config (``head_dim``, else ``hidden_size / num_attention_heads``), None if unknown."""
    D = _get(config, "head_dim")
    if not isinstance(D, int):
        E, H = _get(config, "hidden_size"), _get(config, "num_attention_heads")
        D = E // H if isinstance(E, int) and isinstance(H, int) and H > 0 else None
    return None if not D else D ** -0.5


def _departs(scale: float, config) -> bool:
    """Whether ``scale`` differs from the config's 1/sqrt(head_dim) (Gemma 2 9B: query_pre_attn_scalar = head_dim)."""
    plain = _plain_scale(config)
    return plain is None or abs(scale - plain) > 1e-6 * plain


def _layers(indices: list[int]) -> str:
    return ("layer " if len(indices) == 1 else "layers ") + ", ".join(map(str, indices))


# ------------------------------------------------------------------------------------------ the scale

@departure("query_pre_attn_scalar")
def _query_pre_attn_scalar(config, model) -> Departure | None:
    value = _get(config, "query_pre_attn_scalar")
    if not isinstance(value, (int, float)) or value <= 0 or not _departs(value ** -0.5, config):
        return None
    scale = value ** -0.5
    return Departure("query_pre_attn_scalar", value, f"scores scaled by query_pre_attn_scalar ** -0.5 = {scale:.4g} "
                     "(Gemma), not 1/sqrt(head_dim)", scale=scale)


@departure("attention_multiplier")
def _attention_multiplier(config, model) -> Departure | None:
    value = _get(config, "attention_multiplier")
    if not isinstance(value, (int, float)) or value <= 0 or not _departs(value, config):
        return None
    return Departure("attention_multiplier", value, f"scores scaled by attention_multiplier = {value:.4g} (Granite, "
                     "muP), not 1/sqrt(head_dim)", scale=float(value))


@departure("rope_parameters")
def _mla_yarn_mscale(config, model) -> Departure | None:
    """MLA (DeepSeek) folds YaRN's ``mscale_all_dim`` into the softmax scale: ``qk_head_dim ** -0.5 * mscale ** 2``."""
    rope, qk = _get(config, "rope_parameters"), _qk_head_dim(config)
    if not isinstance(rope, dict) or qk is None or not rope.get("mscale_all_dim") or \
            rope.get("rope_type", "default") == "default":
        return None
    try:
        from transformers.modeling_rope_utils import yarn_apply_mscale  # the family's own rule
    except ImportError:
        return None
    scale = float(yarn_apply_mscale(rope, qk ** -0.5))
    return Departure("rope_parameters", {k: rope[k] for k in ("rope_type", "factor", "mscale_all_dim") if k in rope},
                     f"MLA with YaRN: scores scaled by qk_head_dim ** -0.5 * mscale ** 2 = {scale:.4g} (mscale_all_dim "
                     f"{rope['mscale_all_dim']:g}, factor {rope.get('factor')}), not 1/sqrt(head_dim)", scale=scale)


@departure("scale_attn_weights")
def _gpt2_scaling(config, model) -> Departure | None:
    """GPT-2's switches: ``scale_attn_weights=False`` (no 1/sqrt(d)), ``scale_attn_by_inverse_layer_idx`` (1/(i+1))."""
    plain, inverse = _get(config, "scale_attn_weights"), _get(config, "scale_attn_by_inverse_layer_idx")
    heads, width, layers = _get(config, "n_head"), _get(config, "n_embd"), _get(config, "n_layer")
    if (plain is not False and not inverse) or not all(isinstance(v, int) for v in (heads, width, layers)):
        return None
    base = (width // heads) ** -0.5 if plain is not False else 1.0
    scales = tuple(base / (i + 1) if inverse else base for i in range(layers))
    says = ("scores not scaled by 1/sqrt(head_dim)" if plain is False else "scores scaled by 1/sqrt(head_dim)") + \
        (" and by 1/(layer index + 1)" if inverse else "")
    field = "scale_attn_weights" if plain is False else "scale_attn_by_inverse_layer_idx"
    return Departure(field, _get(config, field), f"{says} (GPT-2)", scale=scales)


# ------------------------------------------------------------------------------------------ the scores

@departure("attn_logit_softcapping")
def _softcap(config, model) -> Departure | None:
    cap = _get(config, "attn_logit_softcapping")
    if not cap:
        return None
    return Departure("attn_logit_softcapping", cap, f"scores softcapped to {cap:g} * tanh(s / {cap:g}) before the mask "
                     "(an implementation without softcapping can't serve it)")


@departure("final_logit_softcapping")
def _final_softcap(config, model) -> Departure | None:
    cap = _get(config, "final_logit_softcapping")
    if not cap:
        return None
    return Departure("final_logit_softcapping", cap, f"output logits softcapped to {cap:g} * tanh(x / {cap:g})")


@departure("sinks")
def _sinks(config, model) -> Departure | None:
    with_sinks = [name for name, m in model.named_modules() if "sinks" in getattr(m, "_parameters", {})]
    if not with_sinks:
        return None
    return Departure("sinks", f"{len(with_sinks)} layers", "a learned sink logit per head (attention sinks, gpt-oss): "
                     "each row gives part of its probability to no key, so rows over the keys sum to less than 1")


@departure("attn_temperature_tuning")
def _temperature(config, model) -> Departure | None:
    nope = [i for i, uses_rope in enumerate(_get(config, "no_rope_layers") or []) if not uses_rope]
    if not _get(config, "attn_temperature_tuning") or not nope:
        return None
    floor, a = _get(config, "floor_scale"), _get(config, "attn_scale")
    why = (f"NoPE {_layers(nope)} scale queries by 1 + {a:g} * log(1 + floor((i + 1) / {floor})) of the token's index "
           "i in the sequence (cache length + arange), not its position id (Llama 4)")
    return Departure("attn_temperature_tuning", True, why,
                     untested={LEFT_PADDING: f"left padding shifts the index i by design (config.attn_temperature_tuning"
                                             f", floor_scale={floor})"})


# ------------------------------------------------------------------------------------------ positions and heads

@departure("no_rope_layers")
def _nope(config, model) -> Departure | None:
    nope = [i for i, uses_rope in enumerate(_get(config, "no_rope_layers") or []) if not uses_rope]
    if not nope:
        return None
    return Departure("no_rope_layers", _get(config, "no_rope_layers"), f"{_layers(nope)} use no rotary positions (NoPE)")


def _qk_head_dim(config) -> int | None:
    """MLA's query/key head size (qk_nope_head_dim + qk_rope_head_dim), None for other attention."""
    if not isinstance(_get(config, "qk_nope_head_dim"), int):
        return None
    return _get(config, "qk_nope_head_dim") + (_get(config, "qk_rope_head_dim") or 0)


@departure("v_head_dim")
def _mla(config, model) -> Departure | None:
    v, qk = _get(config, "v_head_dim"), _qk_head_dim(config)
    if not isinstance(v, int) or not isinstance(qk, int) or v == qk:
        return None
    rank = _get(config, "kv_lora_rank")
    return Departure("v_head_dim", v, f"multi-head latent attention: query/key heads of {qk} (qk_nope_head_dim + "
                     f"qk_rope_head_dim), value heads of {v}" + (f", keys and values from a rank-{rank} latent"
                                                                 if rank else "") + "; the scale reads the q/k size")


# ------------------------------------------------------------------------------------------ layer kinds

def _kind(kind: str, config) -> str:
    if kind == "sliding_attention":
        local = _get(config, "local_attention")
        if local:  # ModernBERT: a two-sided window of local_attention keys
            return f"a two-sided window of {local} keys (local_attention)"
        return f"a sliding window of {_get(config, 'sliding_window')} keys"
    if kind == "chunked_attention":
        return f"chunks of {_get(config, 'attention_chunk_size')} tokens"
    if kind == "linear_attention":
        return "linear attention (a recurrence, no softmax attention call: the attention checks see the other layers)"
    return kind.replace("_attention", "").replace("_", " ")


@departure("layer_types")
def _layer_types(config, model) -> Departure | None:
    types = _get(config, "layer_types")
    if not types or set(types) == {"full_attention"}:
        return None
    groups: dict[str, list[int]] = {}
    for i, kind in enumerate(types):
        groups.setdefault(kind, []).append(i)
    parts = [f"{_layers(idx)}: {_kind(kind, config)}" for kind, idx in groups.items()]
    return Departure("layer_types", f"{len(types)} layers", "per-layer kinds: " + "; ".join(parts))


@departure("sliding_window")
def _sliding_everywhere(config, model) -> Departure | None:
    window = _get(config, "sliding_window")
    if not isinstance(window, int) or window <= 0 or _get(config, "layer_types") is not None:
        return None  # per-layer kinds are the layer_types entry's
    if _get(config, "use_sliding_window") is False:
        return None
    return Departure("sliding_window", window, f"every layer attends a sliding window of {window} keys")


def scale_text(d: Departure, head_dim: int, scale: float) -> str:
    """How the intended ``scale`` compares with 1/sqrt(head_dim), for the scale check's evidence."""
    return (f"{scale:.4g} set by config.{d.field}={_short(d.value)}, not 1/sqrt(d_k={head_dim}) = "
            f"{1 / math.sqrt(head_dim):.4g}: intended")


__all__ = ["Departure", "READERS", "LEFT_PADDING", "departure", "departures", "intended_scale", "untested",
           "scale_text"]

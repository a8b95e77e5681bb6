"""attnkit as a transformers attention implementation: ``attn_implementation="attnkit"``.

transformers calls ``attention_forward(module, query, key, value, attention_mask, dropout=, scaling=, ...)`` in
every attention layer of a model that follows its ``AttentionInterface``; this one forwards the call to
:func:`attnkit.attention` (``auto`` routing, ``ak.explain``, weights capture, the doctor's observers), with the
mask that :func:`attnkit.integrations.hf.masks.mask_interface` built as an ``ak.masks`` expression.

Honoured: ``scaling``, ``dropout``, GQA (k/v with fewer heads: attnkit reads head h // G, no repeat), masks of
every kind transformers builds (causal, sliding window per layer, chunked, padding left or right, packed rows,
cache offsets), ``softcap`` (Gemma 2), ``position_bias`` (an additive float bias), a user's own 4-D mask (bool:
a dense mask; float: an additive bias), ``output_attentions`` (weights from attnkit). A model feature attnkit
can't serve raises :class:`~attnkit.errors.BackendUnsupportedError` naming it; nothing is dropped silently.

Shape legend: B batch, H query heads, Hkv key/value heads, Lq/Lk lengths, D head dim.
"""

from __future__ import annotations

import torch

from attnkit import masks
from attnkit.backends import attention
from attnkit.errors import AttnkitTypeError, AttnkitValueError, BackendUnsupportedError, describe
from attnkit.integrations.hf.masks import HFMask

#: keyword arguments that change what attention computes; attnkit refuses the ones it has no form for
_REFUSED = {
    "window_size": "a (left, right) local window passed per call",
    "use_top_left_mask": "top-left aligned causal masks",
}


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask, dropout: float = 0.0, scaling: float | None = None,
                      softcap: float | None = None, is_causal: bool | None = None,
                      position_bias: torch.Tensor | None = None, s_aux: torch.Tensor | None = None,
                      sinks: torch.Tensor | None = None, **kwargs):
    """transformers' attention-function signature over :func:`attnkit.attention`.

    ``query (B, H, Lq, D)``, ``key``/``value`` ``(B, Hkv, Lk, D)`` -> ``(out (B, Lq, H, D), weights)`` with
    ``weights (B, H, Lq, Lk)`` when the model asked for ``output_attentions``, else None.
    """
    _refuse_unsupported(module, kwargs)
    sinks = s_aux if s_aux is not None else sinks  # gpt-oss: one learned sink logit per head
    full_len = key.shape[2]
    if isinstance(attention_mask, HFMask):  # eager static cache: only the keys a query can reach
        attention_mask, key, value, position_bias = _narrowed(attention_mask, key, value, position_bias)
    mask, bias, q_pos, kv_pos = _mask_and_bias(module, query, key, attention_mask, is_causal)
    if position_bias is not None:
        bias = position_bias if bias is None else bias + position_bias
    want_weights = _wants_weights(module, kwargs)
    result = attention(query, key, value, mask, bias=bias, scale=scaling, softcap=softcap,
                       dropout_p=float(dropout or 0.0), q_positions=q_pos, kv_positions=kv_pos,
                       backend=_backend_of(module), return_weights=want_weights,
                       sinks=None if sinks is None else sinks.to(query.device))
    out, weights = result if want_weights else (result, None)
    if weights is not None and weights.shape[-1] < full_len:  # the dropped keys had probability 0
        weights = torch.nn.functional.pad(weights, (0, full_len - weights.shape[-1]))  # (B, H, Lq, Lk)
    return out.transpose(1, 2).contiguous(), weights  # (B, Lq, H, D): transformers merges the heads itself


def set_backend(model: torch.nn.Module, backend: str = "auto") -> torch.nn.Module:
    """Run every attention call of ``model`` (loaded with ``attn_implementation="attnkit"``) on ``backend``
    (``"auto"``, or a name from ``ak.backends.available()``; a backend that can't serve a call raises)."""
    from attnkit.backends import get

    if backend != "auto":
        get(backend)  # unknown names fail here, not in the first forward
    for module in model.modules():
        module.attnkit_backend = backend
    return model


def _narrowed(mask: HFMask, key, value, position_bias):
    """``(mask, key, value, position_bias)`` over the first ``n`` keys when :meth:`HFMask.narrowed` finds the
    others unreachable (``key``/``value`` ``(B, Hkv, Lk, D)`` -> ``(B, Hkv, n, D)``), else as given."""
    narrow = mask.narrowed()
    if narrow is mask:
        return mask, key, value, position_bias
    if key.shape[2] != mask.kv_len:
        raise AttnkitValueError(
            f"key has {key.shape[2]} positions but the attnkit mask was built for Lk={mask.kv_len}; pass the layer "
            "the mask transformers built for its own cache layer (or the 2-D padding mask).")
    n = narrow.kv_len
    if position_bias is not None and position_bias.shape[-1] == mask.kv_len:
        position_bias = position_bias[..., :n]  # (.., Lq, n)
    return narrow, key[:, :, :n], value[:, :, :n], position_bias  # (B, Hkv, n, D)


def _mask_and_bias(module, query, key, attention_mask, is_causal):
    """``(mask, bias, q_positions, kv_positions)`` for :func:`attnkit.attention` from what the layer passed."""
    if isinstance(attention_mask, HFMask):
        mask = attention_mask.for_layers(query.shape[0])
        if isinstance(mask, masks.PreparedMask):
            return mask, None, None, None  # the prepared positions are the call's
        return mask, None, attention_mask.q_positions, attention_mask.kv_positions
    if attention_mask is None:  # a model that builds no mask: causal unless the layer says otherwise (as SDPA)
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        return (masks.causal() if causal and query.shape[2] > 1 else None), None, None, None
    if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 4:
        mask = attention_mask[..., : key.shape[2]]  # a user's 4-D mask may be sized for a static cache
        if mask.dtype == torch.bool:
            return mask, None, None, None
        if mask.dtype.is_floating_point:
            return None, mask.to(torch.float32) if query.dtype != torch.float64 else mask, None, None
    raise AttnkitTypeError(
        f"attention_mask must be what the 'attnkit' mask interface builds, None, or a 4-D bool/float tensor, got "
        f"{describe(attention_mask)}; load the model with attn_implementation='attnkit' (after importing "
        "attnkit.integrations.hf) so transformers builds its masks through attnkit.")


def _backend_of(module) -> str:
    """The backend :func:`set_backend` set on ``module``, else ``"auto"`` (read from the instance dict: a missing
    attribute costs ``nn.Module.__getattr__`` a raised and caught AttributeError, ~2 us per layer per step)."""
    backend = module.__dict__.get("attnkit_backend")
    return backend if backend is not None else getattr(type(module), "attnkit_backend", "auto")


def _wants_weights(module, kwargs: dict) -> bool:
    """The call's ``output_attentions``, else the model config's: transformers collects the weights a layer
    returns when either asks, and passes only the call's flag down (sdpa warns that it has none; attnkit has)."""
    flag = kwargs.get("output_attentions")
    if flag is None:
        config = module.__dict__.get("config")  # (a plain attribute of transformers' attention modules)
        if config is None:
            config = getattr(module, "config", None)
        # transformers' config stores the flag as ``_output_attentions`` behind a property and two
        # ``__getattribute__`` overrides (~5 us per layer per step); read it from the instance dict when it is there
        fields = _fields_of(module, config)
        flag = fields["_output_attentions"] if "_output_attentions" in fields else getattr(
            config, "output_attentions", False)
    return bool(flag)


def _fields_of(module, config) -> dict:
    """``config.__dict__`` (live: the same dict object for the config's life), kept on ``module`` per config object:
    even ``__dict__`` goes through the config's ``__getattribute__`` overrides (~1 us per layer per step)."""
    kept = module.__dict__.get("_attnkit_config_fields")
    if kept is not None and kept[0] is config:
        return kept[1]
    fields = getattr(config, "__dict__", {})
    if not torch.compiler.is_compiling():  # (nothing stored on a module while a graph is traced)
        module.__dict__["_attnkit_config_fields"] = (config, fields)
    return fields


def _refuse_unsupported(module, kwargs: dict) -> None:
    for name, feature in _REFUSED.items():
        if kwargs.get(name) is not None:
            model = type(module).__name__
            raise BackendUnsupportedError(
                f"{model} passes {name}={kwargs[name]!r} ({feature}), which attnkit's transformers integration "
                "does not translate; load this model with attn_implementation='eager' or 'sdpa'.", [feature])

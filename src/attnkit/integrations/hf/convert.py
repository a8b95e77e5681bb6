"""Converters between Hugging Face transformers models and attnkit's :class:`~attnkit.models.lm.TransformerLM`.

>>> from attnkit.integrations.hf.convert import from_hf, to_hf
>>> model = from_hf(hf_model)          # GPT-2, LLaMA, Mistral, Qwen2 (decoders) or BERT (an encoder)  # doctest: +SKIP
>>> hf_again = to_hf(model, "llama")   # a transformers model with the same weights (BERT: a BertModel)  # doctest: +SKIP

A family registered with :func:`~attnkit.integrations.hf.families.register_family` converts both ways and exports
(:func:`exportable_families`).

Every name and layout difference lives in :mod:`attnkit.integrations.hf.families`, one
:class:`~attnkit.integrations.hf.families.Family` per model type: which ``LMConfig`` fields the HF config sets, and
which attnkit parameter each HF tensor becomes. attnkit's API knows nothing of them; this module runs the conversions.

(GPT-2, LLaMA, Mistral, Qwen2, BERT: what each maps is listed there.) BERT is an encoder; its MLM head is not
part of attnkit's encoder, so ``to_hf`` gives a ``BertModel`` (its pooler carried when the source had one: attnkit's
``pool``): its ``last_hidden_state`` is ``model.encode(tokens)``, and times the word embeddings it is the attnkit
model's logits (attnkit's head is tied to the embeddings).

A config attnkit can't reproduce exactly raises :class:`~attnkit.errors.BackendUnsupportedError` naming the
field and its value (e.g. ``rope_type='dynamic'``), never a model that computes something else.

Shape legend: E hidden size, H heads, Hkv key/value heads, D head dim, F MLP hidden width.
"""

from __future__ import annotations

import warnings

import torch

from attnkit.errors import AttnkitTypeError, AttnkitValueError, BackendUnsupportedError, describe
from attnkit.integrations.hf.families import FAMILIES, Param, Tensors, family_of
from attnkit.models.config import LMConfig
from attnkit.models.lm import TransformerLM

# ------------------------------------------------------------------------------------------------ conversions


def config_from_hf(hf_config) -> LMConfig:
    """The :class:`LMConfig` of a transformers config (raises for any field attnkit can't reproduce)."""
    return LMConfig(**family_of(hf_config.model_type).config(hf_config))


#: the dropout fields of the supported families' configs (training-time only: eval outputs don't depend on them)
_DROPOUT_FIELDS = ("attention_dropout", "attn_pdrop", "resid_pdrop", "embd_pdrop", "hidden_dropout_prob",
                   "attention_probs_dropout_prob")


def source_dropout(hf_config) -> dict[str, float]:
    """The nonzero dropout rates of a transformers config, by field name."""
    return {f: float(getattr(hf_config, f)) for f in _DROPOUT_FIELDS if getattr(hf_config, f, 0.0)}


def from_hf(hf_model, *, dtype: torch.dtype | None = None) -> TransformerLM:
    """An attnkit :class:`TransformerLM` with the weights of a transformers model (``*ForCausalLM``,
    ``*LMHeadModel``, ``*Model``), in eval mode, in ``dtype`` (default: the HF model's).

    The converted model's ``dropout`` is 0: its outputs equal the HF model's in eval mode. The HF config's own
    training-time dropout rates (separate per sublayer there, one ``LMConfig.dropout`` in attnkit) are not
    carried over; a warning names them so that fine-tuning can set ``dropout`` on purpose."""
    if not hasattr(hf_model, "config") or not hasattr(hf_model, "state_dict"):
        raise AttnkitTypeError(f"hf_model must be a transformers PreTrainedModel, got {describe(hf_model)}; load "
                               "one with transformers.AutoModelForCausalLM.from_pretrained(path).")
    family = family_of(hf_model.config.model_type)
    base = hf_model.base_model.state_dict()  # names without the "model." / "transformer." prefix
    cfg = family.from_weights(config_from_hf(hf_model.config), base)  # parts the weights show (BERT's pooler)
    tensors: Tensors = {}
    for p in family.params(cfg):
        missing = [n for n in p.hf if n not in base]
        if missing:
            raise AttnkitValueError(f"{hf_model.config.model_type}: the model has no {missing[0]!r}; is it the "
                                    "family its config says?")
        tensors[p.attnkit] = torch.cat([p.to_attnkit(base[n]) for n in p.hf], dim=0)
    if not cfg.tie_embeddings:
        head = hf_model.get_output_embeddings()
        if head is None:
            raise AttnkitValueError("the model has untied output embeddings but no LM head to read them from; "
                                    "convert the *ForCausalLM class.")
        tensors["head.weight"] = head.weight
    rates = source_dropout(hf_model.config)
    if rates:
        warnings.warn(f"{hf_model.config.model_type}: the converted model has dropout 0 (eval outputs are exact); "
                      f"the Hugging Face config trains with {rates}, which attnkit's single dropout= does not "
                      "reproduce per sublayer. Set LMConfig(dropout=...) yourself before fine-tuning.", stacklevel=2)
    model = TransformerLM(cfg)
    dtype = dtype or next(hf_model.parameters()).dtype
    model.to(dtype)
    _load_exact(model, tensors)
    return model.eval()


def to_hf_state_dict(model: TransformerLM, model_type: str) -> Tensors:
    """The state dict of the transformers ``*ForCausalLM`` of ``model_type`` (BERT: ``BertModel``) holding
    ``model``'s weights."""
    family = family_of(model_type)
    if family.causal_lm is None:
        raise BackendUnsupportedError(f"model_type={model_type!r} is converted one way (into attnkit); to_hf "
                                      f"supports {sorted(t for t, f in FAMILIES.items() if f.causal_lm)}.",
                                      [model_type])
    cfg = model.config
    ours = model.state_dict()
    prefix = family.prefix
    out: Tensors = {}
    for p in family.params(cfg):
        value = ours[p.attnkit]
        sizes = _split_sizes(cfg, p)
        for name, piece in zip(p.hf, value.split(sizes, dim=0) if len(p.hf) > 1 else (value,)):
            out[prefix + name] = p.to_hf(piece).clone()
    if family.lm_head:
        out["lm_head.weight"] = ours["head.weight"].clone()
    return out


def exportable_families() -> list[str]:
    """The registered model types that ``to_hf`` writes (a transformers class and a config builder), in
    registration order: the order a trained model is matched against them."""
    return [name for name, f in FAMILIES.items() if f.causal_lm and f.hf_config]


def attnkit_outputs(model: TransformerLM, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every output of ``model`` an export must reproduce: ``logits`` (B, L, V), and ``pooler_output`` (B, E)
    when it has a pooler."""
    hidden = model.encode(tokens)  # (B, L, E)
    out = {"logits": model.head(hidden)}
    if model.config.pooler:
        out["pooler_output"] = model.pool(hidden)
    return out


def hf_outputs(hf_model, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """The same outputs of a transformers model: its ``logits`` (an encoder without a head: the last hidden
    state times the input embeddings, attnkit's tied head) and its ``pooler_output`` when it has one."""
    result = hf_model(input_ids=tokens)
    logits = getattr(result, "logits", None)
    if logits is None:  # (B, L, E) @ (E, V)
        logits = result.last_hidden_state @ hf_model.get_input_embeddings().weight.T
    out = {"logits": logits}
    if getattr(result, "pooler_output", None) is not None:
        out["pooler_output"] = result.pooler_output
    return out


def hf_config_for(model: TransformerLM, model_type: str):
    """The transformers config of ``model`` as ``model_type`` (raises when the family can't express it)."""
    family = family_of(model_type)
    if family.hf_config is None:
        raise BackendUnsupportedError(f"model_type={model_type!r} is converted one way (into attnkit).", [model_type])
    wrong = family.mismatches(model.config)
    if wrong:
        raise BackendUnsupportedError(f"the model has no exact {model_type} form: {'; '.join(wrong)}.", wrong)
    return family.hf_config(model.config, model_type)


def to_hf(model: TransformerLM, model_type: str, *, special_tokens: dict | None = None,
          generation: dict | None = None):
    """A transformers ``*ForCausalLM`` of ``model_type`` with ``model``'s weights, in eval mode (BERT: a
    ``BertModel``, with a pooler when the model has one; its ``last_hidden_state`` is ``model.encode(tokens)``).

    ``special_tokens``: ``bos_token_id`` / ``eos_token_id`` / ``pad_token_id`` written into the config (each
    given key, None included: the model's own ids, not the family's defaults); ``generation``: fields of its
    ``generation_config`` (a source's recorded ``GenerationConfig.to_diff_dict()``)."""
    import attnkit.integrations.hf  # noqa: F401  (the "attnkit" implementation, for the caller's convenience)
    from attnkit.integrations.hf._deps import transformers

    tf = transformers()
    family = family_of(model_type)
    hf_cfg = hf_config_for(model, model_type)
    for name, value in (special_tokens or {}).items():
        setattr(hf_cfg, name, value)
    hf_model = getattr(tf, family.causal_lm)(hf_cfg, **family.hf_kwargs(model.config))
    hf_model = hf_model.to(next(model.parameters()).dtype)
    missing, unexpected = hf_model.load_state_dict(to_hf_state_dict(model, model_type), strict=False)
    missing = [m for m in missing if not (m == "lm_head.weight" and model.config.tie_embeddings)]
    if missing or unexpected:
        raise AttnkitValueError(f"{model_type}: converted weights do not fit {family.causal_lm}: missing "
                                f"{missing[:5]}, unexpected {unexpected[:5]}.")
    if getattr(hf_model, "generation_config", None) is not None:
        fields = {k: v for k, v in {**(special_tokens or {}), **(generation or {})}.items()
                  if k != "transformers_version"}
        hf_model.generation_config.update(**fields)  # the model's own ids, not those of GenerationConfig()
    return hf_model.eval()


def _split_sizes(cfg: LMConfig, p: Param) -> list[int]:
    if len(p.hf) == 1:
        return []
    H, Hkv, D = cfg.num_heads, cfg.num_kv_heads or cfg.num_heads, cfg.resolved_head_dim
    return [H * D, Hkv * D, Hkv * D]  # rows of q, k, v in qkv_proj


def _load_exact(model: TransformerLM, tensors: Tensors) -> None:
    expected = {k for k in model.state_dict() if not (k == "head.weight" and model.config.tie_embeddings)}
    missing, unexpected = sorted(expected - set(tensors)), sorted(set(tensors) - expected)
    if missing or unexpected:
        raise AttnkitValueError(f"converter mapping incomplete: attnkit parameters without a source {missing[:5]}, "
                                f"sources without a parameter {unexpected[:5]}.")
    with torch.no_grad():
        params = model.state_dict()
        for name, value in tensors.items():
            if params[name].shape != value.shape:
                raise AttnkitValueError(f"{name}: converted shape {tuple(value.shape)} != attnkit's "
                                        f"{tuple(params[name].shape)}; the HF config and weights disagree.")
            params[name].copy_(value)

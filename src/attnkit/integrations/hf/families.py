"""The Hugging Face model families attnkit converts: one :class:`Family` per model type, with every name and layout
difference (which ``LMConfig`` fields the HF config sets, which attnkit parameter each HF tensor becomes, what a
model must be for the family to express it). :mod:`attnkit.integrations.hf.convert` runs the conversions; adding a
family is one :func:`register_family` call here.

- GPT-2: ``Conv1D`` weights are stored ``(in, out)`` (transposed against ``nn.Linear``); learned positions;
  tanh GELU; tied head.
- LLaMA / Mistral / Qwen2 / Qwen3 / SmolLM3: separate q/k/v projections fused into ``qkv_proj`` (rows ``[Wq; Wk; Wv]``), GQA,
  RMSNorm, SwiGLU, RoPE in Hugging Face's half-split layout (attnkit's default, so no permutation), RoPE
  scaling (``linear``, ``yarn``, ``llama3``, static ``ntk``), q/k/v biases (Qwen2), sliding windows (Mistral: every layer;
  Qwen2: the layers ``layer_types`` marks), QK-norm (Qwen3: ``LMConfig.qk_norm``), NoPE layers (SmolLM3: a
  per-layer ``LMConfig.positions``).
- Gemma-3 (``gemma3_text``, ``Gemma3ForCausalLM``; in :mod:`~attnkit.integrations.hf.gemma3`): Gemma's RMSNorm
  (``1 + weight``: ``offset_rmsnorm``),
  sandwich norms, QK-norm, GeGLU, embeddings scaled by sqrt(E), ``query_pre_attn_scalar``, two RoPE bases
  (``local_rope_base`` on the sliding-window layers).
- BERT: post-norm blocks, token-type embeddings, an embedding LayerNorm, exact GELU, the pooler when the weights
  have one (``LMConfig.pooler``); an encoder (``causal=False``).

Shape legend: E hidden size, H heads, Hkv key/value heads, D head dim, F MLP hidden width.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnkit.errors import AttnkitValueError, BackendUnsupportedError
from attnkit.models.config import LMConfig

Tensors = dict[str, torch.Tensor]


def _t(w: torch.Tensor) -> torch.Tensor:
    return w.t().contiguous()  # Conv1D (in, out) <-> Linear (out, in)


def _same(w: torch.Tensor) -> torch.Tensor:
    return w


@dataclass(frozen=True)
class Param:
    """One attnkit parameter made of one or more HF tensors (concatenated along dim 0 after ``to_attnkit``)."""

    attnkit: str
    hf: tuple[str, ...]
    to_attnkit: Callable[[torch.Tensor], torch.Tensor] = _same
    to_hf: Callable[[torch.Tensor], torch.Tensor] = _same


@dataclass(frozen=True)
class Family:
    """How one transformers model type maps onto attnkit: config fields, parameter names, the HF classes."""

    model_types: tuple[str, ...]
    config: Callable[[object], dict]  # HF config -> LMConfig fields
    params: Callable[[LMConfig], list[Param]]  # names relative to the HF base model (no "model." prefix)
    causal_lm: str | None = None  # transformers class for to_hf (None: converted one way)
    hf_config: Callable[[LMConfig, str], object] | None = None
    prefix: str = "model."  # the base model's name inside ``causal_lm`` ("" when causal_lm is the base model)
    lm_head: bool = True  # ``causal_lm`` has an ``lm_head.weight`` (BertModel has none)
    requires: tuple[tuple[str, tuple], ...] = ()  # (LMConfig field, the values the family can express), for to_hf
    weights: Callable[[LMConfig, Tensors], dict] = lambda cfg, base: {}  # LMConfig fields the HF weights show
    hf_kwargs: Callable[[LMConfig], dict] = lambda cfg: {}  # keyword arguments of ``causal_lm`` for to_hf

    def from_weights(self, cfg: LMConfig, base: Tensors) -> LMConfig:
        """``cfg`` with the parts that the base model's tensors ``base`` show (BERT: a pooler, when it has one)."""
        changes = self.weights(cfg, base)
        return cfg.replace(**changes) if changes else cfg

    def mismatches(self, cfg: LMConfig) -> list[str]:
        """``"field=value (needs ...)"`` for every LMConfig field of ``cfg`` this family can't express."""
        out = []
        for field, allowed in self.requires:
            value = getattr(cfg, field)
            values = set(value) if field in ("attention", "positions") and isinstance(value, tuple) else {value}
            if not values <= set(allowed):
                out.append(f"{field}={value!r} (needs {' or '.join(map(repr, allowed))})")
        return out


def _unsupported(model_type: str, field: str, value, fix: str) -> BackendUnsupportedError:
    return BackendUnsupportedError(f"{model_type}: {field}={value!r} has no exact attnkit form; {fix}",
                                   [f"{field}={value!r}"])


# ------------------------------------------------------------------------------------------------------ GPT-2


def _gpt2_config(c) -> dict:
    for field, ok in (("scale_attn_by_inverse_layer_idx", False), ("scale_attn_weights", True),
                      ("add_cross_attention", False)):
        if bool(getattr(c, field, ok)) != ok:
            raise _unsupported("gpt2", field, getattr(c, field), "convert a model with the default value.")
    act = {"gelu_new": "gelu", "gelu_pytorch_tanh": "gelu", "gelu": "gelu_exact", "relu": "relu"}
    if c.activation_function not in act:
        raise _unsupported("gpt2", "activation_function", c.activation_function, f"attnkit has {sorted(act)}.")
    return {"vocab_size": c.vocab_size, "embed_dim": c.n_embd, "num_layers": c.n_layer, "num_heads": c.n_head,
            "mlp_hidden": c.n_inner or 4 * c.n_embd, "max_seq_len": c.n_positions, "positions": "learned",
            "norm": "layernorm", "norm_eps": c.layer_norm_epsilon, "mlp": act[c.activation_function], "bias": True,
            "tie_embeddings": bool(c.tie_word_embeddings), "causal": True}


def _gpt2_params(cfg: LMConfig) -> list[Param]:
    out = [Param("embed.weight", ("wte.weight",)), Param("pos_embed.embedding.weight", ("wpe.weight",)),
           Param("norm.weight", ("ln_f.weight",)), Param("norm.bias", ("ln_f.bias",))]
    for i in range(cfg.num_layers):
        a, h = f"blocks.{i}.", f"h.{i}."
        out += [Param(a + "norm1.weight", (h + "ln_1.weight",)), Param(a + "norm1.bias", (h + "ln_1.bias",)),
                Param(a + "attn.qkv_proj.weight", (h + "attn.c_attn.weight",), _t, _t),  # (3E, E): rows q, k, v
                Param(a + "attn.qkv_proj.bias", (h + "attn.c_attn.bias",)),
                Param(a + "attn.out_proj.weight", (h + "attn.c_proj.weight",), _t, _t),
                Param(a + "attn.out_proj.bias", (h + "attn.c_proj.bias",)),
                Param(a + "norm2.weight", (h + "ln_2.weight",)), Param(a + "norm2.bias", (h + "ln_2.bias",)),
                Param(a + "mlp.up.weight", (h + "mlp.c_fc.weight",), _t, _t),
                Param(a + "mlp.up.bias", (h + "mlp.c_fc.bias",)),
                Param(a + "mlp.down.weight", (h + "mlp.c_proj.weight",), _t, _t),
                Param(a + "mlp.down.bias", (h + "mlp.c_proj.bias",))]
    return out


def _gpt2_hf_config(cfg: LMConfig, model_type: str):
    from transformers import GPT2Config

    act = {"gelu": "gelu_new", "gelu_exact": "gelu", "relu": "relu"}
    return GPT2Config(vocab_size=cfg.vocab_size, n_embd=cfg.embed_dim, n_layer=cfg.num_layers, n_head=cfg.num_heads,
                      n_inner=cfg.resolved_mlp_hidden, n_positions=cfg.max_seq_len, layer_norm_epsilon=cfg.norm_eps,
                      activation_function=act[cfg.mlp], tie_word_embeddings=cfg.tie_embeddings,
                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)


# ------------------------------------------------------------------------------------ LLaMA / Mistral / Qwen2

_ROPE_TYPES = ("default", "linear", "yarn", "llama3", "ntk")


def _rope_scaling(c, model_type: str) -> tuple[float, dict | None]:
    params = dict(getattr(c, "rope_parameters", None) or {})
    base = float(params.get("rope_theta", getattr(c, "rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in _ROPE_TYPES:
        raise _unsupported(model_type, "rope_type", kind, f"attnkit's RoPE scales with {_ROPE_TYPES}.")
    if float(params.get("partial_rotary_factor", 1.0)) != 1.0:
        raise _unsupported(model_type, "partial_rotary_factor", params["partial_rotary_factor"],
                           "attnkit rotates every channel of a head.")
    if kind == "default":
        return base, None
    scaling = {k: v for k, v in params.items() if k not in ("rope_theta",)}
    if kind in ("yarn", "llama3"):
        scaling.setdefault("original_max_position_embeddings",
                           getattr(c, "original_max_position_embeddings", None) or c.max_position_embeddings)
    return base, scaling


def _rope_config(c, model_type: str) -> dict:
    if getattr(c, "hidden_act", "silu") != "silu":
        raise _unsupported(model_type, "hidden_act", c.hidden_act, "attnkit's SwiGLU uses silu.")
    if getattr(c, "mlp_bias", False):
        raise _unsupported(model_type, "mlp_bias", True, "convert a model without MLP biases.")
    qkv_bias = True if model_type == "qwen2" else bool(getattr(c, "attention_bias", False))
    if model_type != "qwen2" and qkv_bias:
        raise _unsupported(model_type, "attention_bias", True,
                           "attnkit has q/k/v biases without an o_proj bias (Qwen2's layout), not LLaMA's all-four.")
    base, scaling = _rope_scaling(c, model_type)
    H = c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // H
    return {"vocab_size": c.vocab_size, "embed_dim": c.hidden_size, "num_layers": c.num_hidden_layers, "num_heads": H,
            "num_kv_heads": c.num_key_value_heads or H, "head_dim": None if head_dim * H == c.hidden_size else head_dim,
            "mlp_hidden": c.intermediate_size, "max_seq_len": c.max_position_embeddings, "positions": "rope",
            "rope_base": base, "rope_scaling": scaling, "norm": "rmsnorm", "norm_eps": c.rms_norm_eps,
            "mlp": "swiglu", "bias": False, "qkv_bias": True if qkv_bias else None,
            "tie_embeddings": bool(c.tie_word_embeddings), "causal": True, "window": _windows(c, model_type)}


def _windows(c, model_type: str):
    """Mistral: one window for every layer; Qwen2 / Qwen3 / SmolLM3: the layers ``layer_types`` marks as sliding
    (when ``use_sliding_window``)."""
    window = getattr(c, "sliding_window", None)
    if model_type == "mistral" or not window:
        return window or None
    types = list(getattr(c, "layer_types", None) or [])
    if not getattr(c, "use_sliding_window", False):
        return None
    per_layer = tuple(window if t == "sliding_attention" else None for t in types)
    if not any(per_layer):
        return None
    return per_layer[0] if len(set(per_layer)) == 1 else per_layer


def _qwen3_config(c) -> dict:
    """Qwen3: LLaMA's layout with QK-norm (an RMSNorm over each head's D on queries and keys, before RoPE)."""
    return {**_rope_config(c, "qwen3"), "qk_norm": True}


def _smollm3_config(c) -> dict:
    """SmolLM3: LLaMA's layout with NoPE layers (``no_rope_layers[i] == 0``: no RoPE on that layer)."""
    flags = list(getattr(c, "no_rope_layers", None) or [1] * c.num_hidden_layers)
    positions = tuple("rope" if flag else "none" for flag in flags)
    return {**_rope_config(c, "smollm3"), "positions": positions[0] if len(set(positions)) == 1 else positions}


def _rope_params(cfg: LMConfig) -> list[Param]:
    out = [Param("embed.weight", ("embed_tokens.weight",)), Param("norm.weight", ("norm.weight",))]
    for i in range(cfg.num_layers):
        a, h = f"blocks.{i}.", f"layers.{i}."
        qkv = tuple(h + f"self_attn.{p}_proj.weight" for p in "qkv")
        out += [Param(a + "norm1.weight", (h + "input_layernorm.weight",)),
                Param(a + "attn.qkv_proj.weight", qkv),  # (H*D + 2*Hkv*D, E): rows [Wq; Wk; Wv]
                Param(a + "attn.out_proj.weight", (h + "self_attn.o_proj.weight",)),
                Param(a + "norm2.weight", (h + "post_attention_layernorm.weight",)),
                Param(a + "mlp.gate.weight", (h + "mlp.gate_proj.weight",)),
                Param(a + "mlp.up.weight", (h + "mlp.up_proj.weight",)),
                Param(a + "mlp.down.weight", (h + "mlp.down_proj.weight",))]
        if cfg.qkv_bias:
            out.append(Param(a + "attn.qkv_proj.bias", tuple(h + f"self_attn.{p}_proj.bias" for p in "qkv")))
        if cfg.qk_norm:  # Qwen3: (D,) each
            out += [Param(a + f"attn.{n}.weight", (h + f"self_attn.{n}.weight",)) for n in ("q_norm", "k_norm")]
    return out


def _rope_hf_config(cfg: LMConfig, model_type: str):
    import transformers as tf

    windows = [cfg.layer_window(i) for i in range(cfg.num_layers)]
    if model_type == "llama" and any(windows):
        raise AttnkitValueError(f"LLaMA has no sliding window but the model has windows {windows}; convert it "
                                "as model_type='mistral' (every layer) or 'qwen2' (some layers).")
    if cfg.qkv_bias and model_type != "qwen2":
        raise AttnkitValueError(f"the model has q/k/v biases, which only Qwen2 has; use model_type='qwen2', not "
                                f"{model_type!r}.")
    if cfg.rope_style != "half":
        raise AttnkitValueError(f"rope_style={cfg.rope_style!r}: transformers rotates half-split pairs; convert the "
                                "q/k rows with attnkit.positions.convert_rope_layout(..., to='half') first.")
    rope = {"rope_type": "default", "rope_theta": cfg.rope_base, **(cfg.rope_scaling or {})}
    common = {"vocab_size": cfg.vocab_size, "hidden_size": cfg.embed_dim, "num_hidden_layers": cfg.num_layers,
              "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads or cfg.num_heads,
              "head_dim": cfg.resolved_head_dim, "intermediate_size": cfg.resolved_mlp_hidden,
              "max_position_embeddings": cfg.max_seq_len, "rms_norm_eps": cfg.norm_eps, "rope_parameters": rope,
              "tie_word_embeddings": cfg.tie_embeddings, "attention_dropout": 0.0}
    if model_type == "mistral":
        uniform = set(windows)
        if len(uniform) != 1:
            raise AttnkitValueError(f"Mistral has one window for every layer, the model has {windows}; use "
                                    "model_type='qwen2' for windows on some layers.")
        return tf.MistralConfig(**common, sliding_window=windows[0])
    if model_type in ("qwen2", "qwen3", "smollm3"):
        sliding = [w for w in windows if w]
        if len(set(sliding)) > 1:
            raise AttnkitValueError(f"{model_type} has one window size, the model has {sorted(set(sliding))}.")
        types = ["sliding_attention" if w else "full_attention" for w in windows]
        layers = {"use_sliding_window": bool(sliding), "sliding_window": sliding[0] if sliding else None,
                  "layer_types": types}
        if model_type == "smollm3":
            nope = [int(cfg.layer_positions(i) == "rope") for i in range(cfg.num_layers)]
            return tf.SmolLM3Config(**common, **layers, no_rope_layers=nope, attention_bias=False, mlp_bias=False)
        config = getattr(tf, {"qwen2": "Qwen2Config", "qwen3": "Qwen3Config"}[model_type])
        return config(**common, **layers, max_window_layers=types.index("sliding_attention") if sliding else 0,
                      **({"attention_bias": False} if model_type == "qwen3" else {}))
    return tf.LlamaConfig(**common, attention_bias=False, mlp_bias=False)


# ------------------------------------------------------------------------------------------------------- BERT


def _bert_config(c) -> dict:
    if getattr(c, "position_embedding_type", "absolute") not in (None, "absolute"):
        raise _unsupported("bert", "position_embedding_type", c.position_embedding_type,
                           "attnkit converts absolute (learned) positions.")
    if c.is_decoder:
        raise _unsupported("bert", "is_decoder", True, "convert the encoder (is_decoder=False).")
    act = {"gelu": "gelu_exact", "gelu_new": "gelu", "relu": "relu"}
    if c.hidden_act not in act:
        raise _unsupported("bert", "hidden_act", c.hidden_act, f"attnkit has {sorted(act)}.")
    return {"vocab_size": c.vocab_size, "embed_dim": c.hidden_size, "num_layers": c.num_hidden_layers,
            "num_heads": c.num_attention_heads, "mlp_hidden": c.intermediate_size,
            "max_seq_len": c.max_position_embeddings, "positions": "learned", "norm": "layernorm",
            "norm_eps": c.layer_norm_eps, "mlp": act[c.hidden_act], "bias": True, "post_norm": True,
            "type_vocab_size": c.type_vocab_size, "embed_norm": True, "causal": False, "tie_embeddings": True}


def _bert_hf_config(cfg: LMConfig, model_type: str):
    import transformers as tf

    act = {"gelu_exact": "gelu", "gelu": "gelu_new", "relu": "relu"}
    return tf.BertConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.embed_dim, num_hidden_layers=cfg.num_layers,
                         num_attention_heads=cfg.num_heads, intermediate_size=cfg.resolved_mlp_hidden,
                         max_position_embeddings=cfg.max_seq_len, type_vocab_size=cfg.type_vocab_size,
                         layer_norm_eps=cfg.norm_eps, hidden_act=act[cfg.mlp], hidden_dropout_prob=0.0,
                         attention_probs_dropout_prob=0.0)


def _bert_params(cfg: LMConfig) -> list[Param]:
    e = "embeddings."
    out = [Param("embed.weight", (e + "word_embeddings.weight",)),
           Param("pos_embed.embedding.weight", (e + "position_embeddings.weight",)),
           Param("type_embed.weight", (e + "token_type_embeddings.weight",)),
           Param("embed_norm.weight", (e + "LayerNorm.weight",)), Param("embed_norm.bias", (e + "LayerNorm.bias",))]
    for i in range(cfg.num_layers):
        a, h = f"blocks.{i}.", f"encoder.layer.{i}."
        for kind in ("weight", "bias"):
            out += [Param(a + f"attn.qkv_proj.{kind}", tuple(h + f"attention.self.{p}.{kind}"
                                                            for p in ("query", "key", "value"))),
                    Param(a + f"attn.out_proj.{kind}", (h + f"attention.output.dense.{kind}",)),
                    Param(a + f"norm1.{kind}", (h + f"attention.output.LayerNorm.{kind}",)),
                    Param(a + f"mlp.up.{kind}", (h + f"intermediate.dense.{kind}",)),
                    Param(a + f"mlp.down.{kind}", (h + f"output.dense.{kind}",)),
                    Param(a + f"norm2.{kind}", (h + f"output.LayerNorm.{kind}",))]
    if cfg.pooler:  # dense + tanh over the first token: BertModel's pooler_output
        out += [Param(f"pooler.dense.{kind}", (f"pooler.dense.{kind}",)) for kind in ("weight", "bias")]
    return out


FAMILIES: dict[str, Family] = {}


def register_family(family: Family) -> None:
    """Teach the converters a model type (one :class:`Family`; nothing else needs to change)."""
    for t in family.model_types:
        FAMILIES[t] = family


_PLAIN = (("attention", ("softmax",)), ("qk_norm", (False,)), ("pooler", (False,)), ("type_vocab_size", (0,)),
          ("embed_norm", (False,)), ("post_norm", (False,)), ("causal", (True,)), ("sandwich_norm", (False,)),
          ("embed_scale", (None,)), ("attn_scale", (None,)), ("local_rope_base", (None,)))  # what every decoder family here needs
_GPT2_NEEDS = (*_PLAIN, ("positions", ("learned",)), ("norm", ("layernorm",)), ("mlp", ("gelu", "gelu_exact", "relu")),
               ("bias", (True,)), ("num_kv_heads", (None,)), ("window", (None,)), ("head_dim", (None,)))
_ROPE_NEEDS = (*_PLAIN, ("positions", ("rope",)), ("norm", ("rmsnorm",)), ("mlp", ("swiglu",)), ("bias", (False,)))
_BERT_NEEDS = (("attention", ("softmax",)), ("qk_norm", (False,)), ("causal", (False,)), ("post_norm", (True,)),
               ("sandwich_norm", (False,)), ("embed_scale", (None,)), ("attn_scale", (None,)),
               ("embed_norm", (True,)), ("positions", ("learned",)), ("norm", ("layernorm",)), ("bias", (True,)),
               ("mlp", ("gelu", "gelu_exact", "relu")), ("num_kv_heads", (None,)), ("window", (None,)),
               ("head_dim", (None,)))

def _with(needs: tuple, **fields) -> tuple:
    """``needs`` with the allowed values of ``fields`` replaced (or added); None: any value (the family's config
    builder checks it)."""
    return (*((f, v) for f, v in needs if f not in fields), *((f, v) for f, v in fields.items() if v is not None))


register_family(Family(("gpt2",), _gpt2_config, _gpt2_params, "GPT2LMHeadModel", _gpt2_hf_config, "transformer.",
                       requires=_GPT2_NEEDS))
for _t_name, _cls, _needs in (("llama", "LlamaForCausalLM", ()), ("mistral", "MistralForCausalLM", ()),
                              ("qwen2", "Qwen2ForCausalLM", (("qkv_bias", (True,)),))):  # Qwen2 always has them
    register_family(Family((_t_name,), lambda c, _n=_t_name: _rope_config(c, _n), _rope_params, _cls,
                           _rope_hf_config, requires=(*_ROPE_NEEDS, *_needs)))
register_family(Family(("qwen3",), _qwen3_config, _rope_params, "Qwen3ForCausalLM", _rope_hf_config,
                       requires=_with(_ROPE_NEEDS, qk_norm=(True,), qkv_bias=(None, False))))
register_family(Family(("smollm3",), _smollm3_config, _rope_params, "SmolLM3ForCausalLM", _rope_hf_config,
                       requires=_with(_ROPE_NEEDS, positions=("rope", "none"), qkv_bias=(None, False))))
register_family(Family(("bert",), _bert_config, _bert_params, "BertModel", _bert_hf_config, "", lm_head=False,
                       requires=_BERT_NEEDS, weights=lambda cfg, base: {"pooler": "pooler.dense.weight" in base},
                       hf_kwargs=lambda cfg: {"add_pooling_layer": cfg.pooler}))


def family_of(model_type: str) -> Family:
    if model_type not in FAMILIES:
        raise BackendUnsupportedError(f"model_type={model_type!r} has no attnkit converter; supported: "
                                      f"{sorted(FAMILIES)} (add one with register_family).", [model_type])
    return FAMILIES[model_type]


from attnkit.integrations.hf import gemma3  # noqa: E402,F401  (registers Gemma-3: its parts live there)

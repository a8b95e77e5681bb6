"""Gemma-3 (text, ``model_type="gemma3_text"``, ``Gemma3ForCausalLM``) as a :class:`~attnkit.integrations.hf.families.Family`.

LLaMA's projections with Gemma's RMSNorm (``x / rms(x) * (1 + weight)``: ``norm="offset_rmsnorm"``), sandwich norms
(``sandwich_norm``), QK-norm, GeGLU (tanh GELU), embeddings scaled by sqrt(E) (``embed_scale``), scores by
``query_pre_attn_scalar ** -0.5`` (``attn_scale``), sliding-window layers with their own RoPE base
(``local_rope_base``) among global ones (``rope_base``, ``rope_scaling``). Softcapping and bidirectional attention
are refused by name. Registered on import (by :mod:`attnkit.integrations.hf.families`).

Shape legend: E hidden size, D head dim.
"""

from __future__ import annotations

from attnkit.errors import AttnkitValueError
from attnkit.integrations.hf.families import _PLAIN, Family, Param, _rope_scaling, _unsupported, _with, register_family
from attnkit.models.config import LMConfig


def _gemma3_config(c) -> dict:
    """Gemma-3 (text): LLaMA's projections with Gemma's RMSNorm (``1 + weight``), sandwich norms, QK-norm, GeGLU
    (tanh GELU), embeddings scaled by sqrt(E), scores by ``query_pre_attn_scalar ** -0.5``, sliding-window layers
    with their own RoPE base (``rope_parameters["sliding_attention"]``) among global ones."""
    for field, ok in (("attn_logit_softcapping", None), ("final_logit_softcapping", None),
                      ("use_bidirectional_attention", False), ("attention_bias", False)):
        if (getattr(c, field, ok) or ok) != ok:
            raise _unsupported("gemma3_text", field, getattr(c, field), "convert a model with the default value.")
    if c.hidden_activation not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise _unsupported("gemma3_text", "hidden_activation", c.hidden_activation, "attnkit's GeGLU uses tanh GELU.")
    params = dict(c.rope_parameters)
    base, scaling = _rope_scaling(_RopeView(c, params["full_attention"]), "gemma3_text")
    local, local_scaling = _rope_scaling(_RopeView(c, params["sliding_attention"]), "gemma3_text")
    if local_scaling is not None:
        raise _unsupported("gemma3_text", "rope_parameters['sliding_attention']", params["sliding_attention"],
                           "attnkit scales the global layers' RoPE only.")
    windows = tuple(c.sliding_window if t == "sliding_attention" else None for t in c.layer_types)
    H = c.num_attention_heads
    return {"vocab_size": c.vocab_size, "embed_dim": c.hidden_size, "num_layers": c.num_hidden_layers, "num_heads": H,
            "num_kv_heads": c.num_key_value_heads, "head_dim": None if c.head_dim * H == c.hidden_size else c.head_dim,
            "mlp_hidden": c.intermediate_size, "max_seq_len": c.max_position_embeddings, "positions": "rope",
            "rope_base": base, "rope_scaling": scaling, "local_rope_base": local if any(windows) else None,
            "norm": "offset_rmsnorm", "norm_eps": c.rms_norm_eps, "mlp": "geglu", "bias": False, "qk_norm": True,
            "sandwich_norm": True, "embed_scale": float(c.hidden_size) ** 0.5,
            "attn_scale": float(c.query_pre_attn_scalar) ** -0.5, "tie_embeddings": bool(c.tie_word_embeddings),
            "causal": True, "window": (windows[0] if len(set(windows)) == 1 else windows) if any(windows) else None}


class _RopeView:
    """A config seen through one layer type's ``rope_parameters`` (what :func:`_rope_scaling` reads)."""

    def __init__(self, c, params: dict):
        self.rope_parameters, self.max_position_embeddings = params, c.max_position_embeddings


def _gemma3_params(cfg: LMConfig) -> list[Param]:
    out = [Param("embed.weight", ("embed_tokens.weight",)), Param("norm.weight", ("norm.weight",))]
    for i in range(cfg.num_layers):
        a, h = f"blocks.{i}.", f"layers.{i}."
        out += [Param(a + "norm1.weight", (h + "input_layernorm.weight",)),
                Param(a + "attn.qkv_proj.weight", tuple(h + f"self_attn.{p}_proj.weight" for p in "qkv")),
                Param(a + "attn.out_proj.weight", (h + "self_attn.o_proj.weight",)),
                Param(a + "attn.q_norm.weight", (h + "self_attn.q_norm.weight",)),
                Param(a + "attn.k_norm.weight", (h + "self_attn.k_norm.weight",)),
                Param(a + "attn_out_norm.weight", (h + "post_attention_layernorm.weight",)),
                Param(a + "norm2.weight", (h + "pre_feedforward_layernorm.weight",)),
                Param(a + "mlp_out_norm.weight", (h + "post_feedforward_layernorm.weight",)),
                Param(a + "mlp.gate.weight", (h + "mlp.gate_proj.weight",)),
                Param(a + "mlp.up.weight", (h + "mlp.up_proj.weight",)),
                Param(a + "mlp.down.weight", (h + "mlp.down_proj.weight",))]
    return out


def _gemma3_hf_config(cfg: LMConfig, model_type: str):
    import transformers as tf

    E, D = cfg.embed_dim, cfg.resolved_head_dim
    wrong = []
    if cfg.embed_scale != float(E) ** 0.5:
        wrong.append(f"embed_scale={cfg.embed_scale!r} (needs sqrt(embed_dim) = {float(E) ** 0.5!r})")
    scalar = (cfg.attn_scale if cfg.attn_scale is not None else D ** -0.5) ** -2
    if abs(scalar - round(scalar)) > 1e-6 * scalar:
        wrong.append(f"attn_scale={cfg.attn_scale!r} (needs q ** -0.5 for an integer query_pre_attn_scalar q)")
    windows = [cfg.layer_window(i) for i in range(cfg.num_layers)]
    sliding = sorted({w for w in windows if w})
    if len(sliding) > 1:
        wrong.append(f"window={cfg.window!r} (Gemma-3 has one window size)")
    if wrong:
        raise AttnkitValueError(f"the model has no exact gemma3_text form: {'; '.join(wrong)}.")
    local = cfg.local_rope_base if cfg.local_rope_base is not None else cfg.rope_base
    rope = {"full_attention": {"rope_type": "default", "rope_theta": cfg.rope_base, **(cfg.rope_scaling or {})},
            "sliding_attention": {"rope_type": "default", "rope_theta": local}}
    return tf.Gemma3TextConfig(
        vocab_size=cfg.vocab_size, hidden_size=E, intermediate_size=cfg.resolved_mlp_hidden,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads or cfg.num_heads, head_dim=D, hidden_activation="gelu_pytorch_tanh",
        max_position_embeddings=cfg.max_seq_len, rms_norm_eps=cfg.norm_eps, tie_word_embeddings=cfg.tie_embeddings,
        rope_parameters=rope, query_pre_attn_scalar=round(scalar), sliding_window=sliding[0] if sliding else None,
        layer_types=["sliding_attention" if w else "full_attention" for w in windows], attention_dropout=0.0)


register_family(Family(("gemma3_text",), _gemma3_config, _gemma3_params, "Gemma3ForCausalLM", _gemma3_hf_config,
                       requires=_with(_PLAIN, positions=("rope",), norm=("offset_rmsnorm",), mlp=("geglu",),
                                      bias=(False,), qkv_bias=(None, False), qk_norm=(True,), sandwich_norm=(True,),
                                      embed_scale=None, attn_scale=None, local_rope_base=None)))

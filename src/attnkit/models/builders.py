"""Builders for :class:`~attnkit.models.lm.TransformerLM`: named presets and the encoder variant.

>>> from attnkit.models.builders import build_lm
>>> model = build_lm("tiny", positions="alibi", num_kv_heads=2)   # any LMConfig field overrides the preset
>>> enc = build_encoder("tiny")                                  # same stack, bidirectional, padding masks

Presets (byte-level vocabulary of 257 by default):

========  =========  ==========  =========  ===========  ===========  ==========================================
preset    embed_dim  num_layers  num_heads  max_seq_len   params      parts
========  =========  ==========  =========  ===========  ===========  ==========================================
nano             64           2          2          128        ~0.1 M  attnkit's original: LayerNorm, GELU, RoPE
tiny            128           4          4          256        ~0.8 M  LLaMA's exact form: RMSNorm, SwiGLU, RoPE
small           384           6          6          512       ~10.8 M  attnkit's original
medium          768          12         12         1024       ~85 M    attnkit's original
========  =========  ==========  =========  ===========  ===========  ==========================================

``tiny`` (``make demo``'s model) is in LLaMA's exact form (:data:`LLAMA_PARTS`; the SwiGLU width 344 = 2.6875 x E
~ 8/3 x E keeps the MLP's parameters and FLOPs those of GELU's 4 x E), so a trained run exports: ``attnkit export
runs/demo --hf out`` writes a ``LlamaForCausalLM`` that transformers' ``pipeline("text-generation")`` runs with the
run's byte tokenizer. Against the original parts, trained side by side on the same batches
(``benchmarks/demo_forms.py``; what it measured: ``benchmarks/README.md``). Any preset takes the parts as overrides:
``build_lm("small", **LLAMA_PARTS, mlp_ratio=2.6875)``.
"""

from __future__ import annotations

from attnkit.errors import AttnkitTypeError, AttnkitValueError
from attnkit.models.config import RENAMED_FIELDS
from attnkit.models.lm import LMConfig, TransformerLM

#: LLaMA's parts (RMSNorm, SwiGLU, RoPE, no biases): a model with them exports as ``LlamaForCausalLM``
LLAMA_PARTS = {"norm": "rmsnorm", "mlp": "swiglu", "positions": "rope", "bias": False}

PRESETS: dict[str, dict] = {
    "nano": {"embed_dim": 64, "num_layers": 2, "num_heads": 2, "max_seq_len": 128},
    "tiny": {"embed_dim": 128, "num_layers": 4, "num_heads": 4, "max_seq_len": 256, **LLAMA_PARTS,
             "mlp_ratio": 2.6875},  # F = 344 at E = 128
    "small": {"embed_dim": 384, "num_layers": 6, "num_heads": 6, "max_seq_len": 512},
    "medium": {"embed_dim": 768, "num_layers": 12, "num_heads": 12, "max_seq_len": 1024},
}


def lm_config(preset: str = "tiny", **overrides) -> LMConfig:
    """The :class:`LMConfig` of a preset with any field overridden (``None`` values are ignored)."""
    if preset not in PRESETS:
        raise AttnkitValueError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}.")
    old = sorted(set(overrides) & set(RENAMED_FIELDS))
    if old:
        raise AttnkitTypeError(f"LMConfig fields were renamed: pass {', '.join(f'{RENAMED_FIELDS[o]}=' for o in old)} "
                               f"instead of {', '.join(f'{o}=' for o in old)} (got {old}).")
    return LMConfig(**{**PRESETS[preset], **{k: v for k, v in overrides.items() if v is not None}})


def build_lm(preset: str = "tiny", **overrides) -> TransformerLM:
    """A decoder-only :class:`TransformerLM` from a preset (see the module table) and field overrides."""
    return TransformerLM(lm_config(preset, **overrides))


def build_encoder(preset: str = "tiny", **overrides) -> TransformerLM:
    """The same stack as a bidirectional encoder (``causal=False``): call ``model.encode(tokens,
    key_is_real=...)`` for hidden states ``(B, L, E)`` or ``embed_sequences`` for one vector per sequence."""
    return TransformerLM(lm_config(preset, **{**overrides, "causal": False, "window": None}))


def embed_sequences(encoder: TransformerLM, tokens, key_is_real=None):
    """Mean of the real tokens' final hidden states: ``(B, L) -> (B, E)`` (for classification / retrieval)."""
    hidden = encoder.encode(tokens, key_is_real=key_is_real)  # (B, L, E)
    if key_is_real is None:
        return hidden.mean(dim=1)
    weights = key_is_real.to(hidden.dtype)[..., None]  # (B, L, 1)
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp_min(1.0)  # (B, E)

"""``LMConfig``: the serialised form of a :class:`~attnkit.models.lm.TransformerLM` (checkpoints store it as JSON).

Every field has a default that reproduces the original attnkit GPT (pre-norm LayerNorm, tanh-GELU MLP, RoPE,
tied head), so configs written before a field existed still load and build the same model. The fields name
the choices real families need; :func:`attnkit.models.blocks.block_from_config` turns them into parts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

from attnkit._checks import positive_int
from attnkit.errors import AttnkitValueError

POSITIONS = ("rope", "alibi", "sinusoidal", "learned", "none")
#: the schemes that live inside a layer's attention: a per-layer ``positions`` tuple takes these (SmolLM3's NoPE
#: layers: ``("rope", "rope", "rope", "none")``); the embedding tables (sinusoidal, learned) are one for the model
LAYER_POSITIONS = ("rope", "alibi", "none")
ROPE_STYLES = ("half", "interleaved")
#: fields renamed to the glossary's names (issue 20): old name -> new name. Configs written before the rename
#: (checkpoints, config.json, a run's saved model overrides) still load; writing uses the new names only.
RENAMED_FIELDS = {"dim": "embed_dim", "n_layers": "num_layers", "n_heads": "num_heads",  # rename-lmconfig: skip
                  "n_kv_heads": "num_kv_heads"}  # rename-lmconfig: skip


def renamed_fields(data: dict) -> dict:
    """``data`` (LMConfig fields by name) with each old field name of :data:`RENAMED_FIELDS` replaced by its new
    name; a key given under both names is refused."""
    both = sorted(old for old, new in RENAMED_FIELDS.items() if old in data and new in data)
    if both:
        raise AttnkitValueError(f"LMConfig fields {both} are given under both their old and new names "
                                f"({', '.join(f'{o} -> {RENAMED_FIELDS[o]}' for o in both)}); keep only the new one.")
    return {RENAMED_FIELDS.get(key, key): value for key, value in data.items()}


@dataclass(frozen=True)
class LMConfig:
    """Everything that defines a :class:`TransformerLM` (JSON-serialisable).

    Shape and stack: ``vocab_size``, ``embed_dim`` (E), ``num_layers``, ``num_heads`` (H), ``num_kv_heads`` (Hkv, GQA),
    ``head_dim`` (D, default E // H), ``mlp_ratio`` or ``mlp_hidden`` (F), ``max_seq_len``.

    Parts: ``norm`` ("layernorm" | "rmsnorm", :data:`attnkit.nn.norms.NORMS`) with ``norm_eps``; ``mlp``
    ("gelu" = tanh GELU, "gelu_exact", "relu", "swiglu", "geglu", :data:`attnkit.nn.mlp.MLPS`); ``post_norm``
    (BERT: ``norm(x + f(x))``, and no final norm); ``bias`` (every Linear and LayerNorm) with ``qkv_bias``
    overriding it for q/k/v (Qwen2); ``qk_norm`` (a ``norm`` over D on each query and key head).

    Positions: ``positions`` ("rope", "alibi" inside attention; "sinusoidal", "learned" added to the
    embeddings; "none"), or one of :data:`LAYER_POSITIONS` per layer (NoPE layers among RoPE ones: SmolLM3);
    RoPE's ``rope_base`` (rope_theta), ``rope_scaling`` (a Hugging Face style dict, e.g. ``{"rope_type": "yarn",
    "factor": 4.0, "original_max_position_embeddings": 4096}``) and ``rope_style``.

    Masks: ``causal`` (decoder) or bidirectional (encoder); ``window`` = a sliding window of that many keys on
    every layer, or a tuple with one entry (int or None = full causal) per layer (Mistral: all; Gemma-2:
    alternating). Embeddings: ``type_vocab_size`` > 0 adds token-type embeddings (BERT: 2); ``embed_norm``
    normalises the summed embeddings (BERT); ``pooler`` adds BERT's pooler (dense + tanh over the first token's
    final hidden state: ``model.pool(hidden)``, ``(B, L, E) -> (B, E)``). ``attention`` is one layer kind for all
    layers or one per layer (names from :data:`attnkit.models.blocks.ATTENTION_LAYERS`).

    Gemma-3's parts: ``sandwich_norm`` adds a norm on each sublayer's output before the residual add
    (``x + norm(attn(norm1(x)))``); ``embed_scale`` multiplies the token embeddings (Gemma: sqrt(E));
    ``attn_scale`` is the score scale (default 1/sqrt(D); Gemma: ``query_pre_attn_scalar ** -0.5``);
    ``local_rope_base`` is the RoPE base of the sliding-window layers (without scaling), ``rope_base`` and
    ``rope_scaling`` then those of the others.
    """

    vocab_size: int = 257
    embed_dim: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int | None = None
    mlp_ratio: float = 4.0
    max_seq_len: int = 256
    positions: str | tuple[str, ...] = "rope"
    window: int | tuple[int | None, ...] | None = None
    causal: bool = True
    backend: str = "auto"
    dropout: float = 0.0
    bias: bool = False
    tie_embeddings: bool = True
    init_std: float = 0.02
    attention: str | tuple[str, ...] = "softmax"
    head_dim: int | None = None
    mlp_hidden: int | None = None
    norm: str = "layernorm"
    norm_eps: float = 1e-5
    mlp: str = "gelu"
    post_norm: bool = False
    qkv_bias: bool | None = None
    qk_norm: bool = False
    rope_base: float = 10000.0
    rope_scaling: dict | None = None
    rope_style: str = "half"
    type_vocab_size: int = 0
    embed_norm: bool = False
    pooler: bool = False
    sandwich_norm: bool = False
    embed_scale: float | None = None
    attn_scale: float | None = None
    local_rope_base: float | None = None

    def __post_init__(self):
        from attnkit.nn.mlp import MLPS
        from attnkit.nn.norms import NORMS

        for name in ("vocab_size", "embed_dim", "num_layers", "num_heads", "max_seq_len"):
            positive_int(getattr(self, name), name)
        for name in ("head_dim", "mlp_hidden", "num_kv_heads"):
            if getattr(self, name) is not None:
                positive_int(getattr(self, name), name)
        if isinstance(self.positions, list):
            object.__setattr__(self, "positions", tuple(self.positions))  # JSON gives lists
        if isinstance(self.positions, tuple):
            if len(self.positions) != self.num_layers or not set(self.positions) <= set(LAYER_POSITIONS):
                raise AttnkitValueError(f"positions={self.positions!r}: a per-layer tuple needs one of "
                                        f"{LAYER_POSITIONS} for each of the num_layers={self.num_layers} layers; or "
                                        "give one scheme for the model.")
        elif self.positions not in POSITIONS:
            raise AttnkitValueError(f"positions must be one of {POSITIONS}, got {self.positions!r}; 'rope' is the default.")
        if self.norm not in NORMS:
            raise AttnkitValueError(f"norm must be one of {sorted(NORMS)}, got {self.norm!r}.")
        if self.mlp not in MLPS:
            raise AttnkitValueError(f"mlp must be one of {sorted(MLPS)}, got {self.mlp!r}.")
        if self.rope_style not in ROPE_STYLES:
            raise AttnkitValueError(f"rope_style must be one of {ROPE_STYLES}, got {self.rope_style!r}.")
        if self.type_vocab_size < 0:
            raise AttnkitValueError(f"type_vocab_size must be >= 0, got {self.type_vocab_size}; 0 = no token types.")
        if not 0.0 <= self.dropout < 1.0:
            raise AttnkitValueError(f"dropout must be in [0, 1), got {self.dropout}; use e.g. 0.1, or 0.0.")
        for name in ("attention", "window"):
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))  # JSON gives lists
        kinds = (self.attention,) * self.num_layers if isinstance(self.attention, str) else self.attention
        if len(kinds) != self.num_layers:
            raise AttnkitValueError(f"attention has {len(kinds)} entries but num_layers={self.num_layers}; give one kind "
                                    "for all layers or one per layer.")
        if isinstance(self.window, tuple) and len(self.window) != self.num_layers:
            raise AttnkitValueError(f"window has {len(self.window)} entries but num_layers={self.num_layers}; give one "
                                    "window for all layers or one per layer (None = full causal).")
        for i in range(self.num_layers):
            w = self.layer_window(i)
            if w is not None:
                positive_int(w, "window")
                if not self.causal:
                    raise AttnkitValueError(f"window={w} needs causal=True (a sliding window is causal); drop "
                                            "window for a bidirectional encoder.")

    def layer_kind(self, index: int) -> str:
        return self.attention if isinstance(self.attention, str) else self.attention[index]

    def layer_positions(self, index: int) -> str:
        """The position scheme of layer ``index`` (the model's, or its entry of a per-layer tuple)."""
        return self.positions if isinstance(self.positions, str) else self.positions[index]

    def layer_window(self, index: int) -> int | None:
        """The sliding window of layer ``index`` (None = full causal / bidirectional)."""
        return self.window[index] if isinstance(self.window, tuple) else self.window

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim or self.embed_dim // self.num_heads

    @property
    def resolved_mlp_hidden(self) -> int:
        return self.mlp_hidden or int(self.mlp_ratio * self.embed_dim)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> LMConfig:
        """The config ``data`` describes; old field names (:data:`RENAMED_FIELDS`) are read as the new ones."""
        data = renamed_fields(data)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise AttnkitValueError(f"unknown LMConfig fields {unknown}; known fields are {sorted(known)}.")
        return cls(**data)

    def replace(self, **changes) -> LMConfig:
        return replace(self, **changes)

"""Rotary position embeddings (RoPE, Su et al. 2021) with long-context scaling and a layout converter.

RoPE rotates pairs of channels of every query and key by an angle ``position * inv_freq[i]``, so the score
``q_m . k_n`` depends on positions only through ``m - n``. Channel pair ``i`` (0 <= i < D/2) turns with
``inv_freq[i] = base ** (-2i / D)``.

Pairing styles (docs/conventions.md):

- ``"half"`` (default; LLaMA, Hugging Face ``rotate_half``): pair ``i`` is ``(x[i], x[i + D/2])``.
- ``"interleaved"`` (GPT-J, the original RoFormer, Meta's LLaMA checkpoints): pair ``i`` is ``(x[2i], x[2i+1])``.

The two styles give the same model up to a permutation of the q/k projection rows; :func:`convert_rope_layout`
applies it. Scaling for contexts beyond the trained length is a frozen dataclass (:class:`LinearScaling`,
:class:`NTKScaling`, :class:`YaRNScaling`, :class:`Llama3Scaling`) or a Hugging Face style
``rope_scaling``/``rope_parameters`` dict.

Precision: angles, cos/sin and the rotation are computed in float32 (float64 when ``x`` is float64) and the
result is cast back to ``x.dtype``. float32 angles are exact for positions below 2**24; their error grows like
``position * eps``, as in every float32 RoPE.

Shape legend: B batch, H heads, L length, D head_dim (even), E = num_heads * head_dim rows of a projection.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from attnkit._checks import integer, number, position_ids
from attnkit.errors import AttnkitTypeError, AttnkitValueError, describe

_STYLES = ("half", "interleaved")


# --------------------------------------------------------------------------------------------- scaling configs


@dataclass(frozen=True)
class LinearScaling:
    """Position interpolation (Chen et al. 2023): angles of position ``p`` are those of ``p / factor``.

    Implemented as ``inv_freq / factor`` (the same product, as Hugging Face's ``"linear"`` rope type does).
    """

    factor: float

    def __post_init__(self):
        number(self.factor, "LinearScaling.factor", low=1.0,
                      fix="use factor = target context length / trained context length (>= 1).")


@dataclass(frozen=True)
class NTKScaling:
    """NTK-aware scaling (bloc97 2023): a larger base, ``base * factor ** (D / (D - 2))``.

    High frequencies are almost unchanged, the lowest frequency is interpolated by ``factor``. With D == 2 the
    only frequency is ``base ** 0 == 1`` whatever the base, so the scaling has no effect there.
    """

    factor: float

    def __post_init__(self):
        number(self.factor, "NTKScaling.factor", low=1.0,
                      fix="use factor = target context length / trained context length (>= 1).")

    def effective_base(self, base: float, head_dim: int) -> float:
        """The NTK-aware base ``base * factor ** (D / (D - 2))`` (``base`` itself when D == 2)."""
        return base if head_dim == 2 else base * self.factor ** (head_dim / (head_dim - 2))


@dataclass(frozen=True)
class YaRNScaling:
    """YaRN (Peng et al. 2023), as Hugging Face's ``_compute_yarn_parameters``.

    Pairs that turn more than ``beta_fast`` times over ``original_max_positions`` keep their frequency
    (extrapolation); pairs that turn fewer than ``beta_slow`` times are interpolated (``inv_freq / factor``);
    a linear ramp over the pair index blends the two in between. The ramp ends are
    ``floor``/``ceil`` of ``D * ln(original_max_positions / (2 pi beta)) / (2 ln base)`` when ``truncate``
    (Hugging Face's default), clamped to ``[0, D - 1]``. cos and sin are multiplied by ``attention_factor``,
    by default ``0.1 * ln(factor) + 1`` (1 when factor <= 1), which scales every score by its square.
    """

    factor: float
    original_max_positions: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    truncate: bool = True

    def __post_init__(self):
        _check_extension(self, "e.g. 4096")
        _check_band(self, "beta_slow", "beta_fast", fix="use the paper's defaults beta_fast=32, beta_slow=1.")
        if self.attention_factor is not None:
            number(self.attention_factor, "YaRNScaling.attention_factor", low=0.0, low_open=True,
                          fix="omit it for the default 0.1 * ln(factor) + 1.")

    @property
    def mscale(self) -> float:
        """The factor multiplied into cos and sin."""
        if self.attention_factor is not None:
            return float(self.attention_factor)
        return _yarn_mscale(self.factor)

    def ramp_bounds(self, base: float, head_dim: int) -> tuple[float, float]:
        """``(low, high)`` pair indices where the ramp from extrapolation to interpolation starts and ends."""

        def correction_dim(num_rotations: float) -> float:
            return head_dim * math.log(self.original_max_positions / (num_rotations * 2 * math.pi)) / (
                2 * math.log(base))

        low, high = correction_dim(self.beta_fast), correction_dim(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        return max(low, 0), min(high, head_dim - 1)


@dataclass(frozen=True)
class Llama3Scaling:
    """LLaMA 3.1's frequency-dependent interpolation, as Hugging Face's ``_compute_llama3_parameters``.

    With ``wavelength = 2 pi / inv_freq``: pairs whose wavelength is shorter than
    ``original_max_positions / high_freq_factor`` keep their frequency; pairs longer than
    ``original_max_positions / low_freq_factor`` are interpolated (``inv_freq / factor``); in between,
    ``s = (original_max_positions / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)``
    blends them: ``(1 - s) * inv_freq / factor + s * inv_freq``. No attention factor (cos and sin unscaled).
    """

    factor: float
    original_max_positions: int
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0

    def __post_init__(self):
        _check_extension(self, "LLaMA 3.1: factor 8 of 8192")
        _check_band(self, "low_freq_factor", "high_freq_factor",
                    fix="use LLaMA 3.1's low_freq_factor=1, high_freq_factor=4.")

    def scale(self, inv_freq: torch.Tensor) -> torch.Tensor:
        """The scaled inverse frequencies ``(D/2,)`` of unscaled ``inv_freq`` ``(D/2,)``."""
        wavelength = 2 * math.pi / inv_freq  # (D/2,)
        smooth = ((self.original_max_positions / wavelength - self.low_freq_factor)
                  / (self.high_freq_factor - self.low_freq_factor)).clamp(0, 1)  # (D/2,) 0: interpolate, 1: keep
        # clamp reproduces HF's three cases: s >= 1 exactly where wavelength <= original / high_freq_factor (keep),
        # s <= 0 where wavelength >= original / low_freq_factor (interpolate)
        return (1 - smooth) * inv_freq / self.factor + smooth * inv_freq


def _check_extension(scaling, example: str) -> None:
    """``factor >= 1`` and an int ``original_max_positions >= 1`` of a context-extension scaling dataclass."""
    cls = type(scaling).__name__
    number(scaling.factor, f"{cls}.factor", low=1.0,
           fix=f"use factor = target context length / original_max_positions (>= 1; {example}).")
    integer(scaling.original_max_positions, f"{cls}.original_max_positions", low=1,
            fix=f"give the context length the model was trained with ({example}).")


def _check_band(scaling, low: str, high: str, *, fix: str) -> None:
    """Two positive fields with ``low < high`` (YaRN's beta_slow/beta_fast, Llama 3's low/high_freq_factor)."""
    cls = type(scaling).__name__
    lo, hi = (number(getattr(scaling, name), f"{cls}.{name}", low=0.0, low_open=True, fix=fix) for name in (low, high))
    if hi <= lo:
        raise AttnkitValueError(f"{cls}.{high} must be greater than {low}, got {high}={hi}, {low}={lo}; {fix}")


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


RopeScaling = LinearScaling | NTKScaling | YaRNScaling | Llama3Scaling

_DICT_KEYS = {"type", "rope_type", "factor", "rope_theta", "partial_rotary_factor", "original_max_position_embeddings",
              "original_max_positions", "beta_fast", "beta_slow", "attention_factor", "mscale", "mscale_all_dim",
              "truncate", "low_freq_factor", "high_freq_factor"}


def scaling_from_dict(params: Mapping, base: float) -> RopeScaling | None:
    """Convert a Hugging Face ``rope_scaling`` / ``rope_parameters`` dict to a scaling dataclass.

    Accepts ``"type"`` or ``"rope_type"`` in ``default``, ``linear``, ``ntk`` (static NTK-aware), ``yarn`` and
    ``llama3``;
    ``rope_theta``, when present, must equal ``base``. Keys whose value is ``None`` count as absent.
    """
    params = {key: value for key, value in params.items() if value is not None}
    unknown = sorted(set(params) - _DICT_KEYS)
    if unknown:
        raise AttnkitValueError(f"scaling dict has unknown keys {unknown}; accepted keys are {sorted(_DICT_KEYS)}.")
    kind = params.get("rope_type", params.get("type", "default"))
    theta = params.get("rope_theta")
    if theta is not None and float(theta) != float(base):
        raise AttnkitValueError(f"scaling dict has rope_theta={theta} but RoPE was built with base={base}; "
                                f"pass base={theta} to RoPE.")
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise AttnkitValueError(
            f"scaling dict has partial_rotary_factor={params['partial_rotary_factor']}, which attnkit's RoPE does not "
            "apply; build RoPE(head_dim=int(D * partial_rotary_factor)) and rotate only x[..., :that_dim]."
        )
    if kind == "default":
        return None
    if "factor" not in params:
        raise AttnkitValueError(f"scaling dict of type {kind!r} needs a 'factor' key, got {dict(params)}; add e.g. "
                                "'factor': 4.0.")
    factor = params["factor"]
    if kind == "linear":
        return LinearScaling(factor)
    if kind == "ntk":
        return NTKScaling(factor)
    original = params.get("original_max_position_embeddings", params.get("original_max_positions"))
    if kind in ("yarn", "llama3") and original is None:
        raise AttnkitValueError(f"scaling dict of type {kind!r} needs 'original_max_position_embeddings' (the "
                                f"trained context length), got {dict(params)}; add it, e.g. 4096.")
    if isinstance(original, float) and original.is_integer():
        original = int(original)  # JSON configs sometimes write 8192.0
    if kind == "llama3":
        absent = [k for k in ("low_freq_factor", "high_freq_factor") if k not in params]
        if absent:  # as transformers: no silent default for what defines the bands
            raise AttnkitValueError(f"scaling dict of type 'llama3' needs {absent}, got {dict(params)}; LLaMA 3.1 "
                                    "uses 'low_freq_factor': 1.0, 'high_freq_factor': 4.0.")
        return Llama3Scaling(factor, original, low_freq_factor=params["low_freq_factor"],
                             high_freq_factor=params["high_freq_factor"])
    if kind == "yarn":
        attention_factor = params.get("attention_factor")
        if attention_factor is None and params.get("mscale") and params.get("mscale_all_dim"):
            # DeepSeek-style: ratio of two mscale curves, exactly as Hugging Face infers it.
            attention_factor = _yarn_mscale(factor, params["mscale"]) / _yarn_mscale(factor, params["mscale_all_dim"])
        return YaRNScaling(factor, original, beta_fast=params.get("beta_fast", 32.0),
                           beta_slow=params.get("beta_slow", 1.0), attention_factor=attention_factor,
                           truncate=bool(params.get("truncate", True)))
    raise AttnkitValueError(
        f"scaling dict has type {kind!r}, which attnkit's RoPE does not implement; use one of 'default', 'linear', "
        "'ntk' (static NTK-aware), 'yarn' or 'llama3' ('dynamic' and 'longrope' are not supported)."
    )


def _as_scaling(scaling: object, base: float) -> RopeScaling | None:
    if scaling is None or isinstance(scaling, (LinearScaling, NTKScaling, YaRNScaling, Llama3Scaling)):
        return scaling
    if isinstance(scaling, Mapping):
        return scaling_from_dict(scaling, base)
    raise AttnkitTypeError(
        f"scaling must be None, LinearScaling, NTKScaling, YaRNScaling, Llama3Scaling or a rope_scaling dict, got "
        f"{describe(scaling)}; e.g. scaling=LinearScaling(4.0) or scaling={{'rope_type': 'linear', 'factor': 4.0}}."
    )


def rope_inv_freq(head_dim: int, base: float, scaling: RopeScaling | None = None, *,
                  dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> torch.Tensor:
    """Inverse frequencies ``(D/2,)`` after scaling, computed in float64 and returned in ``dtype``."""
    if isinstance(scaling, NTKScaling):
        base = scaling.effective_base(base, head_dim)
    exponent = torch.arange(0, head_dim, 2, dtype=torch.float64, device=device) / head_dim  # (D/2,)
    inv_freq = base ** -exponent  # (D/2,)
    if isinstance(scaling, LinearScaling):
        inv_freq = inv_freq / scaling.factor
    elif isinstance(scaling, YaRNScaling):
        low, high = scaling.ramp_bounds(base, head_dim)
        high = high + 0.001 if low == high else high  # as HF: avoid a zero-width ramp
        ramp = ((torch.arange(head_dim // 2, dtype=torch.float64, device=device) - low) / (high - low)).clamp(0, 1)
        inv_freq = inv_freq / scaling.factor * ramp + inv_freq * (1 - ramp)  # ramp 0: extrapolate, 1: interpolate
    elif isinstance(scaling, Llama3Scaling):
        inv_freq = scaling.scale(inv_freq)
    return inv_freq.to(dtype)


# --------------------------------------------------------------------------------------------------- the module


class RoPE(nn.Module):
    """Rotary position embedding for ``x: (B, H, L, D)`` at integer ``positions: (L,)`` or ``(B|1, L)``.

    Args:
        head_dim: D, even.
        base: the wavelength base (``rope_theta``), 10000 in the paper, 500000 in LLaMA 3.
        style: ``"half"`` (default, pairs ``(x[i], x[i + D/2])``) or ``"interleaved"`` (``(x[2i], x[2i+1])``).
        scaling: None, :class:`LinearScaling`, :class:`NTKScaling`, :class:`YaRNScaling`, :class:`Llama3Scaling`
            or a Hugging Face ``rope_scaling`` dict such as ``{"rope_type": "yarn", "factor": 4.0,
            "original_max_position_embeddings": 4096}``.

    ``inv_freq`` is a non-persistent float32 buffer (rebuilt, not loaded, with a checkpoint). A float64 input
    uses inverse frequencies recomputed in float64; so does any call after the module was cast to a low
    precision dtype, so ``model.to(torch.bfloat16)`` does not degrade the angles.
    """

    inv_freq: torch.Tensor

    def __init__(self, head_dim: int, base: float = 10000.0, style: str = "half", scaling: object = None):
        super().__init__()
        integer(head_dim, "head_dim", low=2, fix="RoPE rotates channel pairs: use an even head_dim >= 2.")
        if head_dim % 2:
            raise AttnkitValueError(f"head_dim must be even for RoPE (it rotates channel pairs), got {head_dim}; "
                                    "use an even head_dim (e.g. head_dim + 1 with a wider projection).")
        self.base = number(base, "base", low=1.0, low_open=True, fix="use e.g. base=10000.0 (rope_theta).")
        if style not in _STYLES:
            raise AttnkitValueError(f"style must be 'half' or 'interleaved', got {style!r}; 'half' pairs (x[i], "
                                    "x[i + D/2]) as LLaMA/Hugging Face, 'interleaved' pairs (x[2i], x[2i+1]) as GPT-J.")
        self.head_dim = head_dim
        self.style = style
        self.scaling = _as_scaling(scaling, self.base)
        self.attention_factor = self.scaling.mscale if isinstance(self.scaling, YaRNScaling) else 1.0
        self.register_buffer("inv_freq", rope_inv_freq(head_dim, self.base, self.scaling), persistent=False)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, base={self.base}, style={self.style!r}, scaling={self.scaling}"

    def _inv_freq(self, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        if self.inv_freq.dtype == dtype and self.inv_freq.device == device:
            return self.inv_freq
        return rope_inv_freq(self.head_dim, self.base, self.scaling, dtype=dtype, device=device)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin ``(B|1, L, D/2)`` of the angles at ``positions`` ``(B|1, L)``, times the attention factor."""
        inv_freq = self._inv_freq(dtype, positions.device)  # (D/2,)
        angles = positions.to(dtype)[..., None] * inv_freq  # (B|1, L, D/2)
        cos, sin = angles.cos(), angles.sin()
        if self.attention_factor != 1.0:
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        return cos, sin

    def _default_cos_sin(self, length: int, dtype: torch.dtype, device: torch.device):
        """cos and sin ``(1, L, D/2)`` at ``arange(L)``: a table computed once per (dtype, device, grad mode) and
        sliced, as every rotary implementation keeps it (a pure function of the length: nothing is memoised on
        the caller's tensors)."""
        key = (dtype, device, torch.is_inference_mode_enabled())  # inference tensors can't join autograd later
        table = self._tables.get(key) if hasattr(self, "_tables") else None
        if table is None or table[0].shape[1] < length or torch.compiler.is_compiling():
            n = max(length, 2 * table[0].shape[1]) if table is not None else max(length, 256)
            with torch.no_grad():
                table = self.cos_sin(torch.arange(n, device=device)[None], dtype)  # (1, n, D/2) x2
            if torch.compiler.is_compiling():
                return table[0][:, :length], table[1][:, :length]
            self.__dict__.setdefault("_tables", {})[key] = table
        return table[0][:, :length], table[1][:, :length]  # (1, L, D/2) x2

    def _cos_sin_at(self, positions: torch.Tensor, dtype: torch.dtype, length: int):
        """cos and sin ``(B|1, L, D/2)`` at ``positions (B|1, L)``: rows of the ``arange`` table (the same numbers,
        gathered instead of recomputed; packed rows restart their positions below L) when every position lies in
        the table of this length, else computed. On CPU only: elsewhere the range check would be a sync per call."""
        if positions.device.type != "cpu" or positions.numel() == 0 or torch.compiler.is_compiling():
            return self.cos_sin(positions, dtype)
        cos, sin = self._default_cos_sin(length, dtype, positions.device)  # (1, L, D/2) slices of the table
        table = self._tables[(dtype, positions.device, torch.is_inference_mode_enabled())]  # (1, n, D/2) x2
        lo, hi = positions.aminmax()
        if int(lo) < 0 or int(hi) >= table[0].shape[1]:
            return self.cos_sin(positions, dtype)
        return table[0][0][positions], table[1][0][positions]  # (B|1, L, D/2) x2

    def _apply(self, fn, recurse=True):
        self.__dict__.pop("_tables", None)  # .to() / .double(): tables are rebuilt for the new device and dtype
        return super()._apply(fn, recurse)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Rotate ``x`` ``(B, H, L, D)``; ``positions`` ``(L,)`` or ``(B|1, L)`` int (default ``arange(L)``)."""
        positions = self._check(x, positions)  # (B|1, L) or None (= arange(L))
        compute = torch.float64 if x.dtype == torch.float64 else torch.float32
        if positions is None:
            cos, sin = self._default_cos_sin(x.shape[2], compute, x.device)  # (1, L, D/2) each
        else:
            cos, sin = self._cos_sin_at(positions, compute, x.shape[2])  # (B|1, L, D/2) each
        cos, sin = cos[:, None], sin[:, None]  # (B|1, 1, L, D/2)
        if self.style == "half" and not (cos.requires_grad or sin.requires_grad or torch.compiler.is_compiling()):
            return _HalfRotation.apply(x, cos, sin, 1.0).to(x.dtype)  # (B, H, L, D), computed in cos's dtype
        # (compiled: the plain expression below, which the compiler fuses itself)
        xf = x.to(compute)  # (B, H, L, D)
        if self.style == "half":
            x1, x2 = xf.chunk(2, dim=-1)  # (B, H, L, D/2) each (chunk: its backward is one cat, not zero-fills)
        else:
            x1, x2 = xf.unflatten(-1, (self.head_dim // 2, 2)).unbind(-1)  # (B, H, L, D/2) each
        y1, y2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin  # (B, H, L, D/2) each
        if self.style == "half":
            out = torch.cat((y1, y2), dim=-1)  # (B, H, L, D)
        else:
            out = torch.stack((y1, y2), dim=-1).flatten(-2)  # (B, H, L, D/2, 2) -> (B, H, L, D)
        return out.to(x.dtype)

    def _check(self, x: object, positions: object) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point:
            raise AttnkitTypeError(f"x must be a floating-point tensor (B, H, L, D), got {describe(x)}; cast it with "
                                   ".float() or pass the query/key tensor after projection.")
        if x.dim() != 4 or x.shape[-1] != self.head_dim:
            raise AttnkitValueError(
                f"x must have shape (B, H, L, head_dim={self.head_dim}), got {describe(x)}; reshape projections "
                "with x.view(B, L, H, D).transpose(1, 2), and build RoPE with the head_dim of x."
            )
        B, _, L, _ = x.shape
        if positions is None:
            return None  # arange(L): served from the default table
        return position_ids(positions, length=L, batch=B, device=x.device, owner="x",
                            note=f" to match x {tuple(x.shape)}")  # (B|1, L)


class _HalfRotation(torch.autograd.Function):
    """Half-split rotation ``(x1 cos - x2 sin, x2 cos + x1 sin)`` of ``x (B, H, L, D)`` by ``cos, sin
    (B|1, 1, L, D/2)`` (``sign=-1``: by minus the angle). A rotation's backward is the inverse rotation, so only
    cos and sin are saved and each direction is four fused passes over half of ``x`` written into one output
    (autograd of the plain expression: four products, a sum, a difference and a cat each way)."""

    @staticmethod
    def forward(ctx, x, cos, sin, sign):
        ctx.save_for_backward(cos, sin)
        ctx.sign = sign
        out = torch.empty(x.shape, dtype=torch.promote_types(x.dtype, cos.dtype), device=x.device)  # (B, H, L, D)
        (x1, x2), (o1, o2) = x.chunk(2, dim=-1), out.chunk(2, dim=-1)  # (B, H, L, D/2) views
        torch.mul(x1, cos, out=o1).addcmul_(x2, sin, value=-sign)
        torch.mul(x2, cos, out=o2).addcmul_(x1, sin, value=sign)
        return out

    @staticmethod
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        return _HalfRotation.apply(grad, cos, sin, -ctx.sign), None, None, None  # differentiable again


# ------------------------------------------------------------------------------------------------ layout convert


def convert_rope_layout(weight: torch.Tensor, num_heads: int, head_dim: int, to: str = "interleaved") -> torch.Tensor:
    """Permute the output rows of a q or k projection so a model using the other RoPE style is unchanged.

    ``weight`` is a projection weight ``(num_heads * head_dim, in)`` or bias ``(num_heads * head_dim,)``; for a
    grouped k projection pass ``num_heads=num_kv_heads``. Within each head:

    - ``to="interleaved"`` (from half): new row ``2i`` is old row ``i``, new row ``2i+1`` is old row ``i + D/2``;
    - ``to="half"`` (from interleaved): the inverse; this is the permutation Hugging Face applies when it
      converts Meta's LLaMA checkpoints.

    Rotated q and k are then the same vectors with their channels permuted, so every score ``q . k`` is
    identical. The two directions round-trip exactly. Returns a new tensor.
    """
    if not isinstance(weight, torch.Tensor):
        raise AttnkitTypeError(f"weight must be a torch.Tensor (a q/k projection weight or bias), got "
                               f"{describe(weight)}; pass e.g. attn.q_proj.weight.data.")
    integer(num_heads, "num_heads", low=1, fix="pass the number of heads of this projection (num_kv_heads for k).")
    integer(head_dim, "head_dim", low=2, fix="pass the per-head dimension D (even).")
    if head_dim % 2:
        raise AttnkitValueError(f"head_dim must be even for RoPE, got {head_dim}; pass the per-head dimension D.")
    if to not in _STYLES:
        raise AttnkitValueError(f"to must be 'half' or 'interleaved', got {to!r}; name the style the converted "
                                "weight will be used with.")
    rows = num_heads * head_dim
    if weight.dim() not in (1, 2) or weight.shape[0] != rows:
        raise AttnkitValueError(
            f"weight must have shape ({rows}, in) or ({rows},) = (num_heads * head_dim, ...), got {describe(weight)}; "
            "check num_heads/head_dim (use num_kv_heads for a grouped k projection)."
        )
    rest = tuple(weight.shape[1:])
    if to == "interleaved":
        grouped = weight.reshape(num_heads, 2, head_dim // 2, *rest)  # (H, 2, D/2, ...): [h, half, i]
    else:
        grouped = weight.reshape(num_heads, head_dim // 2, 2, *rest)  # (H, D/2, 2, ...): [h, i, pair member]
    return grouped.transpose(1, 2).reshape(rows, *rest).clone()  # (H*D, ...)

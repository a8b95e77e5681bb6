"""RoPE scaling for contexts beyond the trained length: the frozen configs (:class:`LinearScaling`,
:class:`NTKScaling`, :class:`YaRNScaling`, :class:`Llama3Scaling`), Hugging Face ``rope_scaling`` /
``rope_parameters`` dicts read into them (:func:`scaling_from_dict`), and the scaled inverse frequencies
(:func:`rope_inv_freq`) that :class:`attnkit.positions.rope.RoPE` turns with.

Shape legend: D head_dim (even); inverse frequencies are ``(D/2,)``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from attnkit._checks import integer, number
from attnkit.errors import AttnkitTypeError, AttnkitValueError, describe


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

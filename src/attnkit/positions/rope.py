"""Rotary position embeddings (RoPE, Su et al. 2021) with long-context scaling and a layout converter.

RoPE rotates pairs of channels of every query and key by an angle ``position * inv_freq[i]``, so the score
``q_m . k_n`` depends on positions only through ``m - n``. Channel pair ``i`` (0 <= i < D/2) turns with
``inv_freq[i] = base ** (-2i / D)``.

Pairing styles (docs/conventions.md):

- ``"half"`` (default; LLaMA, Hugging Face ``rotate_half``): pair ``i`` is ``(x[i], x[i + D/2])``.
- ``"interleaved"`` (GPT-J, the original RoFormer, Meta's LLaMA checkpoints): pair ``i`` is ``(x[2i], x[2i+1])``.

The two styles give the same model up to a permutation of the q/k projection rows; :func:`convert_rope_layout`
applies it. Scaling for contexts beyond the trained length (:mod:`attnkit.positions.rope_scaling`) is a
frozen dataclass (:class:`LinearScaling`, :class:`NTKScaling`, :class:`YaRNScaling`, :class:`Llama3Scaling`) or a
Hugging Face style ``rope_scaling``/``rope_parameters`` dict.

Precision: angles, cos/sin and the rotation are computed in float32 (float64 when ``x`` is float64) and the
result is cast back to ``x.dtype``. float32 angles are exact for positions below 2**24; their error grows like
``position * eps``, as in every float32 RoPE.

Shape legend: B batch, H heads, L length, D head_dim (even), E = num_heads * head_dim rows of a projection.
"""

from __future__ import annotations

import torch
from torch import nn

from attnkit._checks import integer, number, position_ids
from attnkit.errors import AttnkitTypeError, AttnkitValueError, describe
from attnkit.positions.rope_scaling import YaRNScaling, _as_scaling, rope_inv_freq

_STYLES = ("half", "interleaved")


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

"""Input checks for the attention front door, turning arguments into a validated :class:`AttentionCall`.

Every check raises a typed error whose message names the argument, its value and the fix (docs/conventions.md).

Shape legend: B batch, H query heads, Hkv key/value heads, Lq/Lk query/key lengths, D head dim.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from attnkit._bias import StructuredBias
from attnkit._checks import number as check_scalar
from attnkit._checks import position_ids
from attnkit._memo import Memo
from attnkit.errors import AttnkitTypeError, AttnkitValueError, describe
from attnkit.masks import MaskSpec, PreparedMask, default_positions


@dataclass(slots=True, kw_only=True)  # not frozen (a frozen one costs ~1 us more to build); read-only by convention
class AttentionCall:
    """A validated attention request: tensors at the backend boundary plus every option.

    ``q_positions``/``kv_positions`` are ``(B|1, L)`` int64 or ``None`` for the default (bottom-right
    aligned aranges); :meth:`positions` materialises them. ``mask`` is what the caller passed (a prepared
    mask's source); ``prepared`` is the same mask as a :class:`~attnkit.masks.PreparedMask` bound to these
    positions (None without a mask): backends read its dense form, block cover, structure and memo instead of
    binding the mask themselves.

    Built by keyword only (``AttentionCall(q=..., k=..., ...)``): a new field can't shift the others.
    """

    q: torch.Tensor  # (B, H, Lq, D)
    k: torch.Tensor  # (B, Hkv, Lk, D)
    v: torch.Tensor  # (B, Hkv, Lk, Dv)
    mask: MaskSpec | torch.Tensor | None
    bias: torch.Tensor | StructuredBias | None
    scale: float
    softcap: float | None
    dropout_p: float
    q_positions: torch.Tensor | None
    kv_positions: torch.Tensor | None
    return_weights: bool
    prepared: PreparedMask | None = None
    #: a float bias tensor, or a structured bias built from tensors (parameters, buffers, anything) that
    #: autograd must reach (asked once per call by scoring one entry, :func:`bias_needs_grad`)
    bias_needs_grad: bool = False
    #: attention sinks: one learned logit per query head ``(H,)`` that takes probability mass in the softmax
    #: and is dropped (gpt-oss); served by backends with ``serves_sinks = True`` (sdpa, blocksparse, eager,
    #: math), refused by the others
    sinks: torch.Tensor | None = None
    #: ``(shapes, dtypes, devices)`` of q, k, v as :func:`check_tensors` keyed them (None: not computed)
    tensors_key: tuple | None = field(default=None, repr=False, compare=False)

    @property
    def batch(self) -> int:
        return self.q.shape[0]

    @property
    def num_heads(self) -> int:
        return self.q.shape[1]

    @property
    def num_kv_heads(self) -> int:
        return self.k.shape[1]

    @property
    def q_len(self) -> int:
        return self.q.shape[2]

    @property
    def kv_len(self) -> int:
        return self.k.shape[2]

    @property
    def is_empty(self) -> bool:
        """No batch row, head, query or key: the result has no entry to compute (or is all zeros when Lk = 0)."""
        return self.q.numel() == 0 or self.k.numel() == 0

    @property
    def default_positions(self) -> bool:
        return self.q_positions is None and self.kv_positions is None

    @property
    def needs_grad(self) -> bool:
        return torch.is_grad_enabled() and (self.q.requires_grad or self.k.requires_grad or self.v.requires_grad
                                            or self.bias_needs_grad)

    def signature(self) -> tuple:
        """Everything about the call except tensor values and its mask: shapes, dtype, device, whether autograd
        needs it, and the kinds of its options (a float softcap or none, dropout or none, the bias's type, sinks
        or none, default positions or given ones). The key of auto's memoised choice (backends.registry)."""
        return (self.tensors_key or _tensors_key(self.q, self.k, self.v), self.needs_grad, self.bias_needs_grad,
                self.return_weights, self.softcap is None, self.dropout_p > 0, type(self.bias),
                self.sinks is None, self.default_positions)

    def positions(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Query and key positions ``(B|1, Lq)``, ``(B|1, Lk)`` int64 on q's device."""
        dq, dkv = default_positions(self.q_len, self.kv_len, self.q.device)
        return (dq if self.q_positions is None else self.q_positions,
                dkv if self.kv_positions is None else self.kv_positions)


def bias_needs_grad(bias: torch.Tensor | StructuredBias | None, device: torch.device) -> bool:
    """Whether autograd must reach the bias: a float tensor that requires grad, or a structured bias that
    says so (:meth:`StructuredBias.needs_grad`: by default its score of one entry requires grad)."""
    if not torch.is_grad_enabled() or bias is None:
        return False
    if isinstance(bias, torch.Tensor):
        return bias.requires_grad
    return bias.needs_grad(device)


#: ``(shapes, dtypes, devices)`` of q, k, v that passed :func:`check_tensors`: everything it reads, so a key
#: found here proves the same checks pass again (plain tensors only)
_CHECKED_TENSORS = Memo("checked tensors", 1024)


def _tensors_key(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple:
    return (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.device, k.device, v.device)


def check_tensors(q: object, k: object, v: object) -> tuple | None:
    """Types, ranks, dtypes, devices and shapes of ``q (B, H, Lq, D)``, ``k, v (B, Hkv, Lk, D|Dv)``: done once per
    key (a memo keyed on exactly what the checks read), again for every call with another key. Returns the key
    (None for tensor subclasses and while compiling: then nothing is memoised)."""
    key = None
    if type(q) is torch.Tensor and type(k) is torch.Tensor and type(v) is torch.Tensor and \
            not torch.compiler.is_compiling():
        key = _tensors_key(q, k, v)
        if key in _CHECKED_TENSORS:
            return key
    _check_tensors(q, k, v)
    if key is not None:
        _CHECKED_TENSORS[key] = None
    return key


def _check_tensors(q: object, k: object, v: object) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise AttnkitTypeError(f"{name} must be a torch.Tensor, got {describe(t)}.")
        if t.dim() != 4:
            raise AttnkitValueError(
                f"{name} must have 4 dims ({'B, H, Lq, D' if name == 'q' else 'B, Hkv, Lk, D'}), got {describe(t)}; "
                "reshape (B, L, H*D) inputs with x.view(B, L, H, D).transpose(1, 2)."
            )
        if not t.dtype.is_floating_point:
            raise AttnkitTypeError(f"{name} must be a floating-point tensor, got {describe(t)}; cast with .float().")
    if not (q.dtype == k.dtype == v.dtype):
        raise AttnkitTypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}; cast them to "
                               "one dtype (or run under torch.autocast).")
    if not (q.device == k.device == v.device):
        raise AttnkitValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}; move them "
                                "with .to(q.device).")
    B, H, _, D = q.shape
    if k.shape[0] != B or v.shape[0] != B:
        raise AttnkitValueError(f"batch sizes differ: q {B}, k {k.shape[0]}, v {v.shape[0]}; give q, k, v one batch.")
    if k.shape[1] != v.shape[1] or k.shape[2] != v.shape[2]:
        raise AttnkitValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must agree on (Hkv, Lk).")
    if D == 0:
        raise AttnkitValueError(f"q and k have head dim D=0, got q {describe(q)}; scores need at least one feature "
                                "per head (D >= 1).")
    if k.shape[3] != D:
        raise AttnkitValueError(f"k head dim {k.shape[3]} differs from q head dim {D}; q and k must share D.")
    if k.shape[1] == 0 or H % k.shape[1] != 0:
        raise AttnkitValueError(
            f"num_heads H={H} must be a multiple of num_kv_heads Hkv={k.shape[1]} (GQA: head h reads KV head h // G); "
            "choose Hkv dividing H, e.g. Hkv=1 (MQA) or Hkv=H (MHA)."
        )


def check_positions(positions: object, name: str, batch: int, length: int, device: torch.device):
    """A call's ``positions``: None (the defaults), or int64 ``(B|1, L)`` (:func:`attnkit._checks.position_ids`)."""
    if positions is None:
        return None
    return position_ids(positions, name, length=length, batch=batch, device=device)


def check_mask(mask: object, shape: tuple[int, int, int, int], device: torch.device | None = None) -> None:
    if mask is None:
        return
    if isinstance(mask, MaskSpec):  # its data must fit the call (a dense part built for other heads, a padding batch)
        B, H = shape[:2]
        if mask.batch not in (1, B) or mask.heads not in (1, H):
            raise AttnkitValueError(
                f"mask {mask!r} holds data for batch {mask.batch} and {mask.heads} heads, which does not broadcast "
                f"to (B, H, Lq, Lk)={shape}; build its tensors with batch 1 or B={B} and heads 1 or H={H}.")
        return
    if isinstance(mask, PreparedMask):
        B, _, Lq, Lk = shape
        mask.check_call(B, Lq, Lk, device if device is not None else mask.device)
        return
    if not isinstance(mask, torch.Tensor):
        raise AttnkitTypeError(f"mask must be an attnkit mask (ak.masks.*), a prepared mask (ak.masks.prepare), a bool "
                               f"tensor or None, got {describe(mask)}.")
    if mask.dtype != torch.bool:
        raise AttnkitTypeError(
            f"mask must be boolean (True = may attend), got {describe(mask)}; pass additive float masks as bias= "
            "and convert 0/1 masks with mask.bool()."
        )
    _check_broadcast(mask, "mask", shape)


def check_bias(bias: object, shape: tuple[int, int, int, int], num_heads: int) -> None:
    if bias is None:
        return
    if isinstance(bias, StructuredBias):
        if bias.num_heads != num_heads:
            raise AttnkitValueError(f"bias {type(bias).__name__} was built for {bias.num_heads} heads but q has "
                                    f"{num_heads}; build it with num_heads={num_heads}.")
        if getattr(bias, "batch", 1) not in (1, shape[0]):
            raise AttnkitValueError(f"bias {type(bias).__name__} has per-row terms for batch {bias.batch} but q has "
                                    f"batch {shape[0]}; give it one row of slopes per batch row (or one for all).")
        return
    if not isinstance(bias, torch.Tensor) or not bias.dtype.is_floating_point:
        raise AttnkitTypeError(f"bias must be a float tensor broadcastable to (B, H, Lq, Lk) or a structured bias "
                               f"such as ak.positions.ALiBi, got {describe(bias)}; pass boolean masks as mask=.")
    _check_broadcast(bias, "bias", shape)


def _check_broadcast(t: torch.Tensor, name: str, shape: tuple[int, int, int, int]) -> None:
    ok = t.dim() <= 4
    if ok:
        try:
            ok = torch.broadcast_shapes(t.shape, shape) == torch.Size(shape)
        except RuntimeError:
            ok = False
    if not ok:
        raise AttnkitValueError(f"{name} of shape {tuple(t.shape)} does not broadcast to (B, H, Lq, Lk)={shape}; "
                                "give it shape (Lq, Lk), (B, 1, Lq, Lk) or (B, H, Lq, Lk).")


def build_call(q, k, v, mask=None, *, bias=None, scale=None, softcap=None, dropout_p=0.0,
               q_positions=None, kv_positions=None, return_weights=False, sinks=None) -> AttentionCall:
    """Validate the arguments of :func:`attnkit.attention` and bundle them.

    Checks that read only shapes, dtypes and devices are memoised on exactly those (:func:`check_tensors`); a
    prepared mask was bound once, so a call with one checks only that it fits (batch, lengths, device)."""
    tensors_key = check_tensors(q, k, v)
    B, H, Lq, D = q.shape
    Lk = k.shape[2]
    shape = (B, H, Lq, Lk)
    check_mask(mask, shape, q.device)
    if bias is not None:
        check_bias(bias, shape, H)
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    elif not (type(scale) is float and 0.0 < scale < math.inf):  # (a positive finite float needs no more check)
        scale = check_scalar(
        scale, "scale", low=0.0, high=math.inf, low_open=True, fix="omit it for the default 1/sqrt(head_dim).")
    if softcap is not None:
        softcap = check_scalar(softcap, "softcap", low=0.0, high=math.inf, low_open=True,
                               fix="use a positive cap such as 50.0 (Gemma 2), or None for no softcap.")
    if not (type(dropout_p) is float and dropout_p == 0.0):  # (the default needs no check)
        dropout_p = check_scalar(dropout_p, "dropout_p", low=0.0, high=1.0, fix="use 0 <= dropout_p < 1 (0 at eval).")
    if return_weights is not False and return_weights is not True:
        raise AttnkitTypeError(f"return_weights must be True or False, got {describe(return_weights)}; pass a bool "
                               "(a string such as 'no' is not one).")
    if q_positions is not None:
        q_positions = check_positions(q_positions, "q_positions", B, Lq, q.device)
    if kv_positions is not None:
        kv_positions = check_positions(kv_positions, "kv_positions", B, Lk, q.device)
    prepared = mask
    if isinstance(mask, PreparedMask):  # its positions are the call's (given ones must equal them)
        if q_positions is not None or kv_positions is not None or not mask.default_positions:
            q_positions = mask.same_positions("q_positions", q_positions)
            kv_positions = mask.same_positions("kv_positions", kv_positions)
        if mask.batch != B:  # prepared for batch 1, broadcast over this call's rows: bound again for them, once
            # (memo key B: the positions equal the prepared ones and check_call fixed Lq, Lk and the device)
            prepared = mask.memo(("batch", B), lambda: PreparedMask.for_call(
                mask.source, q_positions, kv_positions, B, Lq, Lk, q.device))
        mask = mask.source
    elif mask is not None:
        prepared = PreparedMask.for_call(mask, q_positions, kv_positions, B, Lq, Lk, q.device)
    if sinks is not None:
        check_sinks(sinks, H, q.device)
    return AttentionCall(q=q, k=k, v=v, mask=mask, bias=bias, scale=scale, softcap=softcap, dropout_p=dropout_p,
                         q_positions=q_positions, kv_positions=kv_positions, return_weights=return_weights,
                         prepared=prepared, bias_needs_grad=bias is not None and bias_needs_grad(bias, q.device),
                         sinks=sinks, tensors_key=tensors_key)


def check_sinks(sinks, num_heads: int, device: torch.device) -> None:
    """``sinks``: None or a float tensor ``(H,)`` of per-head sink logits on the queries' device."""
    if sinks is None:
        return
    if not isinstance(sinks, torch.Tensor) or not sinks.is_floating_point():
        raise AttnkitTypeError(f"sinks must be a float tensor (H,) of per-head sink logits, got {describe(sinks)}; "
                               "pass e.g. the model's learned sinks parameter, or None for no sink.")
    if sinks.shape != (num_heads,) or sinks.device != device:
        raise AttnkitValueError(f"sinks must have shape ({num_heads},) (one logit per query head) on {device}, got "
                                f"shape {tuple(sinks.shape)} on {sinks.device}; pass one logit per query head.")

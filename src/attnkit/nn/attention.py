"""``MultiHeadAttention``: projections, GQA/MQA, injected position parts, dropout and output projection around
:func:`attnkit.attention`; self-attention and cross-attention (keys/values from a context sequence).

Shape legend: B batch, L (= Lq) query length, Lk key length, E embed_dim, H num_heads, Hkv num_kv_heads,
D head_dim.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn

from attnkit._bias import StructuredBias
from attnkit._checks import positive_int
from attnkit._validation import check_positions
from attnkit.backends import attention, get
from attnkit.errors import AttnkitTypeError, AttnkitValueError, BackendUnsupportedError, describe
from attnkit.masks import MaskSpec, PreparedMask
from attnkit.positions import ALiBi, RoPE


class MultiHeadAttention(nn.Module):
    """Multi-head attention with grouped/multi-query heads and injected parts (torchtune style).

    Args:
        embed_dim: E, the width of ``x`` and of the output.
        num_heads: H query heads; ``head_dim`` defaults to ``E // H`` (any D may be given: H * D != E is fine).
        num_kv_heads: Hkv key/value heads (``H`` = MHA, ``1`` = MQA, in between = GQA); H % Hkv == 0.
        kdim, vdim: widths of the context's keys and values input (cross-attention); default E. With
            ``kdim == vdim == E`` q, k and v share one fused projection ``qkv_proj`` (one matmul for
            self-attention); otherwise ``q_proj``, ``k_proj`` and ``v_proj`` are separate.
        dropout: attention dropout on the probabilities, active in training mode only.
        bias: biases of every projection; ``qkv_bias`` overrides it for the q/k/v projections (Qwen2: q/k/v
            biased, output not).
        rotary: the q/k transform slot: any module ``f(x (B, heads, L, D), positions (B|1, L) | None) -> same
            shape`` (None = ``arange(L)``) applied alike to the query heads and to the key heads (one call each)
            (:class:`~attnkit.positions.RoPE` of any base, scaling and pairing).
        score_bias: the bias slot: any :class:`attnkit._bias.StructuredBias` (``ak.positions.ALiBi``), added to
            the scores from absolute positions and evaluated per block by the backends.
        q_norm, k_norm: QK-norm: modules applied to each head's query / key ``(..., D)`` before ``rotary``
            (e.g. ``nn.RMSNorm(D)``, as Qwen3 and OLMo 2).
        scale: score scale; default ``1 / sqrt(D)``.
        add_bias_kv, add_zero_attn: as ``torch.nn.MultiheadAttention``: a learned key/value (``bias_k``,
            ``bias_v``) and then a zero key/value are appended to every row's keys, visible to every query.
            The mask is then materialised densely; not combinable with ``rotary``, ``score_bias`` or a cache.
        positions: shorthand that builds the same parts: ``"rope"`` = ``rotary=RoPE(D)``, ``"alibi"`` =
            ``score_bias=ALiBi(H)``, or a RoPE / ALiBi instance (then put in its slot).
        backend: passed to :func:`attnkit.attention` ("auto" picks the fastest capable kernel).
        init_std: if set, all projection weights are drawn from normal(0, init_std) (GPT style: 0.02) and
            biases zeroed; ``None`` keeps PyTorch's default ``nn.Linear`` init.

    ``forward(x (B, L, E), mask=None, *, context=None, value=None, positions=None, context_positions=None,
    cache=None, return_weights=False) -> (B, L, E)`` (and weights ``(B, H, L, Lk)`` when asked).

    Cross-attention: ``context`` ``(B, Lk, kdim)`` gives keys (and values, unless ``value`` ``(B, Lk, vdim)`` is
    given: torch's separate key and value inputs); ``mask`` and ``score_bias`` are evaluated on
    ``positions`` and ``context_positions`` (defaults ``arange``).

    With ``cache`` (an :mod:`attnkit.cache` cache, or any object with ``update(k, v, positions)``), the
    new tokens' k and v (after ``rotary``, Hkv heads) go through ``cache.update`` and attention runs over every
    key it returns, at the absolute positions it returns: one code path for prefill, chunked prefill and
    decoding. ``positions`` (absolute, ``(B|1, L)``) default to the ones the cache continues with
    (``cache.next_positions(L)``, read without a host sync; a cache without that method needs them given) and
    the mask must be causal; it is evaluated on absolute positions (bottom-right), never on "the last L columns".
    """

    #: padding masks are read on positions (a cache may reorder its slots), not on key indices
    mask_by_key_index = False

    def __init__(self, embed_dim: int, num_heads: int, *, num_kv_heads: int | None = None,
                 head_dim: int | None = None, kdim: int | None = None, vdim: int | None = None,
                 dropout: float = 0.0, bias: bool = True, qkv_bias: bool | None = None,
                 rotary: nn.Module | None = None, score_bias: StructuredBias | None = None,
                 q_norm: nn.Module | None = None, k_norm: nn.Module | None = None, scale: float | None = None,
                 add_bias_kv: bool = False, add_zero_attn: bool = False,
                 positions: RoPE | ALiBi | str | None = None, backend: str = "auto",
                 init_std: float | None = None, device=None, dtype=None):
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        _check_shape_args(embed_dim, num_heads, num_kv_heads, head_dim)
        kdim, vdim = embed_dim if kdim is None else positive_int(kdim, "kdim"), \
            embed_dim if vdim is None else positive_int(vdim, "vdim")
        if not 0.0 <= dropout < 1.0:
            raise AttnkitValueError(f"dropout must be in [0, 1), got {dropout}; use e.g. 0.1, or 0.0 to disable.")
        if backend != "auto":
            get(backend)  # fail early on unknown names
        self.embed_dim, self.num_heads, self.num_kv_heads = embed_dim, num_heads, num_kv_heads
        self.kdim, self.vdim = kdim, vdim
        self.head_dim = head_dim or embed_dim // num_heads
        self.dropout, self.backend, self.scale = dropout, backend, scale
        D, H, Hkv = self.head_dim, num_heads, num_kv_heads
        qkv_bias = bias if qkv_bias is None else qkv_bias
        factory = {"device": device, "dtype": dtype}
        if kdim == vdim == embed_dim:
            self.qkv_proj = nn.Linear(embed_dim, (H + 2 * Hkv) * D, bias=qkv_bias, **factory)  # fused [Wq; Wk; Wv]
        else:
            self.q_proj = nn.Linear(embed_dim, H * D, bias=qkv_bias, **factory)
            self.k_proj = nn.Linear(kdim, Hkv * D, bias=qkv_bias, **factory)
            self.v_proj = nn.Linear(vdim, Hkv * D, bias=qkv_bias, **factory)
        self.out_proj = nn.Linear(H * D, embed_dim, bias=bias, **factory)
        if positions is not None:
            if rotary is not None or score_bias is not None:
                raise AttnkitValueError(f"positions={positions!r} is a shorthand for rotary=/score_bias=; give "
                                        "either the shorthand or the parts, not both.")
            rotary, score_bias = position_parts(positions, D, H)
        self.rotary = _check_rotary(rotary, D)
        self.score_bias = _check_score_bias(score_bias, H)
        self.q_norm, self.k_norm = q_norm, k_norm
        self.bias_k = self.bias_v = None
        if add_bias_kv:
            self.bias_k = nn.Parameter(torch.zeros(1, Hkv, 1, D, **factory))  # one extra key per KV head
            self.bias_v = nn.Parameter(torch.zeros(1, Hkv, 1, D, **factory))
            nn.init.xavier_normal_(self.bias_k)
            nn.init.xavier_normal_(self.bias_v)
        self.add_zero_attn = add_zero_attn
        if (add_bias_kv or add_zero_attn) and (self.rotary is not None or self.score_bias is not None):
            raise BackendUnsupportedError(
                "add_bias_kv/add_zero_attn append keys that have no position, so they cannot be combined with "
                "rotary= or score_bias=; drop one of them (torch.nn.MultiheadAttention has no positions either).")
        if init_std is not None:
            init_normal(*self.projections(), std=init_std)

    # ------------------------------------------------------------------------------------------ projections

    def projections(self) -> list[nn.Linear]:
        """The module's Linear layers (in-projection(s) first, ``out_proj`` last)."""
        names = ("qkv_proj",) if hasattr(self, "qkv_proj") else ("q_proj", "k_proj", "v_proj")
        return [getattr(self, n) for n in names] + [self.out_proj]

    def project(self, x: torch.Tensor, positions: torch.Tensor | None = None, *, context: torch.Tensor | None = None,
                value: torch.Tensor | None = None, context_positions: torch.Tensor | None = None):
        """q ``(B, H, L, D)``, k and v ``(B, Hkv, Lk, D)``, after QK-norm and ``rotary`` when configured."""
        B, L, _ = x.shape
        H, Hkv, D = self.num_heads, self.num_kv_heads, self.head_dim
        fused = "qkv_proj" in self._modules
        if context is None and fused:
            # one matmul; split token-major, then transpose: the backward's cat then writes the (B, L, H + 2Hkv, D)
            # gradient the matmul reads, with no copy back from a head-major (B, H + 2Hkv, L, D) one
            # (q and k are rotated apart: rotating the stacked (B, H + Hkv, L, D) heads costs one more cat backward)
            qkv = self.qkv_proj(x).view(B, L, H + 2 * Hkv, D)  # (B, L, H + 2Hkv, D)
            q, k, v = qkv.split_with_sizes([H, Hkv, Hkv], dim=2)  # (B, L, H|Hkv, D)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H|Hkv, L, D)
        else:
            if fused:  # cross-attention through the fused weight: q from x, k and v from context
                wq, wk, wv = self.qkv_proj.weight.split([H * D, Hkv * D, Hkv * D])
                b = self.qkv_proj.bias
                bq, bk, bv = (None,) * 3 if b is None else b.split([H * D, Hkv * D, Hkv * D])
                q = F.linear(x, wq, bq)  # (B, L, H*D)
                if value is None:
                    k, v = F.linear(context, torch.cat([wk, wv]), None if b is None else torch.cat([bk, bv])).split(
                        [Hkv * D, Hkv * D], dim=-1)  # (B, Lk, Hkv*D) x2, one matmul
                else:
                    k, v = F.linear(context, wk, bk), F.linear(value, wv, bv)  # (B, Lk, Hkv*D) x2
            else:
                context = x if context is None else context
                q, k, v = self.q_proj(x), self.k_proj(context), self.v_proj(context if value is None else value)
            Lk = k.shape[1]
            q = q.view(B, L, H, D).transpose(1, 2)  # (B, H, L, D)
            k = k.view(B, Lk, Hkv, D).transpose(1, 2)  # (B, Hkv, Lk, D)
            v = v.view(B, Lk, Hkv, D).transpose(1, 2)  # (B, Hkv, Lk, D)
        if self.q_norm is not None:
            q = self.q_norm(q)
        if self.k_norm is not None:
            k = self.k_norm(k)
        if self.rotary is not None:  # None positions = arange of each tensor's own length
            q, k = self.rotary(q, positions), self.rotary(k, positions if context is None else context_positions)
        return q, k, v

    # ---------------------------------------------------------------------------------------------- forward

    def forward(self, x: torch.Tensor, mask=None, *, context: torch.Tensor | None = None,
                value: torch.Tensor | None = None, positions: torch.Tensor | None = None,
                context_positions: torch.Tensor | None = None, cache=None, return_weights: bool = False):
        self._check_input(x, "x", "embed_dim", self.embed_dim, None)
        B, L, _ = x.shape
        if positions is not None:
            positions = check_positions(positions, "positions", B, L, x.device)  # (B|1, L)
        if value is not None and context is None:
            raise AttnkitValueError("value= needs context= (the keys' input); pass context=key, value=value.")
        if context is not None:
            self._check_input(context, "context", "kdim", self.kdim, B)
            if value is not None:
                self._check_input(value, "value", "vdim", self.vdim, B)
                if value.shape[1] != context.shape[1]:
                    raise AttnkitValueError(f"value has {value.shape[1]} tokens but context has {context.shape[1]}; "
                                            "keys and values come in pairs.")
            if cache is not None:
                raise AttnkitValueError("cache= with context=: a cross-attention's keys are the context itself; "
                                        "call without cache= (project the context once per sequence).")
            context_positions = check_positions(context_positions, "context_positions", B, context.shape[1],
                                                x.device)
            if mask is not None or self.score_bias is not None:  # cross: both sequences count from 0 by default
                positions = torch.arange(L, device=x.device)[None] if positions is None else positions  # (B|1, L)
                context_positions = torch.arange(context.shape[1], device=x.device)[None] \
                    if context_positions is None else context_positions  # (B|1, Lk)
        elif "qkv_proj" not in self._modules:
            raise AttnkitValueError(f"this module has kdim={self.kdim}, vdim={self.vdim} != embed_dim="
                                    f"{self.embed_dim}: it is a cross-attention; pass context=(B, Lk, kdim).")
        if cache is not None:
            if self.bias_k is not None or self.add_zero_attn:
                raise AttnkitValueError("cache= is not supported with add_bias_kv/add_zero_attn (torch's extra "
                                        "keys); build the module without them to decode with a cache.")
            _check_cache_call(cache, mask, positions)
            if positions is None:  # the cache continues its own sequence: nothing to read back or check
                positions = cache.next_positions(L)  # (B|1, L)
        q, k, v = self.project(x, positions, context=context, value=value, context_positions=context_positions)
        q_positions, kv_positions = positions, positions if context is None else context_positions
        if cache is not None:
            k, v, kv_positions = cache.update(k, v, positions)  # (B, Hkv, Lk, D) x2, (B|1, Lk)
            if L == 1 and hasattr(cache, "decode_view"):  # the keys the newest query sees; None mask: all of them
                k, v, kv_positions, mask = cache.decode_view(k, v, kv_positions, mask)
                if mask is None and self.score_bias is None:
                    q_positions = kv_positions = None  # no mask, no bias: positions are not needed any more
        if self.bias_k is not None or self.add_zero_attn:
            k, v, mask = self._extra_keys(k, v, mask, q_positions, kv_positions, L)
            q_positions = kv_positions = None
        result = attention(q, k, v, mask, bias=self.score_bias, scale=self.scale,
                           dropout_p=self.dropout if self.training else 0.0, q_positions=q_positions,
                           kv_positions=kv_positions, backend=self.backend, return_weights=return_weights)
        out, weights = result if return_weights else (result, None)
        out = out.transpose(1, 2).reshape(B, L, self.num_heads * self.head_dim)  # (B, L, H*D)
        out = self.out_proj(out)  # (B, L, E)
        return (out, weights) if return_weights else out

    def _extra_keys(self, k, v, mask, q_positions, kv_positions, L):
        """torch's ``add_bias_kv`` / ``add_zero_attn``: append keys every query sees; the mask becomes dense."""
        B, Hkv, Lk, D = k.shape
        if mask is not None:
            if isinstance(mask, PreparedMask):
                mask = mask.dense()  # (B|1, H|1, L, Lk), bound to its own positions
            elif isinstance(mask, MaskSpec):
                mask = mask.to_dense(L if q_positions is None else q_positions,
                                     Lk if kv_positions is None else kv_positions, batch=B)  # (B|1, H|1, L, Lk)
            mask = mask.expand(*mask.shape[:-2], L, Lk) if mask.dim() >= 2 else mask
        extra = []
        if self.bias_k is not None:
            extra.append((self.bias_k.expand(B, Hkv, 1, D), self.bias_v.expand(B, Hkv, 1, D)))
        if self.add_zero_attn:
            extra.append((k.new_zeros(B, Hkv, 1, D), v.new_zeros(B, Hkv, 1, D)))
        k = torch.cat([k, *(ek for ek, _ in extra)], dim=2)  # (B, Hkv, Lk + n, D)
        v = torch.cat([v, *(ev for _, ev in extra)], dim=2)  # (B, Hkv, Lk + n, D)
        if mask is not None:
            mask = F.pad(mask, (0, len(extra)), value=True)  # (..., L, Lk + n): the extra keys are visible
        return k, v, mask

    @staticmethod
    def _check_input(t, name: str, width_name: str, width: int, batch: int | None) -> None:
        if not isinstance(t, torch.Tensor) or t.dim() != 3 or t.shape[-1] != width or (
                batch is not None and t.shape[0] != batch):
            b = "B" if batch is None else f"B={batch}"
            raise AttnkitValueError(f"{name} must have shape ({b}, L, {width_name}={width}), got {describe(t)}; attnkit modules "
                                    "are batch-first (transpose (L, B, E) inputs with .transpose(0, 1)).")

    # -------------------------------------------------------------------------------------------- from torch

    @classmethod
    def from_torch(cls, mha: nn.MultiheadAttention, *, batch_first: bool | None = None,
                   **kwargs) -> MultiHeadAttention:
        """An attnkit module computing what ``mha`` computes, with its weights copied (every configuration:
        packed or separate in-projections, ``kdim``/``vdim``, ``bias``, ``add_bias_kv``, ``add_zero_attn``).

        attnkit modules are always batch-first: ``forward(x (B, L, E), ..., context=key (B, Lk, kdim),
        value=value)``, with masks as ``ak.masks`` (True = may attend; torch's ``key_padding_mask`` ``kpm``
        becomes ``ak.masks.padding(~kpm)``). A ``batch_first=False`` module (inputs ``(L, B, E)``) is converted
        here, at this call: pass ``batch_first=True`` to confirm you will feed ``(B, L, E)`` (e.g.
        ``x.transpose(0, 1)``); without it a warning says so.
        """
        if not isinstance(mha, nn.MultiheadAttention):
            raise AttnkitTypeError(f"from_torch expects an nn.MultiheadAttention, got {describe(mha)}.")
        if batch_first is False:
            raise AttnkitValueError("batch_first=False: attnkit modules only take (B, L, E) inputs; pass "
                                    "batch_first=True and transpose (L, B, E) inputs with x.transpose(0, 1).")
        if not mha.batch_first and batch_first is None:
            warnings.warn("from_torch: the torch module takes (L, B, E) inputs (batch_first=False) but the attnkit "
                          "module takes (B, L, E): transpose inputs and outputs with .transpose(0, 1) (pass "
                          "batch_first=True to from_torch to silence this).", UserWarning, stacklevel=2)
        w = mha.in_proj_weight if mha._qkv_same_embed_dim else mha.q_proj_weight
        has_bias = mha.in_proj_bias is not None
        new = cls(mha.embed_dim, mha.num_heads, kdim=mha.kdim, vdim=mha.vdim, dropout=mha.dropout, bias=has_bias,
                  add_bias_kv=mha.bias_k is not None, add_zero_attn=mha.add_zero_attn, device=w.device,
                  dtype=w.dtype, **kwargs)
        H, D = new.num_heads, new.head_dim
        with torch.no_grad():
            if mha._qkv_same_embed_dim:
                new.qkv_proj.weight.copy_(mha.in_proj_weight)  # torch packs [Wq; Wk; Wv] like attnkit
            else:
                for ours, theirs in ((new.q_proj, mha.q_proj_weight), (new.k_proj, mha.k_proj_weight),
                                     (new.v_proj, mha.v_proj_weight)):
                    ours.weight.copy_(theirs)
            if has_bias:
                for ours, theirs in zip(new.projections()[:-1], mha.in_proj_bias.split(
                        [p.out_features for p in new.projections()[:-1]])):
                    ours.bias.copy_(theirs)
                new.out_proj.bias.copy_(mha.out_proj.bias)
            new.out_proj.weight.copy_(mha.out_proj.weight)
            if mha.bias_k is not None:
                new.bias_k.copy_(mha.bias_k.view(1, 1, H, D).transpose(1, 2))  # (1, 1, E) -> (1, H, 1, D)
                new.bias_v.copy_(mha.bias_v.view(1, 1, H, D).transpose(1, 2))
        return new

    def extra_repr(self) -> str:
        extra = "" if hasattr(self, "qkv_proj") else f", kdim={self.kdim}, vdim={self.vdim}"
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
                f"head_dim={self.head_dim}{extra}, dropout={self.dropout}, backend={self.backend!r}")


def _check_cache_call(cache, mask, positions) -> None:
    if not callable(getattr(cache, "update", None)):
        raise AttnkitTypeError(f"cache must be a KV cache with update(k, v, positions) (attnkit.cache.make_cache), "
                               f"got {describe(cache)}; build one per layer with model.new_cache(batch_size).")
    if positions is None and not callable(getattr(cache, "next_positions", None)):
        raise AttnkitValueError("positions must be given with cache= when the cache cannot say where its sequence "
                                f"continues (no next_positions(n): {type(cache).__name__}): pass the absolute positions "
                                "(B|1, L) of the new tokens, e.g. torch.arange(n_cached, n_cached + L)[None].")
    if hasattr(cache, "check_mask"):
        cache.check_mask(mask)


def init_normal(*linears: nn.Linear, std: float) -> None:
    """GPT-style init: weights from normal(0, std), biases zero."""
    for linear in linears:
        nn.init.normal_(linear.weight, mean=0.0, std=std)
        if linear.bias is not None:
            nn.init.zeros_(linear.bias)


def _check_shape_args(embed_dim, num_heads, num_kv_heads, head_dim) -> None:
    for name, value in (("embed_dim", embed_dim), ("num_heads", num_heads), ("num_kv_heads", num_kv_heads)):
        positive_int(value, name)
    if num_heads % num_kv_heads:
        raise AttnkitValueError(f"num_heads={num_heads} must be a multiple of num_kv_heads={num_kv_heads}; "
                                "choose num_kv_heads dividing num_heads (1 = MQA, num_heads = MHA).")
    if head_dim is None and embed_dim % num_heads:
        raise AttnkitValueError(f"embed_dim={embed_dim} must be divisible by num_heads={num_heads}, or pass "
                                "head_dim explicitly.")
    if head_dim is not None:
        positive_int(head_dim, "head_dim")


def position_parts(positions, head_dim: int, num_heads: int):
    """``(rotary, score_bias)`` for the ``positions`` shorthand: ``"rope"`` -> ``RoPE(D)``, ``"alibi"`` ->
    ``ALiBi(H)``; a RoPE or ALiBi instance goes to its slot."""
    if positions == "rope":
        return RoPE(head_dim), None
    if positions == "alibi":
        return None, ALiBi(num_heads)
    if isinstance(positions, RoPE):
        return positions, None
    if isinstance(positions, ALiBi):
        return None, positions
    raise AttnkitTypeError(
        f"positions must be None, 'rope', 'alibi', an ak.positions.RoPE or ALiBi, got {describe(positions)}; "
        "sinusoidal and learned embeddings are added to token embeddings by the model, not inside attention."
    )


def _check_rotary(rotary, head_dim: int):
    if rotary is None:
        return None
    if not callable(rotary):
        raise AttnkitTypeError(f"rotary must be a module f(x (B, H, L, D), positions (B|1, L)) -> x, e.g. "
                               f"ak.positions.RoPE(head_dim), got {describe(rotary)}.")
    if getattr(rotary, "head_dim", head_dim) != head_dim:
        raise AttnkitValueError(f"rotary {type(rotary).__name__} has head_dim={rotary.head_dim} but the heads have "
                                f"head_dim={head_dim}; build RoPE(head_dim={head_dim}).")
    return rotary


def _check_score_bias(score_bias, num_heads: int):
    if score_bias is None:
        return None
    if not isinstance(score_bias, StructuredBias):
        raise AttnkitTypeError(f"score_bias must be a structured bias (attnkit._bias.StructuredBias, e.g. "
                               f"ak.positions.ALiBi(num_heads)), got {describe(score_bias)}.")
    if score_bias.num_heads != num_heads:
        raise AttnkitValueError(f"score_bias {type(score_bias).__name__} has num_heads={score_bias.num_heads} but "
                                f"the module has num_heads={num_heads}; build ALiBi({num_heads}).")
    return score_bias

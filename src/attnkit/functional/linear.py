"""Linear attention (Katharopoulos et al., 2020): O(n) attention through a kernel feature map.

    out_i = phi(q_i) . S_i / (phi(q_i) . z_i + eps),   S_i = sum_j phi(k_j) v_j^T,   z_i = sum_j phi(k_j)

over keys j <= i (causal) or all real keys (non-causal). Three equivalent computations:

- ``parallel``: the quadratic form ``(phi(Q) phi(K)^T masked) V``, the executable spec, for short inputs;
- ``chunked``: chunks of C tokens attend densely inside the chunk and to the running state of earlier
  chunks, O(n C) time and O(n D^2 / C) memory, for training;
- ``recurrent``: one token at a time from an O(1) state ``(S, z)``, for decoding.

State, sums and the division run in float32 at least (float64 inputs stay float64), also under bf16
autocast; the output is cast back to the inputs' dtype. The normaliser is ``phi(q) . z + eps`` with eps > 0
and features >= 0, so it never divides by zero.

Shape legend: B batch, H query heads, Hkv key/value heads (G = H // Hkv; query head h reads KV head
h // G), L length, D head dim, Dv value head dim, C chunk size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from attnkit._checks import positive_int
from attnkit._validation import check_scalar, check_tensors
from attnkit.errors import AttnkitTypeError, AttnkitValueError, describe
from attnkit.functional.reference import expand_kv

FEATURE_MAPS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "elu1": lambda x: F.elu(x) + 1.0,
    "relu": F.relu,
}
MODES = ("auto", "parallel", "chunked", "recurrent")


@dataclass
class LinearState:
    """The recurrent state of causal linear attention after some tokens: per KV head.

    ``kv``: ``(B, Hkv, D, Dv)`` = sum of phi(k_j) v_j^T; ``k_sum``: ``(B, Hkv, D)`` = sum of phi(k_j);
    float32 (float64 for float64 inputs). ``length``: tokens absorbed so far.
    """

    kv: torch.Tensor
    k_sum: torch.Tensor
    length: int = 0

    @classmethod
    def zeros(cls, batch: int, num_kv_heads: int, head_dim: int, value_dim: int, *, dtype=torch.float32,
              device=None) -> LinearState:
        return cls(torch.zeros(batch, num_kv_heads, head_dim, value_dim, dtype=dtype, device=device),
                   torch.zeros(batch, num_kv_heads, head_dim, dtype=dtype, device=device))


def resolve_feature_map(feature_map: str | Callable) -> Callable[[torch.Tensor], torch.Tensor]:
    if callable(feature_map):
        return feature_map
    if feature_map in FEATURE_MAPS:
        return FEATURE_MAPS[feature_map]
    raise AttnkitValueError(f"feature_map must be one of {list(FEATURE_MAPS)} or a callable, got {describe(feature_map)}; "
                            "'elu1' (elu(x) + 1) is the paper's choice.")


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _features(q, k, v, feature_map, key_is_real):
    """phi(q) (B, H, L, D), phi(k) (B, Hkv, L, D) and v in the compute dtype, padded keys zeroed."""
    dtype = _compute_dtype(q.dtype)
    with torch.autocast(q.device.type, enabled=False):
        fq, fk = feature_map(q.to(dtype)), feature_map(k.to(dtype))
        v = v.to(dtype)
    if key_is_real is not None:
        real = key_is_real[:, None, :, None].to(dtype)  # (B, 1, L, 1)
        fk, v = fk * real, v * real
    return fq, fk, v


def _state_of(fk, v) -> LinearState:
    return LinearState(fk.transpose(-2, -1) @ v, fk.sum(-2), fk.shape[-2])  # (B, Hkv, D, Dv), (B, Hkv, D)


def _read(fq, state: LinearState):
    """Numerator ``(B, H, L, Dv)`` and denominator ``(B, H, L, 1)`` of queries against a state."""
    H = fq.shape[1]
    kv, k_sum = expand_kv(state.kv, H), expand_kv(state.k_sum.unsqueeze(-1), H)  # (B, H, D, Dv), (B, H, D, 1)
    return fq @ kv, fq @ k_sum


def _chunked(fq, fk, v, state: LinearState, chunk: int, eps: float):
    """Causal linear attention in chunks of ``chunk`` tokens, starting from ``state``; returns (out, state)."""
    B, H, L, D = fq.shape
    Hkv, Dv = fk.shape[1], v.shape[-1]
    n = -(-L // chunk)  # number of chunks
    pad = n * chunk - L
    if pad:  # zero features add nothing to sums; the padded queries are dropped at the end
        fq, fk, v = (F.pad(t, (0, 0, 0, pad)) for t in (fq, fk, v))
    cq = fq.view(B, H, n, chunk, D)  # (B, H, N, C, D)
    ck = fk.view(B, Hkv, n, chunk, D)  # (B, Hkv, N, C, D)
    cv = v.view(B, Hkv, n, chunk, Dv)  # (B, Hkv, N, C, Dv)
    chunk_kv = ck.transpose(-2, -1) @ cv  # (B, Hkv, N, D, Dv): each chunk's own sum
    chunk_ksum = ck.sum(-2)  # (B, Hkv, N, D)
    # state before each chunk: the initial state plus all earlier chunks (an exclusive prefix sum, shifted
    # rather than subtracted so that later chunks can't touch earlier ones, not even by rounding)
    prev_kv = torch.cat([state.kv.unsqueeze(2), chunk_kv[:, :, :-1]], dim=2).cumsum(2)  # (B, Hkv, N, D, Dv)
    prev_ksum = torch.cat([state.k_sum.unsqueeze(2), chunk_ksum[:, :, :-1]], dim=2).cumsum(2)  # (B, Hkv, N, D)
    inter_num = cq @ expand_kv(prev_kv, H)  # (B, H, N, C, Dv)
    inter_den = cq @ expand_kv(prev_ksum, H).unsqueeze(-1)  # (B, H, N, C, 1)
    intra = (cq @ expand_kv(ck.flatten(2, 3), H).view(B, H, n, chunk, D).transpose(-2, -1)).tril()  # (B, H, N, C, C)
    intra_num = intra @ expand_kv(cv.flatten(2, 3), H).view(B, H, n, chunk, Dv)  # (B, H, N, C, Dv)
    out = (inter_num + intra_num) / (inter_den + intra.sum(-1, keepdim=True) + eps)
    out = out.view(B, H, n * chunk, Dv)[:, :, :L]  # (B, H, L, Dv)
    final = LinearState(prev_kv[:, :, -1] + chunk_kv[:, :, -1], prev_ksum[:, :, -1] + chunk_ksum[:, :, -1],
                        state.length + L)
    return out, final


def _recurrent(fq, fk, v, state: LinearState, eps: float):
    """Token by token from ``state``: the decoding form. Returns (out, state)."""
    kv, k_sum, outs = state.kv, state.k_sum, []
    for t in range(fq.shape[2]):
        k_t, v_t = fk[:, :, t], v[:, :, t]  # (B, Hkv, D), (B, Hkv, Dv)
        kv = kv + k_t.unsqueeze(-1) * v_t.unsqueeze(-2)  # (B, Hkv, D, Dv)
        k_sum = k_sum + k_t
        num, den = _read(fq[:, :, t:t + 1], LinearState(kv, k_sum))  # (B, H, 1, Dv), (B, H, 1, 1)
        outs.append(num / (den + eps))
    out = torch.cat(outs, dim=2) if outs else fq.new_zeros(*fq.shape[:3], v.shape[-1])  # (B, H, L, Dv)
    return out, LinearState(kv, k_sum, state.length + fq.shape[2])


def _check_call(q, k, v, *, causal, chunk_size, eps, key_is_real, mode, state, return_state) -> float:
    """The checks of :func:`linear_attention`'s arguments (typed errors naming each); returns ``eps`` as a float."""
    check_tensors(q, k, v)
    if q.shape[2] != k.shape[2]:
        raise AttnkitValueError(f"linear attention needs q and k of one length, got Lq={q.shape[2]}, Lk={k.shape[2]}; "
                                "carry earlier tokens in state= instead of longer keys.")
    eps = check_scalar(eps, "eps", low=0.0, high=float("inf"), low_open=True, fix="use a small positive eps like 1e-6.")
    positive_int(chunk_size, "chunk_size", "64 is a good default.")
    if mode not in MODES:
        raise AttnkitValueError(f"mode must be one of {MODES}, got {mode!r}.")
    if not causal and (state is not None or return_state):
        raise AttnkitValueError("state/return_state need causal=True: non-causal linear attention has one global "
                                "summary, not a running state; pass causal=True or drop state.")
    B, _, L, _ = q.shape
    if key_is_real is not None and (not isinstance(key_is_real, torch.Tensor) or key_is_real.dtype != torch.bool
                                    or tuple(key_is_real.shape) != (B, L)):
        raise AttnkitTypeError(f"key_is_real must be a bool tensor of shape ({B}, {L}) (True = real token), got "
                               f"{describe(key_is_real)}.")
    return eps


def _parallel(fq, fk, fv, state: LinearState, eps: float):
    """The quadratic causal form over the call's L tokens, after ``state``'s earlier tokens."""
    H, L = fq.shape[1], fq.shape[2]
    num, den = _read(fq, state)  # contribution of earlier tokens (zero for a fresh state)
    scores = (fq @ expand_kv(fk, H).transpose(-2, -1)).tril()  # (B, H, L, L)
    out = (num + scores @ expand_kv(fv, H)) / (den + scores.sum(-1, keepdim=True) + eps)  # (B, H, L, Dv)
    new = _state_of(fk, fv)
    return out, LinearState(state.kv + new.kv, state.k_sum + new.k_sum, state.length + L)


def linear_attention(q, k, v, *, feature_map: str | Callable = "elu1", causal: bool = True,
                     chunk_size: int = 64, eps: float = 1e-6, key_is_real: torch.Tensor | None = None,
                     mode: str = "auto", state: LinearState | None = None, return_state: bool = False):
    """Linear attention with feature map phi (default ``elu(x) + 1``), applied to q and k as given (no scale).

    Args:
        q: ``(B, H, L, D)``; k: ``(B, Hkv, L, D)``; v: ``(B, Hkv, L, Dv)``; H % Hkv == 0.
        feature_map: ``"elu1"``, ``"relu"`` or a callable producing non-negative features.
        causal: token i attends to j <= i (plus everything in ``state``); else to all real keys.
        chunk_size: C for the chunked form.
        eps: added to the normaliser (> 0).
        key_is_real: bool ``(B, L)``, False for padding keys (they add nothing to any sum).
        mode: "auto" (recurrent for one token with a state, parallel for L <= chunk_size, else chunked),
            "parallel", "chunked" or "recurrent".
        state: a :class:`LinearState` to continue from (causal only): decoding and chunked prefill.
        return_state: also return the state after these tokens (causal only).

    Returns:
        ``(B, H, L, Dv)`` in q's dtype, or ``(out, LinearState)`` with ``return_state=True``.
    """
    eps = _check_call(q, k, v, causal=causal, chunk_size=chunk_size, eps=eps, key_is_real=key_is_real, mode=mode,
                      state=state, return_state=return_state)
    B, H, L, _ = q.shape
    fq, fk, fv = _features(q, k, v, resolve_feature_map(feature_map), key_is_real)
    if state is None:
        state = LinearState.zeros(B, k.shape[1], k.shape[3], v.shape[3], dtype=fq.dtype, device=q.device)
    elif state.kv.shape != (B, k.shape[1], k.shape[3], v.shape[3]):
        raise AttnkitValueError(f"state holds kv of shape {tuple(state.kv.shape)} but this call needs "
                                f"{(B, k.shape[1], k.shape[3], v.shape[3])} (B, Hkv, D, Dv); start a new state.")
    if mode == "auto":
        mode = "recurrent" if L == 1 else "parallel" if chunk_size >= L and state.length == 0 else "chunked"

    if not causal:
        summary = _state_of(fk, fv)
        num, den = _read(fq, summary)
        out, final = num / (den + eps), None
    elif mode == "parallel":
        out, final = _parallel(fq, fk, fv, state, eps)
    elif mode == "chunked":
        out, final = _chunked(fq, fk, fv, state, chunk_size, eps)
    else:
        out, final = _recurrent(fq, fk, fv, state, eps)
    out = out.to(q.dtype)
    return (out, final) if return_state else out

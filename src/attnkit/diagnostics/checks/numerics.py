"""Numerics of the softmax: the scale, where the mask goes, low precision and fully masked rows (agreement of
every backend with the float64 reference: :mod:`.agreement`).

The probabilities of a bare function are read with values set to the identity: with ``v[j] = e_j`` the
output row i *is* the probability row ``p_i`` (needs D >= Lk).

Shape legend: B batch, H heads, Lq/Lk lengths, D head_dim.
"""

from __future__ import annotations

import math
import sys
from typing import NamedTuple

import torch
from torch import nn

from attnkit.diagnostics.capture import capture
from attnkit.diagnostics.checks.base import (
    FAIL,
    INFO,
    PASS,
    Options,
    Outcome,
    Skip,
    all_finite,
    check,
    fn_inputs,
    gen,
    model_device,
    randn,
    run_main,
    sample_inputs,
    tokens_for,
)
from attnkit.diagnostics.checks.leaks import embedding_probe
from attnkit.diagnostics.departures import intended_scale, scale_text


def identity_values(B: int, H: int, Lk: int, D: int, dtype=torch.float64) -> torch.Tensor:
    """``v (B, H, Lk, D)`` with ``v[..., j, j] = 1``: then ``out[..., i, :Lk]`` equals the probabilities."""
    v = torch.zeros(B, H, Lk, D, dtype=dtype)
    v[..., torch.arange(Lk), torch.arange(Lk)] = 1.0
    return v


# --------------------------------------------------------------------------------------------- scale

def classify_scale(measured: float, head_dim: int) -> tuple[str, str]:
    """(status, text) for an effective softmax scale against 1/sqrt(d_k)."""
    expected = 1.0 / math.sqrt(head_dim)

    def near(a, b):
        return abs(a - b) <= 1e-3 * b

    text = f"effective scale {measured:.4g}, expected 1/sqrt(d_k={head_dim}) = {expected:.4g}"
    if near(measured, expected):
        return PASS, text
    if near(measured, 1.0):
        return FAIL, f"missing scale: scores are not divided by sqrt(d_k) ({text})"
    if near(measured, 1.0 / head_dim):
        return FAIL, f"scores divided by d_k instead of sqrt(d_k) ({text})"
    return FAIL, f"wrong scale ({text})"


def measure_scale(fn, head_dim: int, delta: float = 2.0) -> float:
    """The effective scale of ``fn`` from two keys whose raw dot products with the query differ by ``delta``."""
    q = torch.zeros(1, 1, 1, head_dim, dtype=torch.float64)
    q[..., 0] = 1.0
    k = torch.zeros(1, 1, 2, head_dim, dtype=torch.float64)
    k[..., 0, 0] = delta  # q.k0 - q.k1 = delta
    with torch.no_grad():
        p = fn(q, k, identity_values(1, 1, 2, head_dim), None)[0, 0, 0, :2]  # (2,) probabilities
    return math.log(float(p[0]) / float(p[1])) / delta


class Call(NamedTuple):
    """One observed attention call: its layer's name, the scale it used, its head dim and its layer index (HF)."""

    layer: str
    scale: float
    head_dim: int
    index: int | None = None


def _hf_scales(s, options: Options) -> list[Call]:
    """(layer, scaling, head_dim, layer index) of every attention call of a Hugging Face model, read through a pass-through
    attention implementation registered with ``transformers.AttentionInterface``. The call goes on to the model's own
    eager attention (its modelling file's ``eager_attention_forward``: softcapping, sinks and whatever else the family
    passes are served as the family serves them), else to SDPA."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

    seen: list[Call] = []

    def observe(module, query, key, value, attention_mask, scaling=None, **kwargs):
        D = query.shape[-1]
        index = getattr(module, "layer_idx", None)
        seen.append(Call(type(module).__name__ + f"#{len(seen)}", 1 / math.sqrt(D) if scaling is None else float(scaling),
                         D, index if isinstance(index, int) else None))
        inner = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
        return (inner or ALL_ATTENTION_FUNCTIONS["sdpa"])(module, query, key, value, attention_mask, scaling=scaling,
                                                          **kwargs)

    AttentionInterface.register("attnkit_doctor", observe)
    model = s.module
    original = model.config._attn_implementation
    model.set_attn_implementation("attnkit_doctor")
    try:
        with torch.no_grad():
            run_main(s, sample_inputs(s, options))
    finally:
        model.set_attn_implementation(original)
    return seen


def _hf_implementations() -> tuple[str, ...]:
    """eager and sdpa, and attnkit's own implementation when ``attnkit.integrations.hf`` is importable."""
    try:
        import attnkit.integrations.hf  # noqa: F401  (registers attn_implementation="attnkit")
    except (ImportError, RuntimeError):
        return ("eager", "sdpa")
    return ("eager", "sdpa", "attnkit")


@check("scale", "softmax scale",
       "Multiply the scores by 1/sqrt(d_k), d_k = the head dim (not the model width), before the softmax.", order=50)
def scale(subject, options) -> Outcome:
    found: list[tuple[str, str]] = []  # (status, text)
    details: dict = {}
    if subject.fn is not None:
        measured = measure_scale(subject.fn, options.head_dim)
        details["measured"] = measured
        status, text = classify_scale(measured, options.head_dim)
        found.append((status, f"{subject.fn_note}: {text}"))
    calls = _model_scales(subject, options)
    intended = intended_scale(subject.module) if subject.module is not None else None
    verdicts = [_call_verdict(call, intended) for call in calls]
    found += [(status, f"layer {call.layer}: {text}") for call, (status, text) in zip(calls, verdicts) if status == FAIL]
    if calls:
        details["calls"] = [{"layer": c.layer, "scale": c.scale, "head_dim": c.head_dim} for c in calls]
        if intended is not None:
            details["intended"] = intended.line()
        n_intended = sum(status == INFO for status, _ in verdicts)
        if n_intended and all(status != FAIL for status, _ in verdicts):
            found.append((INFO, f"{n_intended} of {len(calls)} attention calls use "
                          + next(text for status, text in verdicts if status == INFO)))
        elif all(status == PASS for status, _ in verdicts):
            found.append((PASS, f"{len(calls)} attention calls of the model use 1/sqrt(d_k)"))
    if not found:
        raise Skip("needs the attention function (q, k) or a model whose attention calls can be observed")
    bad = [f for f in found if f[0] == FAIL]
    status = FAIL if bad else INFO if any(f[0] == INFO for f in found) else PASS
    return Outcome(status, "; ".join(t for _, t in (bad or found)), details)


def _model_scales(subject, options) -> list[Call]:
    """Every attention call of the subject's model (none for a bare function)."""
    if subject.module is None or (subject.seq is None and subject.lm is None):
        return []
    s = subject.cast(torch.float32)
    if subject.kind == "huggingface":
        return _hf_scales(s, options)
    with torch.no_grad(), capture(s.module, rows=[-1]) as cap:  # any calls into attnkit.attention
        run_main(s, sample_inputs(s, options))
    return [Call(r.layer, r.scale, r.head_dim) for r in cap.records]


def _call_verdict(call: Call, intended) -> tuple[str, str]:
    """(status, text) of one call's scale: 1/sqrt(d_k) PASSes unless the config intends another scale; the scale the
    config intends is INFO (naming its field; PASS when it is 1/sqrt(d_k) too); any other scale FAILs."""
    status, text = classify_scale(call.scale, call.head_dim)
    meant = None if intended is None else intended.scale_at(call.index)
    if meant is None:
        return status, text
    if abs(call.scale - meant) <= 1e-3 * meant:
        return (PASS, text) if status == PASS else (INFO, scale_text(intended, call.head_dim, meant))
    why = "the config's field is ignored" if status == PASS else text
    return FAIL, f"scale {call.scale:.4g} is not the {meant:.4g} that config.{intended.field}={intended.value!r} sets ({why})"


# ----------------------------------------------------------------------------------------- mask placement

@check("mask-placement", "mask placement",
       "Apply the mask to the scores before the softmax (where(mask, scores, -inf) with a safe softmax); never "
       "multiply the probabilities by the mask after the softmax.", order=60)
def mask_placement(subject, options) -> Outcome:
    if subject.fn is None:
        raise Skip("needs the attention function (the probabilities are read from it with v = identity)")
    B, H, L, D = options.batch, options.heads, options.seq_len, max(options.head_dim, options.seq_len)
    g = gen(options, 8)
    q, k = randn((B, H, L, D), g), randn((B, H, L, D), g)
    keep = torch.rand(L, L, generator=g) > 0.3
    mask = (torch.ones(L, L, dtype=torch.bool).tril() & keep) | torch.eye(L, dtype=torch.bool)  # (L, L)
    with torch.no_grad():
        p = subject.fn(q, k, identity_values(B, H, L, D), mask)[..., :L].double()  # (B, H, L, L) probabilities
    masked = float(p.masked_fill(mask, 0).abs().sum(-1).max())
    sums = p.sum(-1)
    low, high = float(sums.min()), float(sums.max())
    details = {"masked_mass": masked, "row_sum_min": low, "row_sum_max": high, "of": subject.fn_note}
    if masked > 1e-9:
        return Outcome(FAIL, f"masked keys get probability (up to {masked:.3g} per row): the mask is not applied to "
                       "the scores (or has the wrong polarity: True must mean may attend)", details)
    if low < 1 - 1e-6:
        return Outcome(FAIL, f"mask applied after softmax: masked keys get 0 but rows sum to {low:.4g} < 1 (their "
                       "probability is dropped instead of renormalised)", details)
    if high > 1 + 1e-6:
        return Outcome(FAIL, f"rows sum to {high:.4g} > 1: the probabilities are not normalised", details)
    return Outcome(PASS, f"masked keys get exactly 0 and rows sum to 1 (|sum - 1| <= {max(1 - low, high - 1):.1e})",
                   details)


# ------------------------------------------------------------------------------------------ low precision

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _finite_fn(fn, options: Options, dtype) -> str | None:
    """None if output and gradients are finite with a fully masked row; else what went wrong."""
    q, k, v = (a.to(dtype).requires_grad_(True) for a in fn_inputs(options, offset=9))
    L = options.seq_len
    mask = torch.ones(L, L, dtype=torch.bool).tril()
    mask[L // 2] = False  # a fully masked row
    out = fn(q, k, v, mask)
    if not torch.isfinite(out).all():
        return f"non-finite output in rows {_bad_rows(out, 2)}"
    out.float().sum().backward()
    if not all(torch.isfinite(a.grad).all() for a in (q, k, v)):
        return "non-finite gradients"
    return None


def _bad_rows(t: torch.Tensor, dim: int) -> list[int]:
    bad = (~torch.isfinite(t)).movedim(dim, 0).reshape(t.shape[dim], -1).any(1)
    return bad.nonzero().flatten().tolist()


def _finite_model(subject, options: Options, dtype) -> str | None:
    """None if the outputs (hidden states, and the head's logits at a few positions) and the gradients of every
    parameter are finite in ``dtype`` with fully masked rows; else what went wrong. Token embeddings are probed
    at their output (the table's gradient is a scatter of it), so the V-wide tables are never scanned."""
    s = subject.cast(dtype)
    L = options.seq_len
    if s.lm is not None:
        dev = model_device(s)
        tokens = tokens_for(s.lm.vocab_size, 2, L, gen(options, 9), dev)
        key_is_real = torch.ones(2, L, dtype=torch.bool, device=dev)
        key_is_real[0, :3] = False  # left padding: the pad queries see no key under a causal mask
        key_is_real[1, :] = False  # a fully padded row
        positions = (key_is_real.long().cumsum(1) - 1).clamp_min(0)
        with embedding_probe(s.module, tokens.shape) as leaves:
            out = s.lm.per_position(tokens, key_is_real=key_is_real,
                                    positions=positions if s.lm.supports_positions else None)  # (2, L, E|V)
        if s.lm.hidden is not None and s.lm.head is not None:
            few = torch.tensor(sorted({0, 3, L // 2, L - 1}), device=dev)  # a few positions of the LM head
            logits = s.lm.head(out[:, few])  # (2, n, V)
            if not all_finite(logits):
                return f"non-finite logits at positions {_bad_rows(logits, 1)} of {few.tolist()}"
        loss_part = out[0, 3:]
    else:
        x = sample_inputs(s, options, dtype=dtype)
        mask = torch.ones(L, L, dtype=torch.bool, device=x.device).tril()
        mask[L // 2] = False  # a fully masked row
        out = s.seq(x, mask)
        loss_part, leaves = out, []
    if not all_finite(out):
        return f"non-finite output at positions {_bad_rows(out, 1)}"
    tables = {id(m.weight) for m in s.module.modules() if isinstance(m, nn.Embedding)}
    named = [(n, p) for n, p in s.module.named_parameters() if p.requires_grad and id(p) not in tables]
    grads = torch.autograd.grad(loss_part.float().sum(), [p for _, p in named] + list(leaves), allow_unused=True)
    bad = [n for (n, _), g in zip(named, grads) if g is not None and not all_finite(g)]
    if leaves and grads[-1] is not None and not all_finite(grads[-1]):
        bad.append("token embeddings")
    if bad:
        return f"non-finite gradients in {bad[:3]}"
    return None


def _unsupported_kernel(exc: Exception) -> bool:
    text = str(exc)
    return isinstance(exc, (NotImplementedError, RuntimeError)) and "not implemented for" in text


@check("low-precision", "fully masked rows and low precision",
       "Never use a literal like -1e9 for masked scores (it overflows float16, max 65504): use -inf with a safe "
       "softmax (fully masked rows -> 0) or torch.finfo(scores.dtype).min in a where; run the softmax in float32.", order=80)
def low_precision(subject, options) -> Outcome:
    if subject.seq is not None or subject.lm is not None:
        run, where = (lambda dt: _finite_model(subject, options, dt)), "model"
        if subject.lm is not None and subject.lm.hidden is not None:  # what _finite_model reads
            where += " (hidden states" + (", the LM head at a few positions)" if subject.lm.head is not None else ")")
    elif subject.fn is not None:
        run, where = (lambda dt: _finite_fn(subject.fn, options, dt)), "function"
    else:
        raise Skip("needs an attention function, a module or a token model")
    problems: dict[str, str] = {}
    skipped: list[str] = []
    for dtype in DTYPES:
        name = str(dtype).replace("torch.", "")
        if where.startswith("model") and subject.rebuild is None and dtype != torch.float32:
            skipped.append(name)  # an adapter subject can't be copied into another dtype
            continue
        try:
            why = run(dtype)
        except Exception as exc:  # noqa: BLE001 - an error in low precision is a finding
            if _unsupported_kernel(exc):
                skipped.append(name)
                continue
            why = f"raised {type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
        if why:
            problems[name] = why
    details = {"problems": problems, "unsupported_here": skipped}
    tested = [str(d).replace("torch.", "") for d in DTYPES if str(d).replace("torch.", "") not in skipped]
    note = f" ({', '.join(skipped)} not tested: unsupported here or the subject can't be cast)" if skipped else ""
    if not problems:
        return Outcome(PASS, f"{where} output and gradients finite with fully masked rows in {', '.join(tested)}{note}",
                       details)
    if "float32" in problems:
        return Outcome(FAIL, f"fully masked rows break float32: {problems['float32']} (softmax over a row of -inf is "
                       "NaN: use a safe softmax)", details)
    if "float16" in problems and "bfloat16" not in problems:
        return Outcome(FAIL, f"float16 overflow: {problems['float16']} - a mask value like -1e9 does not fit in "
                       "float16", details)
    first = next(iter(problems))
    return Outcome(FAIL, f"{first}: {problems[first]}", details)


# ------------------------------------------------------------------------------------------ backend agreement

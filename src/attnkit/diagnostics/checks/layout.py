"""Head/sequence layout: without masks (and with positions permuted along), permuting the tokens must
permute the outputs. A ``view(B, H, L, D)`` of a ``(B, L, H*D)`` tensor (no transpose) mixes tokens and fails.

Shape legend: B batch, H heads, L length, E embed_dim, D head_dim.
"""

from __future__ import annotations

import torch

from attnkit.diagnostics.checks.base import (
    FAIL,
    PASS,
    Outcome,
    Skip,
    check,
    fn_inputs,
    gen,
    max_diff,
    precise,
    tolerance,
    x_inputs,
)
from attnkit.diagnostics.subjects import attnkit_attention_modules, module_subject


@check("layout", "head/sequence layout",
       "Split heads with x.view(B, L, H, D).transpose(1, 2) and merge them back with out.transpose(1, 2)"
       ".reshape(B, L, H * D); never view (B, L, E) directly as (B, H, L, D).", order=70)
def layout(subject, options) -> Outcome:
    L = options.seq_len
    perm = torch.randperm(L, generator=gen(options, 12))
    where = ""
    if subject.seq is None and subject.lm is not None:
        inner = attnkit_attention_modules(subject.module) if subject.module is not None else []
        if not inner:
            raise Skip("a token model has positions built in: permuting tokens changes its output by design; "
                       "examine its attention module or function instead")
        name, module = inner[0]
        subject, where = module_subject(module), f" (attention module {name})"
    if subject.seq is not None:
        probe = precise(subject, options)
        s = probe.subject
        x = x_inputs(s, options, L, dtype=probe.dtype)
        where += probe.note
        with torch.no_grad():
            if s.seq_positions:  # token i of the permuted input is token perm[i], at position perm[i]
                out = s.seq(x, None, positions=torch.arange(L, device=x.device)[None])
                moved = s.seq(x[:, perm], None, positions=perm.to(x.device)[None])
            else:
                out, moved = s.seq(x, None), s.seq(x[:, perm], None)
        expected = out[:, perm]
    elif subject.fn is not None:
        q, k, v = fn_inputs(options, offset=13)
        with torch.no_grad():
            out = subject.fn(q, k, v, None)
            moved = subject.fn(q[:, :, perm], k[:, :, perm], v[:, :, perm], None)
        expected = out[:, :, perm]
    else:
        raise Skip("needs an attention function, a module or a token model")
    err, tol = max_diff(moved, expected), tolerance(expected)
    details = {"change": err, "tol": tol, "permutation": perm.tolist()}
    if err > tol:
        return Outcome(FAIL, f"permuting the tokens does not permute the outputs{where} (off by {err:.2e}): heads and "
                       "sequence are mixed (a view without transpose?)", details)
    return Outcome(PASS, f"permuting the tokens permutes the outputs{where} ({err:.1e})", details)

"""KV cache: decoding token by token and in chunks must equal one full forward, with positions continuing.

Shape legend: B batch, L length, V vocab size.
"""

from __future__ import annotations

import torch

from attnkit.diagnostics.checks.base import (
    FAIL,
    PASS,
    Outcome,
    Skip,
    check,
    first_bad_position,
    gen,
    max_diff,
    model_device,
    precise,
    tokens_for,
    tolerance,
)


def decode(lm, tokens: torch.Tensor, chunks: list[int], *, explicit_positions: bool = True) -> torch.Tensor:
    """Run ``tokens (B, L)`` through a fresh cache in chunks of the given sizes; the per-position outputs
    ``(B, L, E|V)`` (hidden states when the adapter has them, else logits)."""
    cache = lm.new_cache(tokens.shape[0])
    outs, start = [], 0
    for size in chunks:
        piece = tokens[:, start:start + size]
        positions = torch.arange(start, start + size, device=tokens.device)[None] if explicit_positions else None
        outs.append(lm.per_position(piece, positions=positions, cache=cache))
        start += size
    return torch.cat(outs, 1)


@check("kv-cache", "KV cache",
       "Store keys at their absolute positions, give new tokens positions = number of cached tokens + arange(L_new) "
       "(RoPE and learned embeddings too), and align the causal mask bottom-right (never SDPA is_causal=True with "
       "Lq != Lk).", order=40)
def kv_cache(subject, options) -> Outcome:
    lm = subject.lm
    if lm is None or lm.new_cache is None:
        raise Skip("needs a causal token model with a cache (model.new_cache(batch))")
    probe = precise(subject, options)
    s = probe.subject
    lm = s.lm
    try:
        lm.new_cache(1)
    except Exception as exc:  # noqa: BLE001 - the model says it can't make a cache here
        raise Skip(f"new_cache failed: {type(exc).__name__}: {exc}") from None
    L = options.seq_len
    tokens = tokens_for(lm.vocab_size, options.batch, L, gen(options, 6), model_device(s))
    modes = {"token by token": [1] * L, "chunked (prefill 3, then 2, 3, ...)": _chunks(L)}
    with torch.no_grad():
        full = lm.per_position(tokens)  # (B, L, E|V)
        tol = tolerance(full)
        results, where = {}, {}
        for name, chunks in modes.items():
            out = decode(lm, tokens, chunks)
            results[name], where[name] = max_diff(out, full), first_bad_position(out, full, 1, tol)
        if lm.infers_cache_positions:
            name = "token by token, positions inferred from the cache"
            out = decode(lm, tokens, [1] * L, explicit_positions=False)
            results[name], where[name] = max_diff(out, full), first_bad_position(out, full, 1, tol)
    details = {"changes": results, "first_bad_position": where, "tol": tol}
    bad = [k for k, v in results.items() if v > tol]
    if bad:
        worst = max(bad, key=results.get)
        return Outcome(FAIL, f"cached decoding drifts from the full forward: {worst} differs by {results[worst]:.2e} "
                       f"from position {where[worst]} on (tol {tol:.0e}){probe.note}", details)
    return Outcome(PASS, f"{', '.join(results)} equal the full forward (max {max(results.values()):.1e}){probe.note}",
                   details)


def _chunks(L: int) -> list[int]:
    sizes, total, step = [min(3, L)], min(3, L), 2
    while total < L:
        sizes.append(min(step, L - total))
        total += sizes[-1]
        step = 5 - step  # 2, 3, 2, 3, ...
    return sizes

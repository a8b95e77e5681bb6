"""Cached decoding equals the full forward: token by token, random chunks, any prefill length, every position
scheme, MHA/GQA/MQA, with and without sliding windows (across the ring wrap), for every cache kind, and for a
left-padded batch. fp32: max abs diff of logits <= 1e-5, and the same greedy tokens."""

from __future__ import annotations

import random

import pytest
import torch

from attnkit.models.generation import generate, left_pad
from cache.tiny_decoder import TinyDecoder

TOL = 1e-5
SCHEMES = ["none", "rope", "alibi", "sinusoidal", "learned"]
HEADS = [(4, 4), (4, 2), (4, 1)]


def cached_logits(model, tokens, chunks, kind, positions=None, key_is_real=None):
    """Feed ``tokens`` (B, T) through a fresh cache in chunks of the given sizes; logits (B, T, V)."""
    B, T = tokens.shape
    positions = torch.arange(T)[None] if positions is None else positions  # (B|1, T)
    cache = model.new_cache(B, kind=kind, max_length=T)
    out, i = [], 0
    for n in chunks:
        real = None if key_is_real is None else key_is_real[:, : i + n]
        out.append(model(tokens[:, i:i + n], positions=positions[:, i:i + n], cache=cache, key_is_real=real))
        i += n
    assert i == T
    return torch.cat(out, dim=1)


def chunkings(T: int, seed: int) -> dict[str, list[int]]:
    rng = random.Random(seed)
    sizes, left = [], T
    while left:
        sizes.append(min(left, rng.randint(1, 7)))
        left -= sizes[-1]
    prefill = rng.randint(1, T - 1)
    return {"token_by_token": [1] * T, "random_chunks": sizes, "prefill_then_decode": [prefill] + [1] * (T - prefill),
            "one_shot": [T]}


def greedy_without_cache(model, prompt: list[int], n: int) -> list[int]:
    tokens = torch.tensor([prompt])
    for _ in range(n):
        nxt = model(tokens, positions=torch.arange(tokens.shape[1])[None])[:, -1].argmax(-1)
        tokens = torch.cat([tokens, nxt[:, None]], dim=1)
    return tokens[0, len(prompt):].tolist()


CASES = [(s, h, w, kind) for s in SCHEMES for h in HEADS for w in (None, 5)
         for kind in ("dynamic", "static", *(("sliding",) if w else ()))]


@pytest.mark.parametrize(("scheme", "heads", "window", "kind"), CASES, ids=lambda v: str(v))
def test_cached_logits_equal_full_forward(scheme, heads, window, kind):
    torch.manual_seed(CASES.index((scheme, heads, window, kind)))
    model = TinyDecoder(positions=scheme, heads=heads[0], kv_heads=heads[1], window=window).eval()
    tokens = torch.randint(0, 53, (2, 19))  # 19 > 3 * window: the sliding ring wraps several times
    with torch.no_grad():
        full = model(tokens)
        for name, chunks in chunkings(19, seed=len(CASES)).items():
            got = cached_logits(model, tokens, chunks, kind)
            err = float((got - full).abs().max())
            assert err <= TOL, f"{name} {chunks}: max abs diff {err:.2e}"


@pytest.mark.parametrize("kind", ["dynamic", "static", "sliding"])
@pytest.mark.parametrize("scheme", ["rope", "alibi", "learned"])
def test_greedy_tokens_equal_recomputed_full_forward(scheme, kind):
    model = TinyDecoder(positions=scheme, heads=4, kv_heads=2, window=4 if kind == "sliding" else None).eval()
    prompt = [3, 17, 8, 41, 5]
    with torch.no_grad():
        want = greedy_without_cache(model, prompt, 12)
    assert generate(model, [prompt], max_new_tokens=12, cache=kind) == [want]


@pytest.mark.parametrize(("kind", "window"), [("dynamic", None), ("static", None), ("sliding", 3), ("dynamic", 3)])
@pytest.mark.parametrize("scheme", ["rope", "alibi", "learned", "sinusoidal"])
def test_left_padded_batch_equals_rows_alone(scheme, kind, window):
    """Each row of a left-padded batch, cached and chunked, gives the logits of that prompt alone."""
    model = TinyDecoder(positions=scheme, heads=4, kv_heads=1, window=window).eval()
    prompts = [[5, 9, 2, 7, 1, 8, 3, 4, 6], [11, 12], [20, 21, 22, 23, 24]]
    tokens, positions, key_is_real = left_pad(prompts)
    T = tokens.shape[1]
    with torch.no_grad():
        batched_full = model(tokens, positions=positions, key_is_real=key_is_real)
        batched = {name: cached_logits(model, tokens, chunks, kind, positions, key_is_real)
                   for name, chunks in chunkings(T, seed=3).items()}
        for row, prompt in enumerate(prompts):
            alone = model(torch.tensor([prompt]))[0]  # (len, V)
            n = len(prompt)
            assert float((batched_full[row, T - n:] - alone).abs().max()) <= TOL
            for name, logits in batched.items():
                err = float((logits[row, T - n:] - alone).abs().max())
                assert err <= TOL, f"row {row}, {name}: {err:.2e}"
        wants = [greedy_without_cache(model, p, 6) for p in prompts]
    assert generate(model, prompts, max_new_tokens=6, cache=kind) == wants


def test_a_broken_cache_is_caught():
    """Mutation check: a cache that drops the oldest key makes the equivalence test fail."""
    from attnkit.cache import DynamicCache

    class Forgetful(DynamicCache):
        def _store(self, k, v, positions):
            k_all, v_all, pos = super()._store(k, v, positions)
            return k_all[:, :, 1:], v_all[:, :, 1:], pos[:, 1:]

    model = TinyDecoder(positions="rope").eval()
    model.new_cache = lambda b, kind, max_length: [Forgetful(b, 4, 8) for _ in model.blocks]
    tokens = torch.randint(0, 53, (1, 9))
    with torch.no_grad():
        err = float((cached_logits(model, tokens, [4, 1, 1, 1, 1, 1], "dynamic") - model(tokens)).abs().max())
    assert err > 1e-3

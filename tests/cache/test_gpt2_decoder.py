"""The benchmark's attnkit GPT-2 equals transformers' GPT2LMHeadModel with the same weights (a fair race)."""

from __future__ import annotations

import pytest
import torch

from attnkit.models.generation import generate

pytest.importorskip("transformers")
from attnkit.bench.decode import _hf_generate, bare_torch_greedy, gpt2_decoder, gpt2_from_hf, hf_gpt2  # noqa: E402


def test_gpt2_decoder_matches_transformers():
    torch.manual_seed(0)
    hf = hf_gpt2(97, 32, 2, 4, "sdpa", max_positions=64)
    ours = gpt2_from_hf(hf)
    tokens = torch.randint(0, 97, (2, 11))
    with torch.no_grad():
        assert float((ours(tokens) - hf(tokens).logits).abs().max()) <= 1e-5
    want = _hf_generate(hf, tokens, 7)[:, 11:].tolist()
    assert generate(ours, tokens.tolist(), max_new_tokens=7) == want
    assert generate(ours, tokens.tolist(), max_new_tokens=7, cache="static") == want
    assert bare_torch_greedy(ours, tokens, 7).tolist() == want  # the benchmark's bare-torch ceiling is the same model


def test_sliding_gpt2_decoder_runs_past_its_window():
    torch.manual_seed(0)
    model = gpt2_decoder(vocab=31, dim=16, layers=1, heads=2, positions="rope", window=4)
    out = generate(model, [[1, 2, 3]], max_new_tokens=12, cache="sliding")
    assert out == generate(model, [[1, 2, 3]], max_new_tokens=12, cache="dynamic")
    assert model.new_cache(1, kind="sliding")[0].memory_bytes() == 4 * 16 * 4 * 2 + 4 * 8

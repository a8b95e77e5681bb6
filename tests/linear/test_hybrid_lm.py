"""LinearAttention as a per-layer choice in TransformerLM: hybrids train, decode with the state cache and
equal the full forward."""

from __future__ import annotations

import pytest
import torch

from attnkit.models.generation import generate
from attnkit.models.lm import LMConfig, TransformerLM
from attnkit.nn import LinearAttention, LinearAttentionCache, MultiHeadAttention


@pytest.mark.parametrize("kinds", [("linear", "linear"), ("softmax", "linear", "softmax")])
def test_hybrid_decoding_equals_full_forward(kinds):
    torch.manual_seed(0)
    config = LMConfig(vocab_size=50, embed_dim=32, num_layers=len(kinds), num_heads=4, num_kv_heads=2, positions="sinusoidal",
                      attention=kinds)
    model = TransformerLM(config).double().eval()
    assert [type(b.attn) for b in model.blocks] == [LinearAttention if k == "linear" else MultiHeadAttention
                                                    for k in kinds]
    tokens = torch.randint(0, 50, (2, 13))
    full = model(tokens)
    cache = model.new_cache(2)
    assert any(isinstance(c, LinearAttentionCache) for c in cache)
    outs, start = [], 0
    for stop in (5, 6, 7, 13):
        outs.append(model(tokens[:, start:stop], positions=torch.arange(start, stop)[None], cache=cache))
        start = stop
    torch.testing.assert_close(torch.cat(outs, dim=1), full, rtol=1e-9, atol=1e-9)


def test_hybrid_generation_is_greedy_consistent():
    torch.manual_seed(0)
    model = TransformerLM(LMConfig(vocab_size=40, embed_dim=32, num_layers=2, num_heads=4,
                                   attention=("linear", "softmax"))).eval()
    prompt = [1, 5, 7, 9]
    new = generate(model, [prompt], max_new_tokens=6)[0]
    tokens = list(prompt)
    for _ in range(6):  # greedy without any cache: argmax of the full forward
        tokens.append(int(model(torch.tensor([tokens]))[0, -1].argmax()))
    assert new == tokens[len(prompt):]


def test_hybrid_trains():
    torch.manual_seed(0)
    model = TransformerLM(LMConfig(vocab_size=30, embed_dim=32, num_layers=2, num_heads=2, attention="linear"))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    tokens = torch.randint(0, 30, (4, 16))
    losses = []
    for _ in range(60):
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 30), tokens[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_hybrid_batched_generation_with_left_padding_equals_one_by_one():
    torch.manual_seed(0)
    model = TransformerLM(LMConfig(vocab_size=40, embed_dim=32, num_layers=2, num_heads=4, positions="learned",
                                   attention=("linear", "softmax"))).eval()
    prompts = [[1, 5, 7, 9, 2, 3], [4, 8], [6, 6, 6, 1]]
    batched = generate(model, prompts, max_new_tokens=5)
    assert batched == [generate(model, [p], max_new_tokens=5)[0] for p in prompts]

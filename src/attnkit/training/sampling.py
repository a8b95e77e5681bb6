"""Text samples from a model with :func:`attnkit.models.generation.generate` (KV-cached decoding)."""

from __future__ import annotations

import torch

from attnkit.models.generation import generate
from attnkit.runs.tokens import ByteTokenizer


@torch.no_grad()
def sample_text(model, prompt: str, *, max_new_tokens: int = 200, temperature: float = 0.8, top_k: int | None = 40,
                seed: int | None = 0, tokenizer: ByteTokenizer | None = None) -> str:
    """``prompt`` followed by up to ``max_new_tokens`` sampled tokens (stops at end-of-document or at the model's
    ``max_seq_len``). The torch RNG
    is left untouched (generation draws from its own seeded generator) and the train/eval mode is restored."""
    tokenizer = tokenizer or ByteTokenizer()
    ids = tokenizer.encode(prompt)
    length = getattr(getattr(model, "config", None), "max_seq_len", None)
    if isinstance(length, int):  # a sample stays inside the length the model was built for
        max_new_tokens = max(0, min(max_new_tokens, length - len(ids)))
    was_training = model.training
    model.eval()
    try:
        new = generate(model, [ids], max_new_tokens=max_new_tokens, temperature=temperature,
                       top_k=top_k, seed=seed, stop_tokens=(tokenizer.EOS,))
    finally:
        model.train(was_training)
    return prompt + tokenizer.decode(new[0])

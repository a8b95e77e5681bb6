"""Length extrapolation: the model's loss on its own samples at 1x, 2x and 4x its training length.

The model samples independent pieces of ``min(L, PIECE)`` tokens at temperature 1 (L = its training length),
in one batch; their concatenation (4L tokens) is scored in non-overlapping windows of L, 2L and 4L, so every
window size scores the same tokens and sees the same kind of piece boundaries. Inside L every position is one
the model has trained on; windows of 2L and 4L ask it to read positions it has never seen. A model whose
positions extrapolate keeps the loss flat; WARN when the loss at 4L climbs past the band. Sampling short
pieces in one batch keeps the check to ``PIECE`` decoding steps whatever L is.

Shape legend: B batch, L training length, V vocab size.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnkit.diagnostics.checks.base import PASS, WARN, Outcome, Skip, check, gen, model_device

BAND = 1.10  # WARN when loss at 4L > BAND x loss at L (attnkit lab positions: ALiBi ~1.0, sinusoidal far above)
MAX_LENGTH = 256  # longest training length the doctor checks (4 x 256 tokens scored)
PIECE = 32  # tokens per sampled piece (decoding steps)


def training_length(module) -> int | None:
    config = getattr(module, "config", None)
    for attr in ("max_seq_len", "max_position_embeddings", "n_positions"):
        value = getattr(config, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


@torch.no_grad()
def sample(lm, length: int, rows: int, g: torch.Generator, device) -> torch.Tensor:
    """``rows`` samples ``(rows, length)`` at temperature 1 (through the cache when the model has one)."""
    tokens = torch.randint(1, lm.vocab_size, (rows, 1), generator=g).to(device)
    cache = lm.new_cache(rows) if lm.new_cache is not None else None
    nxt = tokens
    for t in range(length - 1):
        if cache is not None:
            logits = lm.forward(nxt, positions=torch.tensor([[t]], device=device), cache=cache)[:, -1]
        else:
            logits = lm.forward(tokens)[:, -1]
        probs = logits.float().softmax(-1).cpu()
        nxt = torch.multinomial(probs, 1, generator=g).to(device)  # (rows, 1)
        tokens = torch.cat([tokens, nxt], 1)
    return tokens


@torch.no_grad()
def window_loss(lm, stream: torch.Tensor, window: int) -> float:
    """Mean next-token loss over non-overlapping windows of ``window`` tokens of ``stream (N,)``."""
    n = stream.numel() // window
    w = stream[: n * window].reshape(n, window)  # (n, window)
    logits = lm.forward(w).float()  # (n, window, V)
    return float(F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1)))


@check("extrapolation", "length extrapolation",
       "Use positions that extrapolate (ALiBi; RoPE with scaling), train on the lengths you will serve, or cap "
       "inputs at the training length; see `attnkit lab positions`.", order=130)
def extrapolation(subject, options) -> Outcome:
    lm = subject.lm
    if lm is None or not lm.outputs_logits or not lm.causal:
        raise Skip("needs a causal token model with logits")
    L = training_length(subject.module)
    if L is None:
        raise Skip("the training length is unknown (no config.max_seq_len / max_position_embeddings / n_positions)")
    if L > MAX_LENGTH:
        raise Skip(f"training length {L} is above the doctor's budget ({MAX_LENGTH}); run `attnkit lab positions` "
                   "style evaluation on held-out text instead")
    s = subject.cast(torch.float32)
    device = model_device(s)
    piece = min(L, PIECE)
    rows = -(-4 * L // piece)  # ceil: enough pieces for 4L tokens
    stream = sample(s.lm, piece, rows, gen(options, 21), device).reshape(-1)[: 4 * L]  # (4L,)
    losses = {}
    for factor in (1, 2, 4):
        try:
            losses[factor] = window_loss(s.lm, stream, factor * L)
        except Exception as exc:  # noqa: BLE001 - a model that refuses longer inputs (learned positions)
            details = {"train_length": L, "losses": losses, "refused_at": factor * L}
            return Outcome(WARN, f"refuses inputs of {factor}x its training length {L}: {type(exc).__name__}: "
                           f"{str(exc).splitlines()[0][:120]}", details)
    ratio = losses[4] / losses[1]
    details = {"train_length": L, "losses": losses, "ratio_4x": ratio, "band": BAND}
    text = (f"loss on its own samples at {L} / {2 * L} / {4 * L} tokens: {losses[1]:.3f} / {losses[2]:.3f} / "
            f"{losses[4]:.3f} (4x/1x = {ratio:.2f}, band <= {BAND})")
    if ratio > BAND:
        return Outcome(WARN, "loss climbs past the training length: " + text, details)
    return Outcome(PASS, text, details)

"""The one experiment harness every lab shares: data, tiny models, a training loop and evaluation.

- :class:`TextData`: byte-level text from the Python standard library (train / validation split by file), with
  random training windows and fixed, non-overlapping evaluation windows (every length scores the same tokens);
- synthetic tasks (:func:`recall_batch`, :func:`copy_batch`) whose answer sits a known distance back;
- :func:`tiny_lm`: a :class:`~attnkit.models.lm.TransformerLM` from the public builders;
- :func:`train`: AdamW + warmup/cosine + clipping on any ``tokens (B, L) -> logits (B, L, V)`` model, with a
  callback per step; :func:`evaluate` / :func:`loss_at_lengths`: mean loss on fixed batches.

Targets use ``-100`` for positions that carry no loss (synthetic tasks score only the answers).
Everything is seeded: the same command gives the same numbers on the same machine and torch version.

Shape legend: B batch, L length, V vocabulary.
"""

from __future__ import annotations

import contextvars
import math
import statistics
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import nn

from attnkit._progress import progress
from attnkit.models.builders import build_lm
from attnkit.runs.tokens import ByteTokenizer
from attnkit.training.data import stdlib_files
from attnkit.training.schedule import lr_at
from attnkit.training.steps import param_groups

IGNORE = -100
#: what progress lines call the work in hand (``run_lab`` sets ``lab NAME``)
WHO = contextvars.ContextVar("attnkit_lab", default="lab")
Sampler = Callable[[torch.Generator], tuple[torch.Tensor, torch.Tensor]]  # g -> (inputs, targets) (B, L)


# ------------------------------------------------------------------------------------------------ text data

@dataclass(frozen=True)
class TextData:
    """Byte streams (int64, EOS between files) for training and validation."""

    train_stream: torch.Tensor
    val_stream: torch.Tensor

    def sampler(self, batch: int, length: int) -> Sampler:
        """Random training windows: ``inputs = s[i:i+L]``, ``targets = s[i+1:i+L+1]``."""
        stream = self.train_stream

        def sample(g: torch.Generator):
            starts = torch.randint(0, stream.numel() - length - 1, (batch,), generator=g)
            idx = starts[:, None] + torch.arange(length + 1)  # (B, L+1)
            w = stream[idx]
            return w[:, :-1], w[:, 1:]

        return sample

    def eval_windows(self, length: int, total_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Non-overlapping windows of ``length`` covering the first ``total_tokens`` validation targets.

        Every length scores the same ``total_tokens`` tokens; each window starts with an empty context
        (the protocol of Press et al.'s non-overlapping evaluation)."""
        n = total_tokens // length
        s = self.val_stream[: n * length + 1]
        return s[:-1].reshape(n, length), s[1:].reshape(n, length)  # (n, L) x2


@lru_cache(maxsize=4)
def text_data(train_bytes: int = 2_000_000, val_bytes: int = 200_000) -> TextData:
    """Byte streams from the stdlib corpus (sorted paths); a file is validation when crc32(path) falls in the
    lowest 10% (the rule of ``attnkit train``'s split), read until both streams are full."""
    _, files = stdlib_files()
    streams: dict[bool, list[int]] = {False: [], True: []}
    budget = {False: train_bytes, True: val_bytes}
    for path in files:
        is_val = zlib.crc32(path.as_posix().encode()) < int(0.1 * 2**32)
        if len(streams[is_val]) < budget[is_val]:
            streams[is_val].extend(path.read_bytes())
            streams[is_val].append(ByteTokenizer.EOS)
        if all(len(streams[k]) >= budget[k] for k in streams):
            break
    return TextData(*(torch.tensor(streams[k][: budget[k]], dtype=torch.long) for k in (False, True)))


VOCAB = ByteTokenizer.vocab_size

#: a model counts as trained when its loss is below this fraction of ln(VOCAB) (a uniform guess's loss); claims
#: whose evidence is a trained model's loss are "not measured", never "holds", when it is still near chance
LEARNED_FRACTION = 0.9


def learned(loss: float, who: str, vocab: int = VOCAB) -> float:
    """``loss`` itself when ``who`` learned something (``loss < 0.9 ln(vocab)``); otherwise a ``ValueError``,
    which the lab report turns into "not measured" with this message."""
    floor = LEARNED_FRACTION * math.log(vocab)
    if not loss < floor:
        raise ValueError(f"{who} did not learn: loss {loss:.3g} >= {LEARNED_FRACTION} x ln({vocab}) = {floor:.3g} "
                         "(run longer than this size)")
    return loss


# ------------------------------------------------------------------------------------------- synthetic tasks

def recall_batch(g: torch.Generator, batch: int, length: int, vocab: int,
                 pairs: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Multi-query associative recall (Zoology's small setting, MQAR): ``pairs`` key-value pairs (a key, then
    its value) at random places in the first half among filler, and in the second half each key once more at a
    random place; the target at a repeated key is its value. Keys come from the lower half of the vocabulary,
    values and filler from the upper half (chance = 2 / vocab).

    Returns inputs, targets ``(B, L)`` (IGNORE except at the queries) and ``gaps`` ``(B, L)``: how many tokens
    back the answer sits from each query (-1 elsewhere)."""
    half = vocab // 2
    tokens = torch.randint(half, vocab, (batch, length), generator=g)  # filler and values (B, L)
    targets = torch.full((batch, length), IGNORE)
    gaps = torch.full((batch, length), -1)
    for b in range(batch):
        keys = (torch.randperm(half - 1, generator=g)[:pairs] + 1).tolist()  # distinct keys
        starts = []
        for s in torch.randperm(length // 2 - 1, generator=g).tolist():  # non-overlapping pairs, first half
            if all(abs(s - t) >= 2 for t in starts):
                starts.append(s)
            if len(starts) == pairs:
                break
        queries = (torch.randperm(length - length // 2, generator=g)[:pairs] + length // 2).tolist()
        for key, s, q in zip(keys, starts, queries):
            tokens[b, s], tokens[b, q] = key, key
            targets[b, q] = tokens[b, s + 1]
            gaps[b, q] = q - (s + 1)
    return tokens, targets, gaps


def copy_batch(g: torch.Generator, batch: int, n: int, vocab: int, length: int | None = None):
    """Copying: ``n`` random tokens, a separator (0), then the same ``n`` tokens again (scored); padded with
    separators to ``length`` (default 2n + 1). The copy of token i sits ``n + 1`` positions after it."""
    length = length or 2 * n + 1
    seq = torch.randint(1, vocab, (batch, n), generator=g)  # (B, n)
    tokens = torch.zeros(batch, length, dtype=torch.long)
    tokens[:, :n] = seq
    tokens[:, n + 1: 2 * n + 1] = seq
    targets = torch.full((batch, length), IGNORE)
    targets[:, n: 2 * n] = seq  # the output at position n + i predicts the copy of token i
    return tokens, targets


# ------------------------------------------------------------------------------------------------- models

def tiny_lm(vocab_size: int = VOCAB, **overrides) -> nn.Module:
    """A small decoder from the public builders (nano preset: width 64, 2 layers, 2 heads)."""
    return build_lm("nano", vocab_size=vocab_size, **overrides)


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# ----------------------------------------------------------------------------------------- train / evaluate

def loss_of(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = model(inputs)  # (B, L, V)
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=IGNORE)


@dataclass
class History:
    """Per-step records of one training run."""

    loss: list[float] = field(default_factory=list)
    grad_norm: list[float] = field(default_factory=list)
    step_seconds: list[float] = field(default_factory=list)
    extra: dict[str, list] = field(default_factory=dict)

    def log(self, key: str, value) -> None:
        self.extra.setdefault(key, []).append(value)

    def final_loss(self, last: int = 20) -> float:
        """Mean of the last ``last`` training losses (a less noisy end point than one step)."""
        tail = [x for x in self.loss[-last:] if math.isfinite(x)]
        return statistics.fmean(tail) if tail else math.nan

    def median_step_ms(self) -> float:
        return 1000 * statistics.median(self.step_seconds[1:] or self.step_seconds)

    def to_dict(self) -> dict:
        return {"loss": self.loss, "grad_norm": self.grad_norm, "step_ms": self.median_step_ms(), **self.extra}


def train(model: nn.Module, sampler: Sampler, *, steps: int, lr: float = 3e-3, seed: int = 0, warmup: int = 20,
          clip: float | None = 1.0, weight_decay: float = 0.0,
          on_step: Callable[[int, nn.Module, History], None] | None = None, every: int = 0) -> History:
    """Train ``model`` for ``steps`` AdamW steps on batches from ``sampler``; returns the :class:`History`.

    ``on_step(step, model, history)`` runs before step 0 and after every ``every``-th step (0 = never)."""
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(param_groups(model, weight_decay), lr=lr, betas=(0.9, 0.95))
    hist = History()
    model.train()
    for step in progress(range(steps), desc=f"{WHO.get()}: training {type(model).__name__}", unit="step"):
        if on_step is not None and every and step % every == 0:
            on_step(step, model, hist)
        inputs, targets = sampler(g)
        for group in opt.param_groups:
            group["lr"] = lr_at(step + 1, lr=lr, warmup=warmup, total=steps)
        start = time.perf_counter()
        loss = loss_of(model, inputs, targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip if clip else float("inf"))
        opt.step()
        hist.step_seconds.append(time.perf_counter() - start)
        hist.loss.append(float(loss.detach()))
        hist.grad_norm.append(float(norm))
    if on_step is not None and every:
        on_step(steps, model, hist)
    model.eval()
    return hist


@torch.no_grad()
def evaluate(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, batch: int = 16) -> float:
    """Token-weighted mean loss over fixed windows ``(N, L)``, in eval mode."""
    was = model.training
    model.eval()
    total, count = 0.0, 0
    for i in range(0, inputs.shape[0], batch):
        x, y = inputs[i: i + batch], targets[i: i + batch]
        n = int((y != IGNORE).sum())
        total += float(loss_of(model, x, y)) * n
        count += n
    model.train(was)
    return total / max(count, 1)


def loss_at_lengths(model: nn.Module, data: TextData, lengths: list[int], total_tokens: int) -> dict[int, float | str]:
    """Validation loss at each length (non-overlapping windows, the same tokens for every length); a model that
    refuses a length (learned positions past their table) gets the error message instead of a number."""
    out: dict[int, float | str] = {}
    for L in lengths:
        try:
            out[L] = evaluate(model, *data.eval_windows(L, total_tokens), batch=max(1, 4096 // L))
        except ValueError as exc:
            out[L] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    return out


def seeded(seed: int) -> None:
    """Seed torch's global generator (model initialisation)."""
    torch.manual_seed(seed)


def timed(fn: Callable[[], object]) -> tuple[object, float]:
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start

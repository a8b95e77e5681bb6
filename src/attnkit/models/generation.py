"""Generation for any attnkit decoder model: one prefill, then a decode loop over a KV cache, with greedy,
temperature, top-k and top-p sampling, a seed, stop tokens, a token budget and streaming.

The decoder-model protocol (``TransformerLM`` implements it; so can any model built from attnkit modules)::

    model(tokens (B, L) int64, *, positions: (B|1, L) | None = None, cache: list[KVCache] | None = None,
          key_is_real: (B, Lk_total) bool | None = None) -> logits (B, L, V)
    model.new_cache(batch_size, *, kind="dynamic"|"static"|"sliding", max_length=None) -> list[KVCache]
    model.positions_from_cache: bool  # optional: True when positions=None with cache= continues the caches
    model(..., logits_to_keep=1)  # optional keyword (in the forward's signature): the last position's logits only

A model that says ``positions_from_cache`` gets ``positions=None`` at every decode step when its caches can say
where each row continues (``next_positions``; left padding included), so no position tensor is built, checked or
read back per step.

Batches of prompts with different lengths are left-padded. Row b with ``n_b`` pads gives its tokens the
positions ``column - n_b``: real tokens start at position 0 (so each row computes exactly what it would
alone) and the pads sit at consecutive negative positions (so the caches can check that positions continue).
``key_is_real`` (True = real token) covers every token so far, cache included; a model masks pad keys with
``padding(key_is_real)`` (index-aligned, right for the dynamic cache and the full forward) or with
:func:`padding_by_position` (position-based, right for every cache kind). Models with a learned position
table must clamp the pads' negative positions (``positions.clamp(min=0)``) before the lookup: pad queries'
outputs are ignored.

Decoding runs under ``torch.inference_mode`` and reads the sampled tokens back once per step (needed to
stream them and to stop). A row that produced a stop token (the stop token is returned) or ``max_new_tokens``
is finished; the loop ends when every row is.

Shape legend: B batch (prompts), P padded prompt length, L new tokens, V vocab size.
"""

from __future__ import annotations

import inspect
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol, runtime_checkable

import torch

from attnkit._checks import integer, number
from attnkit.errors import AttnkitTypeError, AttnkitValueError, BackendUnsupportedError, describe
from attnkit.masks import MaskSpec, padding


@runtime_checkable
class DecoderModel(Protocol):
    """A causal LM that generation can drive (see the module docstring)."""

    def __call__(self, tokens: torch.Tensor, *, positions: torch.Tensor | None = None, cache: list | None = None,
                 key_is_real: torch.Tensor | None = None) -> torch.Tensor: ...

    def new_cache(self, batch_size: int, *, kind: str = "dynamic", max_length: int | None = None) -> list: ...


def padding_by_position(key_is_real: torch.Tensor, positions: torch.Tensor) -> MaskSpec:
    """A position-based mask that hides left padding, for every cache kind.

    ``key_is_real`` ``(B, Lk_total)`` is True for real tokens (left padding: False* True*), covering every
    token so far; ``positions`` ``(B|1, L)`` are the consecutive positions of this call's tokens, the newest
    last. The first real token of row b sits at ``start[b] = positions[b, -1] - (Lk_total - 1) + n_pads[b]``
    and the mask, ``ak.masks.padding(start=start)``, keeps keys at positions ``>= start[b]``; it does not depend on
    how a cache orders its slots.
    """
    if not isinstance(key_is_real, torch.Tensor) or key_is_real.dtype != torch.bool or key_is_real.dim() != 2:
        raise AttnkitTypeError(f"key_is_real must be a bool tensor (B, Lk_total), got {describe(key_is_real)}.")
    if not torch.equal(key_is_real, key_is_real.cummax(dim=1).values):
        raise AttnkitValueError("padding_by_position supports left padding only (each row of key_is_real is "
                                "False* True*); use ak.masks.padding(key_is_real) with a dynamic cache for other layouts.")
    n_pads = (~key_is_real).sum(dim=1)  # (B,)
    start = positions[:, -1] - (key_is_real.shape[1] - 1) + n_pads  # (B,)
    return padding(start=start)


def left_pad(prompts: Sequence[Sequence[int]], device: torch.device | str | None = None, pad_id: int = 0):
    """Left-pad prompts: tokens ``(B, P)``, positions ``(B, P)`` (``column - n_pads``), key_is_real ``(B, P)``."""
    lengths = torch.tensor([len(p) for p in prompts], device=device)  # (B,)
    P = int(lengths.max())
    tokens = torch.full((len(prompts), P), pad_id, dtype=torch.long, device=device)  # (B, P)
    for row, prompt in enumerate(prompts):
        tokens[row, P - len(prompt):] = torch.as_tensor(list(prompt), dtype=torch.long, device=device)
    n_pads = (P - lengths)[:, None]  # (B, 1)
    columns = torch.arange(P, device=device)[None]  # (1, P)
    return tokens, columns - n_pads, columns >= n_pads


def sample(logits: torch.Tensor, *, temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
           generator: torch.Generator | None = None) -> torch.Tensor:
    """Next tokens ``(B,)`` from logits ``(B, V)``: argmax for temperature 0, else a draw from
    softmax(logits / temperature) restricted to the top_k most likely tokens and to the smallest set whose
    probability reaches top_p (the most likely token always stays)."""
    if temperature == 0.0:
        return logits.argmax(dim=-1)  # (B,)
    scores = logits.float() / temperature  # (B, V)
    if top_k is not None and top_k < scores.shape[-1]:
        kth = scores.topk(top_k, dim=-1).values[:, -1:]  # (B, 1)
        scores = scores.masked_fill(scores < kth, -math.inf)
    if top_p is not None and top_p < 1.0:
        sorted_scores, order = scores.sort(dim=-1, descending=True)  # (B, V) each
        probs = sorted_scores.softmax(dim=-1)
        before = probs.cumsum(dim=-1) - probs  # probability of the strictly more likely tokens
        drop_sorted = before >= top_p  # the first token has before == 0 < top_p: always kept
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)  # back to vocabulary order
        scores = scores.masked_fill(drop, -math.inf)
    probs = scores.softmax(dim=-1)  # (B, V)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)  # (B,)


def _python(name: str) -> str:
    return name


def check_sampling(max_new_tokens: object, temperature: object, top_k: object, top_p: object,
                   names: Callable[[str], str] = _python) -> None:
    """The rules of :func:`generate`'s scalar arguments, in one place: ``max_new_tokens`` an int >= 0,
    ``temperature`` a finite number >= 0 (0 = greedy), ``top_k`` an int >= 1 or None, ``top_p`` in (0, 1] or None,
    and no top-k / top-p cut when decoding greedily. ``names(argument)``: how the messages name an argument (the
    argument itself; ``attnkit generate`` passes its flags)."""
    n = names

    def example(name: str, value: object) -> str:
        return f"{n(name)} {value}" if n(name).startswith("-") else f"{name}={value}"

    integer(max_new_tokens, n("max_new_tokens"), low=0, fix=f"e.g. {example('max_new_tokens', 200)}.")
    number(temperature, n("temperature"), low=0, fix=f"0 = greedy, e.g. {example('temperature', 0.8)}.")
    if top_k is not None:
        integer(top_k, n("top_k"), low=1, fix=f"leave {n('top_k')} out (None) for no top-k cut.")
    if top_p is not None:
        number(top_p, n("top_p"), low=0, high=1, low_open=True, high_closed=True,
               fix=f"e.g. {example('top_p', 0.9)}, or leave {n('top_p')} out (None).")
    if temperature == 0 and (top_k is not None or top_p is not None):
        raise AttnkitValueError(f"{n('top_k')} / {n('top_p')} only apply when sampling, but {n('temperature')} 0 is "
                                f"greedy; pass {n('temperature')} > 0 (e.g. {example('temperature', 1.0)}) or leave "
                                f"{n('top_k')} / {n('top_p')} out.")


def _check_args(model, prompts, max_new_tokens, temperature, top_k, top_p, stop_tokens) -> None:
    if not callable(model) or not callable(getattr(model, "new_cache", None)):
        raise AttnkitTypeError(f"model must be a decoder model: callable as model(tokens, positions=, cache=, "
                               f"key_is_real=) with a new_cache(batch_size, kind=, max_length=) method, got "
                               f"{describe(model)}; see attnkit.models.generation.DecoderModel.")
    if not isinstance(prompts, (list, tuple)) or not prompts or any(
            not isinstance(p, (list, tuple)) or not p for p in prompts):
        raise AttnkitValueError(f"prompts must be a non-empty list of non-empty lists of token ids, got "
                                f"{describe(prompts)}; e.g. [[1, 2, 3]] (give every prompt at least one token).")
    if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for p in prompts for t in p):
        raise AttnkitValueError(f"prompts must contain non-negative int token ids, got {describe(prompts)}.")
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    if isinstance(vocab, int) and max(t for p in prompts for t in p) >= vocab:
        raise AttnkitValueError(f"prompts contain token id {max(t for p in prompts for t in p)}, but the model's "
                                f"vocabulary has {vocab} ids (0 .. {vocab - 1}); encode the prompt with the model's "
                                "own tokenizer.")
    check_sampling(max_new_tokens, temperature, top_k, top_p)
    _check_length(model, prompts, max_new_tokens)
    if any(isinstance(t, bool) or not isinstance(t, int) for t in stop_tokens):
        raise AttnkitTypeError(f"stop_tokens must be a collection of int token ids, got {describe(stop_tokens)}.")


class LengthWarning(UserWarning):
    """Generation runs past the length the model was built for (its ``config.max_seq_len``): positions it never
    saw in training (rotary, ALiBi, sinusoidal or no positions compute them; how well they extrapolate differs)."""


#: what the positions lab measured past the training length L (docs/labs.md, `attnkit lab positions`)
EXTRAPOLATION = {"alibi": "ALiBi stayed flat to 8x its training length (loss 1.94 -> 1.95)",
                 "rope": "RoPE lost 14% at 4x its training length and 30% at 8x",
                 "sinusoidal": "sinusoidal positions lost 23% at 4x their training length",
                 "none": "no positions lost 6% at 4x the training length"}


def _check_length(model, prompts, max_new_tokens: int) -> None:
    """Refuse up front (not after streaming half the text) a prompt + new tokens beyond the positions the model
    has: learned position embeddings hold ``max_positions`` positions. Past the length of ``model.config``
    (``max_seq_len``) with computed positions: a :class:`LengthWarning` with the positions lab's result."""
    limit = getattr(getattr(model, "pos_embed", None), "max_positions", None)
    longest = max(len(p) for p in prompts)
    if isinstance(limit, int) and longest + max_new_tokens > limit:
        raise AttnkitValueError(
            f"max_new_tokens={max_new_tokens} with a prompt of {longest} tokens needs {longest + max_new_tokens} "
            f"positions, but the model's learned positions hold {limit}; pass max_new_tokens="
            f"{max(limit - longest, 0)} or less.")
    config = getattr(model, "config", None)
    trained = getattr(config, "max_seq_len", None)
    if isinstance(trained, int) and longest + max_new_tokens > trained:
        kind = getattr(config, "positions", None)
        lab = EXTRAPOLATION.get(kind, "")
        warnings.warn(LengthWarning(
            f"a prompt of {longest} tokens + max_new_tokens={max_new_tokens} reaches position "
            f"{longest + max_new_tokens}, past the {trained} the model was built for ({kind} positions): the text "
            f"after position {trained} is extrapolation" + (f"; the positions lab measured: {lab}" if lab else "")
            + f". Pass max_new_tokens={max(trained - longest, 0)} or less to stay inside it."), stacklevel=4)


def stream_generate(model, prompts: Sequence[Sequence[int]], *, max_new_tokens: int = 64, temperature: float = 0.0,
                    top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                    stop_tokens: Sequence[int] = (), cache: str = "dynamic",
                    compile: bool = False) -> Iterator[tuple[int, int]]:
    """Yield ``(row, token)`` as tokens are produced (each step yields one token per unfinished row).

    Arguments as :func:`generate`. ``cache`` is the kind passed to ``model.new_cache`` ("dynamic", "static"
    sized to the longest prompt + ``max_new_tokens``, or "sliding" for sliding-window models). The arguments are
    checked when this is called (before the first token is asked for): a caller can refuse before printing.
    """
    stop_tokens = tuple(stop_tokens)
    _check_args(model, prompts, max_new_tokens, temperature, top_k, top_p, stop_tokens)
    _check_compile(compile, cache, prompts)
    return _decode(model, prompts, max_new_tokens, temperature, top_k, top_p, seed, stop_tokens, cache, compile)


def _decode(model, prompts, max_new_tokens, temperature, top_k, top_p, seed, stop_tokens, cache, compile
            ) -> Iterator[tuple[int, int]]:
    """The decode loop of :func:`stream_generate`, its arguments already checked."""
    if max_new_tokens == 0:
        return
    device = next((p.device for p in model.parameters()), None) if hasattr(model, "parameters") else None
    tokens, positions, key_is_real = left_pad(prompts, device)  # (B, P) each
    B, P = tokens.shape
    if bool(key_is_real.all()):
        key_is_real = None  # no padding: the model may use its fastest mask
    generator = None if seed is None else torch.Generator(device=tokens.device).manual_seed(seed)
    stops = torch.tensor(stop_tokens, dtype=torch.long, device=tokens.device)  # (S,)
    caches = model.new_cache(B, kind=cache, max_length=P + max_new_tokens)
    finished = [False] * B
    # every later step's positions and padding, built once: the loop slices views instead of allocating (a
    # model whose caches continue their own positions gets None instead)
    from_cache = getattr(model, "positions_from_cache", False) is True and isinstance(caches, (list, tuple)) and \
        any(callable(getattr(c, "next_positions", None)) for c in caches)
    later = None if from_cache else positions[:, -1:] + torch.arange(1, max_new_tokens, device=tokens.device)  # (B, N - 1)
    if key_is_real is not None:
        key_is_real = torch.cat([key_is_real, key_is_real.new_ones(B, max_new_tokens - 1)], dim=1)  # (B, P + N - 1)
    last_only = _takes_logits_to_keep(model)  # the prefill's head on the last prompt token only
    for step in range(max_new_tokens):
        forward = _compiled_decode_step if compile and step > 0 else _decode_step  # the prefill runs eager
        with torch.inference_mode():
            seen = None if key_is_real is None else key_is_real[:, :P + step]  # (B, Lk_total): keys so far
            logits = forward(model, tokens, positions, caches, seen, last_only)  # (B, L|1, V)
            new = sample(logits[:, -1], temperature=temperature, top_k=top_k, top_p=top_p,
                         generator=generator)  # (B,)
            done_now = torch.isin(new, stops) if len(stop_tokens) else None  # (B,)
        values = new.tolist()  # the one host read per step
        done_rows = done_now.tolist() if done_now is not None else [False] * B
        for row in range(B):
            if not finished[row]:
                yield row, values[row]
                finished[row] = done_rows[row]
        if all(finished) or step == max_new_tokens - 1:
            return
        tokens, positions = new[:, None], None if later is None else later[:, step:step + 1]  # (B, 1) each


def generate(model, prompts: Sequence[Sequence[int]], *, max_new_tokens: int = 64, temperature: float = 0.0,
             top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
             stop_tokens: Sequence[int] = (), cache: str = "dynamic",
             on_token: Callable[[int, int], object] | None = None, compile: bool = False) -> list[list[int]]:
    """Generate up to ``max_new_tokens`` tokens per prompt; returns the new tokens of each prompt.

    Args:
        model: a decoder model (see :class:`DecoderModel`); run it in eval mode (dropout off).
        prompts: token ids per prompt (lengths may differ: prompts are left-padded).
        temperature: 0 = greedy (argmax); > 0 samples from softmax(logits / temperature).
        top_k, top_p: restrict sampling to the k most likely tokens / the smallest set with probability >= p.
        seed: seeds a private ``torch.Generator`` (the global RNG is untouched); None draws from the global RNG.
        stop_tokens: a row stops after producing one of these (the stop token is included in its output).
        cache: KV-cache kind for ``model.new_cache``.
        on_token: called as ``on_token(row, token)`` for every token as soon as it is produced.
        compile: run the decode steps through ``torch.compile`` (static shapes; the prefill runs eager). Needs
            ``cache="static"`` and prompts of one length: then every step, and every later call on the same
            model, reuses the compiled graphs. The first call compiles (seconds to minutes).
    """
    out: list[list[int]] = [[] for _ in range(len(prompts) if isinstance(prompts, (list, tuple)) else 0)]
    for row, token in stream_generate(model, prompts, max_new_tokens=max_new_tokens, temperature=temperature,
                                      top_k=top_k, top_p=top_p, seed=seed, stop_tokens=stop_tokens, cache=cache,
                                      compile=compile):
        out[row].append(token)
        if on_token is not None:
            on_token(row, token)
    return out


def _decode_step(model, tokens: torch.Tensor, positions: torch.Tensor, caches: list, key_is_real,
                 last_only: bool = False) -> torch.Tensor:
    """One forward of the decode loop: logits ``(B, L, V)`` for ``tokens (B, L)`` at ``positions (B, L)``
    (``(B, 1, V)``, the last position's, with ``last_only``)."""
    if last_only:
        return model(tokens, positions=positions, cache=caches, key_is_real=key_is_real, logits_to_keep=1)
    return model(tokens, positions=positions, cache=caches, key_is_real=key_is_real)


def _takes_logits_to_keep(model) -> bool:
    """Whether ``model``'s forward takes ``logits_to_keep`` (read from its signature)."""
    try:
        return "logits_to_keep" in inspect.signature(getattr(model, "forward", model)).parameters
    except (TypeError, ValueError):  # no signature to read (a builtin): the plain call
        return False


_COMPILED: list = []  # [the compiled _decode_step], built on first use (nothing compiles at import)


def _compiled_decode_step(model, tokens, positions, caches, key_is_real, last_only: bool = False) -> torch.Tensor:
    """:func:`_decode_step` through one ``torch.compile`` (static shapes) shared by every call: dynamo guards on
    the model and the shapes, so a model's steps over a static cache reuse the same graphs. Not ``fullgraph``:
    a model may read a value on the host (learned positions check their range), which splits the step in two
    graphs rather than failing."""
    if not _COMPILED:
        _COMPILED.append(torch.compile(_decode_step, dynamic=False))
    return _COMPILED[0](model, tokens, positions, caches, key_is_real, last_only)


def _check_compile(compile: object, cache: str, prompts) -> None:
    if not isinstance(compile, bool):
        raise AttnkitTypeError(f"compile must be True or False, got {describe(compile)}.")
    if compile and cache != "static":
        raise AttnkitValueError(f"compile=True needs cache='static' (fixed shapes: one graph for every step), got "
                                f"cache={cache!r}; pass cache='static', or compile=False.")
    if compile and len({len(p) for p in prompts}) > 1:
        raise BackendUnsupportedError(
            f"compile=True decodes prompts of one length only, got lengths {sorted({len(p) for p in prompts})} (the "
            "left-padding mask grows by one key per step, a new shape for every step); decode them separately or "
            "pass compile=False.", ["compiled decoding of left-padded prompts"])

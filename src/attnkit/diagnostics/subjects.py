"""What the doctor examines, and how it calls it: one :class:`Subject` with the interfaces it supports.

A subject offers some of three levels, and each check uses the most end-to-end level it needs:

- ``fn(q, k, v, mask) -> out``: a bare attention function; q ``(B, H, Lq, D)``, k, v ``(B, Hkv, Lk, D)``,
  mask a bool tensor broadcastable to ``(B, H, Lq, Lk)`` (True = may attend) or None, out ``(B, H, Lq, D)``;
- ``seq(x, mask) -> y``: a module on ``x (B, L, E)`` with the same kind of mask, ``y (B, L, E)``;
- ``lm``: a token model through a :class:`TokenAdapter` (tokens, positions, padding, a cache, documents).

:func:`make_subject` recognises bare functions, modules ``m(x, mask)``, :class:`attnkit.nn.MultiHeadAttention`,
attnkit decoder/encoder models (the decoder-model protocol: ``model(tokens, *, positions, cache,
key_is_real[, doc_ids])`` and ``model.new_cache(batch)``) and Hugging Face models; any other model works
through a :class:`TokenAdapter` written by hand.

Shape legend: B batch, H heads, L length, E embed_dim, D head_dim, V vocab size.
"""

from __future__ import annotations

import copy
import functools
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from attnkit.errors import AttnkitTypeError, AttnkitValueError, describe


@dataclass
class TokenAdapter:
    """How to call a token model: the "small adapter" for any model.

    ``forward(tokens (B, L) int64, *, positions=None, key_is_real=None, cache=None, doc_ids=None)`` returns
    logits ``(B, L, V)`` (or hidden states ``(B, L, E)`` when ``outputs_logits`` is False). ``positions`` are
    absolute ``(B|1, L)``; ``key_is_real`` ``(B, Lk_total)`` bool (cache included); ``cache`` an object from
    ``new_cache(batch)``; ``doc_ids`` ``(B, L)`` only when ``supports_doc_ids``. Arguments left at None are
    not passed on.
    """

    forward: Callable
    vocab_size: int
    causal: bool = True
    new_cache: Callable[[int], object] | None = None
    supports_doc_ids: bool = False
    supports_positions: bool = True
    outputs_logits: bool = True
    #: whether the model works out positions by itself when decoding with a cache (Hugging Face does)
    infers_cache_positions: bool = False
    #: the same call returning the hidden states ``(B, L, E)`` the (position-wise) output head reads, or None.
    #: Checks that compare positions (leaks, the cache) use it and skip the V-wide head.
    hidden: Callable | None = None
    #: the output head on hidden states ``(B, n, E) -> (B, n, V)`` (applied to a few positions), or None
    head: Callable | None = None

    def per_position(self, tokens, **kw) -> torch.Tensor:
        """Outputs ``(B, L, E|V)`` for comparisons between positions: the hidden states when the adapter has them
        (the head maps each position on its own, so a change in the logits is a change in the hidden states)."""
        return (self.hidden or self.forward)(tokens, **kw)


@dataclass
class Subject:
    """A thing under examination and the levels it can be driven at (None = not available)."""

    name: str
    kind: str  # "function", "module", "attnkit-attention", "attnkit-model", "huggingface", "adapter"
    fn: Callable | None = None
    fn_note: str = ""
    seq: Callable | None = None
    embed_dim: int | None = None
    seq_positions: bool = False  # seq(x, mask, positions=...) is accepted (attnkit modules)
    lm: TokenAdapter | None = None
    module: nn.Module | None = None
    rebuild: Callable[[nn.Module], Subject] | None = None  # same subject around another copy of the module
    #: True when the weights were loaded (a run, a checkpoint, a pretrained Hugging Face folder): not fresh
    loaded: bool = False
    notes: dict = field(default_factory=dict)
    _casts: dict = field(default_factory=dict, repr=False)

    @property
    def uses_attnkit(self) -> bool:
        return self.module is not None and bool(attnkit_attention_modules(self.module))

    def cast(self, dtype: torch.dtype) -> Subject:
        """The subject around an eval-mode copy of its module in ``dtype`` (cached); fn-only subjects as is.
        A module already in eval mode with every floating tensor in ``dtype`` is used as it is (no copy: checks
        leave it as they found it)."""
        if self.module is None or self.rebuild is None:
            return self
        if dtype not in self._casts:
            tensors = [*self.module.parameters(), *self.module.buffers()]
            if not self.module.training and all(t.dtype == dtype for t in tensors if t.is_floating_point()):
                self._casts[dtype] = self
            else:
                self._casts[dtype] = self.rebuild(cast_copy(self.module, dtype).eval())
        return self._casts[dtype]


def cast_copy(module: nn.Module, dtype: torch.dtype) -> nn.Module:
    """A deep copy of ``module`` with its floating parameters and buffers in ``dtype``, converted once (a plain
    ``deepcopy(module).to(dtype)`` clones every tensor first); tied weights stay tied."""
    memo: dict = {}
    for p in module.parameters():
        if id(p) not in memo:
            value = p.detach().to(dtype, copy=True) if p.is_floating_point() else p.detach().clone()
            memo[id(p)] = nn.Parameter(value, requires_grad=p.requires_grad)
    for b in module.buffers():
        if id(b) not in memo:
            memo[id(b)] = b.to(dtype, copy=True) if b.is_floating_point() else b.clone()
    return copy.deepcopy(module, memo).to(dtype)  # tensors already converted: .to only updates what the class tracks


def attnkit_attention_modules(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(name, module)`` of every :class:`attnkit.nn.MultiHeadAttention` inside ``module``."""
    from attnkit.nn import MultiHeadAttention

    return [(n, m) for n, m in module.named_modules() if isinstance(m, MultiHeadAttention)]


def _attnkit_fn(module: nn.Module) -> tuple[Callable | None, str]:
    """The attention function attnkit modules inside ``module`` run: ``attnkit.attention`` with their backend."""
    from attnkit.backends import attention

    found = attnkit_attention_modules(module)
    if not found:
        return None, ""
    name, first = found[0]
    note = f"attnkit.attention(backend={first.backend!r}) of {name or 'the module'}"
    return functools.partial(attention, backend=first.backend), note


def _first_output(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def _guess_embed_dim(module: nn.Module) -> int | None:
    for attr in ("embed_dim", "d_model", "hidden_size", "dim", "embedding_dim"):
        value = getattr(module, attr, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    first = next((m for m in module.modules() if isinstance(m, nn.Linear)), None)
    return None if first is None else first.in_features


def _vocab_size(module: nn.Module) -> int | None:
    config = getattr(module, "config", None)
    size = getattr(config, "vocab_size", None)
    if isinstance(size, int):
        return size
    emb = next((m for m in module.modules() if isinstance(m, nn.Embedding)), None)
    return None if emb is None else emb.num_embeddings


# ---------------------------------------------------------------------------------------------- builders


def function_subject(fn: Callable, name: str | None = None) -> Subject:
    return Subject(name or getattr(fn, "__name__", "attention function"), "function", fn=fn, fn_note="the function")


def module_subject(module: nn.Module, embed_dim: int | None = None, name: str | None = None) -> Subject:
    """A module called as ``module(x (B, L, E), mask)``."""
    from attnkit.nn import MultiHeadAttention

    embed_dim = embed_dim or _guess_embed_dim(module)
    if embed_dim is None:
        raise AttnkitValueError(f"can't tell the input width of {type(module).__name__}; pass embed_dim=E to "
                                "examine(module, embed_dim=E).")
    is_mha = isinstance(module, MultiHeadAttention)
    fn, note = _attnkit_fn(module)

    def seq(x, mask, positions=None):
        return _first_output(module(x, mask, positions=positions) if is_mha and positions is not None else module(x, mask))

    return Subject(name or type(module).__name__, "attnkit-attention" if is_mha else "module", fn=fn, fn_note=note,
                   seq=seq, embed_dim=embed_dim, seq_positions=is_mha, module=module,
                   rebuild=lambda m: module_subject(m, embed_dim, name))


def decoder_subject(model: nn.Module, name: str | None = None, loaded: bool = False) -> Subject:
    """An attnkit-protocol model: ``model(tokens, *, positions, cache, key_is_real[, doc_ids])``."""
    params = inspect.signature(model.forward).parameters
    config = getattr(model, "config", None)
    causal = bool(getattr(config, "causal", True))
    vocab = _vocab_size(model)
    if vocab is None:
        raise AttnkitValueError(f"can't tell the vocabulary size of {type(model).__name__}; examine it through "
                                "ak.diagnostics.TokenAdapter(forward=..., vocab_size=V).")

    def forward(tokens, **kw):
        return model(tokens, **{k: v for k, v in kw.items() if v is not None})

    new_cache = getattr(model, "new_cache", None) if causal else None
    hidden = head = None
    if _library_forward(model):  # logits = head(encode(...)), position by position

        def hidden(tokens, **kw):
            return model.encode(tokens, **{k: v for k, v in kw.items() if v is not None})

        head = model.head
    adapter = TokenAdapter(forward, vocab, causal=causal, new_cache=new_cache, supports_doc_ids="doc_ids" in params,
                           hidden=hidden, head=head)
    fn, note = _attnkit_fn(model)
    return Subject(name or type(model).__name__, "attnkit-model", fn=fn, fn_note=note, lm=adapter, module=model,
                   rebuild=lambda m: decoder_subject(m, name), loaded=loaded)


def _library_forward(model: nn.Module) -> bool:
    """True for an attnkit ``TransformerLM`` whose ``forward`` is the library's (``head(encode(...))``)."""
    from attnkit.models.lm import TransformerLM

    return isinstance(model, TransformerLM) and type(model).forward is TransformerLM.forward \
        and type(model).encode is TransformerLM.encode


def hf_subject(model: nn.Module, name: str | None = None, causal: bool | None = None) -> Subject:
    """A Hugging Face ``PreTrainedModel`` (causal LM, or encoder such as BERT)."""
    config = model.config
    if causal is None:
        from attnkit.integrations.hf.folders import is_encoder

        causal = not is_encoder(config)
    params = inspect.signature(model.forward).parameters
    cache_kw = "cache" if "cache" in params else "past_key_values"

    def call(target, tokens, positions=None, key_is_real=None, cache=None, doc_ids=None):
        kwargs = {"input_ids": tokens}
        if key_is_real is not None:
            kwargs["attention_mask"] = key_is_real.long()
        if positions is not None:
            kwargs["position_ids"] = positions.expand(tokens.shape[0], -1)
        if cache is not None:
            kwargs[cache_kw], kwargs["use_cache"] = cache, True
        out = target(**kwargs)
        logits = getattr(out, "logits", None)
        return logits if logits is not None else out.last_hidden_state

    def forward(tokens, **kw):
        return call(model, tokens, **kw)

    def new_cache(batch):
        from transformers import DynamicCache

        return DynamicCache(config=config)

    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    base = getattr(model, "base_model", model)
    hidden = None
    # the head applied to a few positions: only a head that is the output Linear itself, a direct child (GPT-2,
    # Llama: lm_head); BERT's masked-LM head has a transform before it, so it is not run piecemeal
    head = out if any(child is out for child in model.children()) else None
    if out is not None and base is not model:  # the head model's trunk: the hidden states its head reads

        def hidden(tokens, **kw):
            return call(base, tokens, **kw)

    adapter = TokenAdapter(forward, config.vocab_size, causal=causal, new_cache=new_cache if causal else None,
                           outputs_logits=out is not None, infers_cache_positions=True, hidden=hidden, head=head)
    # transformers (>= 5) marks a model whose weights from_pretrained loaded; the config's name_or_path would not do:
    # from_config(AutoConfig.from_pretrained(...)) keeps it with fresh weights. Older versions: unknown (False).
    loaded = hasattr(model, "_weight_conversions")
    return Subject(name or type(model).__name__, "huggingface", lm=adapter, module=model,
                   rebuild=lambda m: hf_subject(m, name, causal), loaded=loaded)


def is_hf_model(obj: object) -> bool:
    if "transformers" not in sys.modules:
        return False
    from transformers import PreTrainedModel

    return isinstance(obj, PreTrainedModel)


def make_subject(subject: object, *, embed_dim: int | None = None, adapter: TokenAdapter | None = None,
                 name: str | None = None) -> Subject:
    """Recognise what ``subject`` is and wrap it (see the module docstring)."""
    if isinstance(subject, Subject):
        return subject
    if adapter is not None:
        if not isinstance(adapter, TokenAdapter):
            raise AttnkitTypeError(f"adapter must be an ak.diagnostics.TokenAdapter, got {describe(adapter)}.")
        module = subject if isinstance(subject, nn.Module) else None
        fn, note = _attnkit_fn(module) if module is not None else (None, "")
        return Subject(name or type(subject).__name__, "adapter", fn=fn, fn_note=note, lm=adapter, module=module)
    if is_hf_model(subject):
        return hf_subject(subject, name)
    if isinstance(subject, nn.Module):
        from attnkit.nn import MultiHeadAttention

        if not isinstance(subject, MultiHeadAttention) and (
                hasattr(subject, "new_cache") or "tokens" in inspect.signature(subject.forward).parameters):
            return decoder_subject(subject, name)
        return module_subject(subject, embed_dim, name)
    if callable(subject):
        return function_subject(subject, name)
    raise AttnkitTypeError(
        f"examine() can't use {describe(subject)}; pass an attention function f(q, k, v, mask), a module m(x, mask), "
        "an attnkit model, a Hugging Face model, or a model with adapter=ak.diagnostics.TokenAdapter(...)."
    )

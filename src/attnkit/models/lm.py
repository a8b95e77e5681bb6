"""``TransformerLM``: a decoder-only (or, with ``causal=False``, encoder) Transformer of injected blocks.

The model is embeddings (tokens, optional learned/sinusoidal positions and token types, an optional norm), a
stack of :class:`~attnkit.models.blocks.Block` s, a final norm (pre-norm stacks) and a language-model head that
may share the token embedding's weight (``tie_embeddings``). :func:`~attnkit.models.blocks.block_from_config`
builds each block from the :class:`~attnkit.models.config.LMConfig` (the serialised form).

Masks, built once per forward and shared by every layer with the same pattern: the layer's pattern (causal,
or the block's own ``mask`` such as a sliding window) ``& document(doc_ids)`` for packed rows ``&
padding(key_is_real)`` for padded batches. Without a cache it is prepared once (:func:`attnkit.masks.prepare`:
bound to the positions, its dense form, block cover and backend plans built at most once for all the layers
that share it). Packed rows keep the structured document mask, so the backends can skip the blocks between
documents.

Init (GPT-2): every Linear and Embedding from normal(0, ``init_std``), biases zero, and the projections that
write into the residual stream (attention ``out_proj``, MLP ``down``) from normal(0, init_std / sqrt(2 num_layers)).

Shape legend: B batch, L new tokens, Lk all keys (cache included), E dim, V vocab_size.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from attnkit import masks
from attnkit._checks import integer
from attnkit.errors import AttnkitTypeError, AttnkitValueError, describe
from attnkit.models.blocks import blocks_from_config, layer_window
from attnkit.models.config import LMConfig
from attnkit.nn.mlp import active_dropout
from attnkit.nn.norms import make_norm
from attnkit.positions import Learned, Sinusoidal


class TransformerLM(nn.Module):
    """Decoder-only Transformer LM (or a bidirectional encoder with ``config.causal=False``).

    ``forward(tokens (B, L) int64, *, positions=None, cache=None, key_is_real=None, doc_ids=None,
    token_types=None) -> logits (B, L, V)``. ``positions`` ``(B|1, L)`` are absolute token positions (default
    ``arange(L)``; with ``cache=``, the positions that continue the cached sequence, which each layer's cache
    supplies itself: no position tensor to build, check or read back per step); ``doc_ids`` ``(B, L)``
    restricts attention to each packed document (give positions that restart per document with it);
    ``key_is_real`` ``(B, Lk)`` marks real keys (cache included) in padded batches; ``token_types`` ``(B, L)``
    (BERT's segment ids; default 0 when the config has token types). ``encode`` returns the final hidden states
    ``(B, L, E)`` instead of logits.

    ``gradient_checkpointing = True`` recomputes each block in the backward pass (less memory, more time).
    """

    #: ``forward(..., cache=c)`` without positions continues the caches (the generation protocol's promise)
    positions_from_cache = True

    def __init__(self, config: LMConfig):
        super().__init__()
        if not isinstance(config, LMConfig):
            raise AttnkitTypeError(f"config must be an LMConfig, got {describe(config)}; build one with "
                                   "attnkit.models.builders.lm_config('tiny').")
        self.config = config
        self.gradient_checkpointing = False
        self._default_pattern = masks.causal() if config.causal else None  # one object: layers share its mask
        self.embed = nn.Embedding(config.vocab_size, config.embed_dim)
        self.pos_embed = {"sinusoidal": Sinusoidal(config.embed_dim), "learned": Learned(config.max_seq_len, config.embed_dim,
                                                                                   config.init_std)}.get(config.positions)
        if config.type_vocab_size:
            self.type_embed = nn.Embedding(config.type_vocab_size, config.embed_dim)
        if config.embed_norm:
            self.embed_norm = make_norm(config.norm, config.embed_dim, eps=config.norm_eps, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(blocks_from_config(config))
        self.norm = nn.Identity() if config.post_norm else make_norm(config.norm, config.embed_dim, eps=config.norm_eps,
                                                                     bias=config.bias)
        self.head = nn.Linear(config.embed_dim, config.vocab_size, bias=False)
        if config.pooler:
            self.pooler = Pooler(config.embed_dim)
        self.reset_parameters()
        if config.tie_embeddings:
            self.head.weight = self.embed.weight

    def reset_parameters(self) -> None:
        """GPT-2 init: normal(0, init_std); residual projections normal(0, init_std / sqrt(2 num_layers))."""
        std = self.config.init_std
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
        resid_std = std / math.sqrt(2 * self.config.num_layers)
        for block in self.blocks:
            for proj in (getattr(block.attn, "out_proj", None), getattr(block.mlp, "down", None)):
                if isinstance(proj, nn.Linear):
                    nn.init.normal_(proj.weight, mean=0.0, std=resid_std)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def pattern(self, layer: int | None = None) -> masks.MaskSpec | None:
        """Layer ``layer``'s own attention pattern: its block's ``mask`` (a sliding window, say), else causal
        for a decoder and None for an encoder. ``layer=None``: the model's default."""
        return self._pattern_of(None if layer is None else self.blocks[layer])

    def _pattern_of(self, block: nn.Module | None) -> masks.MaskSpec | None:
        own = None if block is None else getattr(block, "mask", None)
        return self._default_pattern if own is None else own

    def mask(self, *, doc_ids=None, key_is_real=None, positions=None, cached: bool = False, layer: int | None = None):
        """The mask spec for this call and layer: its pattern (causal / sliding window / ...), & document, &
        padding (``layer=None``: layer 0's pattern, which every layer of a uniform stack shares).

        With a cache, padding is evaluated on positions (:func:`~attnkit.models.generation.padding_by_position`,
        right for every cache kind, which may reorder its slots); without, on key indices."""
        pattern = self.pattern(0 if layer is None and len(self.blocks) else layer)
        if doc_ids is None and key_is_real is None:
            return pattern
        parts = [] if pattern is None else [pattern]
        if doc_ids is not None:
            parts.append(masks.document(doc_ids))
        if key_is_real is not None:
            if cached:
                from attnkit.models.generation import padding_by_position

                parts.append(padding_by_position(key_is_real, positions))
            else:
                parts.append(masks.padding(key_is_real))
        if not parts:
            return None
        return parts[0] if len(parts) == 1 else masks.And(*parts)

    def embed_tokens(self, tokens: torch.Tensor, positions=None, token_types=None, *,
                     position_bound: int | None = None) -> torch.Tensor:
        """Token (+ position, + token type) embeddings, normalised when configured: ``(B, L) -> (B, L, E)``.
        ``position_bound``: every position is known (on the host) to be below it, so a learned table checks its
        range without reading ``positions`` back."""
        L = tokens.shape[1]
        x = self.embed(tokens)  # (B, L, E)
        if self.config.embed_scale is not None:
            x = x * self.config.embed_scale  # Gemma: sqrt(E), on the input embeddings only (the tied head is not)
        if self.pos_embed is not None:
            pos = torch.arange(L, device=tokens.device) if positions is None else positions.clamp(min=0)  # pads < 0
            table = self.pos_embed(pos) if position_bound is None or not isinstance(self.pos_embed, Learned) else \
                self.pos_embed(pos, below=position_bound)  # (B|1, L, E)
            x = x + table.to(x.dtype)  # (B|1, L, E) broadcast
        if "type_embed" in self._modules:
            x = x + (self.type_embed.weight[0] if token_types is None else self.type_embed(token_types))
        elif token_types is not None:
            raise AttnkitValueError("token_types given but the model has no token-type embeddings "
                                    "(config.type_vocab_size=0); drop token_types or set type_vocab_size.")
        if "embed_norm" in self._modules:
            x = self.embed_norm(x)
        return active_dropout(self.dropout, x)

    def encode(self, tokens: torch.Tensor, *, positions=None, cache=None, key_is_real=None, doc_ids=None,
               token_types=None):
        """Final hidden states ``(B, L, E)`` (after the last norm)."""
        self._check_tokens(tokens)
        B, L = tokens.shape
        if cache is not None and len(cache) != len(self.blocks):
            raise AttnkitValueError(f"cache has {len(cache)} entries but the model has {len(self.blocks)} layers; "
                                    "build it with model.new_cache(batch_size).")
        layer_positions, bound = positions, None
        if cache is None:
            positions = layer_positions = _none_if_default(positions, tokens)
        elif positions is None:  # every layer's cache continues its own sequence: nothing given, nothing to check
            positions, bound = _continued_positions(cache, L)
        x = self.embed_tokens(tokens, positions, token_types, position_bound=bound)  # (B, L, E)
        shared: dict[tuple, object] = {}  # one mask per (pattern, layer kind) for the whole forward

        def layer_mask(i: int, block: nn.Module):
            # a layer kind that reads padding by key index (linear attention: its state has no slots to reorder)
            # says so with `mask_by_key_index`; it gets the mask as built, not position-bound
            by_index = getattr(block.attn, "mask_by_key_index", False)
            key = (id(self._pattern_of(block)), by_index)
            if key not in shared:  # self.mask: the hook a subclass may override
                mask = self.mask(doc_ids=doc_ids, key_is_real=key_is_real, positions=positions,
                                 cached=cache is not None and not by_index, layer=i)
                if cache is None and not by_index:  # bound once to this forward's positions, shared by the layers
                    mask = masks.prepare(mask, L if positions is None else positions, batch=B)
                shared[key] = mask
            return shared[key]

        for i, block in enumerate(self.blocks):
            layer_cache = None if cache is None else cache[i]
            mask = layer_mask(i, block)
            if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
                x = checkpoint(block, x, mask, layer_positions, layer_cache, use_reentrant=False)
            else:
                x = block(x, mask, layer_positions, layer_cache)
        return self.norm(x)

    def forward(self, tokens: torch.Tensor, *, positions=None, cache=None, key_is_real=None, doc_ids=None,
                token_types=None, logits_to_keep: int = 0):
        """Logits ``(B, L, V)``; ``logits_to_keep=n`` > 0: of the last ``n`` positions only, ``(B, n, V)`` (the
        head's matmul on n rows: generation needs the last prompt token's, not every one's)."""
        if type(logits_to_keep) is not int or logits_to_keep:
            integer(logits_to_keep, "logits_to_keep", low=0, fix="pass 0 (every position) or n > 0 (the last n).")
        hidden = self.encode(tokens, positions=positions, cache=cache, key_is_real=key_is_real, doc_ids=doc_ids,
                             token_types=token_types)  # (B, L, E)
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]  # (B, n, E)
        return self.head(hidden)  # (B, L|n, V)

    def pool(self, hidden: torch.Tensor) -> torch.Tensor:
        """BERT's pooled output of final hidden states: ``(B, L, E) -> (B, E)`` (needs ``config.pooler``)."""
        if "pooler" not in self._modules:
            raise AttnkitValueError("pool needs a pooler (config.pooler=True, BERT's); the model has none: use "
                                    "attnkit.models.builders.embed_sequences for a mean over the tokens.")
        return self.pooler(hidden)

    def new_cache(self, batch_size: int, *, kind: str = "dynamic", max_length: int | None = None) -> list:
        """One KV cache per layer (``attnkit.cache``): ``"dynamic"`` grows, ``"static"`` preallocates
        ``max_length``, ``"sliding"`` keeps the last ``window`` keys of each sliding-window layer (layers with
        full attention in a mixed stack get a static cache when ``max_length`` is given, else a dynamic one)."""
        from attnkit.cache import make_cache

        if not self.config.causal:
            raise AttnkitValueError("new_cache needs a causal decoder (config.causal=True); an encoder runs in one pass "
                                    "without a cache.")
        param = self.embed.weight
        windows = [layer_window(block) for block in self.blocks]
        mixed = kind == "sliding" and any(w is not None for w in windows)

        def layer_cache(i: int):
            attn = self.blocks[i].attn
            if hasattr(attn, "new_cache"):  # a layer with its own decoding state (linear attention)
                return attn.new_cache(batch_size)
            layer_kind = kind if not mixed or windows[i] else ("static" if max_length else "dynamic")
            return make_cache(layer_kind, batch_size, self._kv_heads(i), self._head_dim(i), max_length=max_length,
                              window=windows[i], dtype=param.dtype, device=param.device)

        return [layer_cache(i) for i in range(len(self.blocks))]

    def _kv_heads(self, index: int) -> int:
        return getattr(self.blocks[index].attn, "num_kv_heads", self.config.num_kv_heads or self.config.num_heads)

    def _head_dim(self, index: int) -> int:
        return getattr(self.blocks[index].attn, "head_dim", self.config.resolved_head_dim)

    def _check_tokens(self, tokens: object) -> None:
        if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.dtype.is_floating_point \
                or tokens.dtype == torch.bool:
            raise AttnkitTypeError(f"tokens must be an int64 tensor (B, L), got {describe(tokens)}; pass token ids, "
                                   "e.g. torch.tensor([[1, 2, 3]]).")


class Pooler(nn.Module):
    """BERT's pooler: ``tanh(dense(hidden[:, 0]))``, ``(B, L, E) -> (B, E)``."""

    def __init__(self, embed_dim: int):
        super().__init__()
        self.dense = nn.Linear(embed_dim, embed_dim)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(hidden[:, 0]))  # (B, E)


def _continued_positions(cache: list, L: int) -> tuple[torch.Tensor, int | None]:
    """The positions ``(B|1, L)`` of ``L`` new tokens that continue the caches (read from the first cache that
    keeps positions, without a host sync), and the host-side bound below which they all lie (None: unknown).
    Every layer then continues its own cache: they must hold the same number of tokens."""
    keeping = [c for c in cache if callable(getattr(c, "next_positions", None))]
    if not keeping:
        raise AttnkitValueError("positions must be given with cache= when no layer's cache keeps positions (no "
                                "next_positions(n)): pass the absolute positions (B|1, L) of the new tokens, e.g. "
                                "torch.arange(n_cached, n_cached + L)[None].")
    if torch.compiler.is_compiling():  # host values would specialise the graph on each step
        return keeping[0].next_positions(L), None
    lengths = [getattr(c, "length", None) for c in cache]  # host ints
    if len(set(lengths)) > 1:
        raise AttnkitValueError(f"positions=None continues the caches, but their layers hold different numbers of "
                                f"tokens {lengths}; pass positions= explicitly, or start from model.new_cache(batch_size) "
                                "and feed every layer the same tokens.")
    first = keeping[0]
    bound = getattr(first, "position_bound", None)
    return first.next_positions(L), None if bound is None else bound + L


def _none_if_default(positions, tokens: torch.Tensor):
    """None when ``positions`` are exactly ``arange(L)`` on every row (packed rows that each hold one document
    restart nowhere), so the default path serves them: the rotary table slice, one prepared mask on default
    positions, no per-layer position checks. Anything else (not an integer tensor on the tokens' device, other
    shapes: the layers check and refuse them) is returned as given."""
    L = tokens.shape[1]
    if not isinstance(positions, torch.Tensor) or positions.is_floating_point() or positions.is_complex() or \
            positions.dtype == torch.bool or positions.dim() not in (1, 2) or positions.shape[-1] != L or \
            (positions.dim() == 2 and positions.shape[0] not in (1, tokens.shape[0])) or \
            positions.device != tokens.device or torch.compiler.is_compiling():
        return positions
    arange = torch.arange(L, device=positions.device, dtype=positions.dtype)  # (L,)
    return None if torch.equal(positions, arange.expand_as(positions)) else positions

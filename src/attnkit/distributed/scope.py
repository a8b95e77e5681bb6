"""Context parallelism inside a model: a backend that serves every attention layer from a sharded scope.

A model runs unchanged on a shard of each row: inside ``with sharded(layout, mask, positions=...,
modules=model)`` its attention layers use ``backend="context_parallel"``, and every attention call becomes
:func:`context_parallel_attention` over the whole row, at the scope's *global* positions, with the layer's
own mask (its pattern: causal, a window, chunks - rules on positions, right on any shard) ``&`` the scope's
mask (what needs the whole row's data, e.g. ``document(doc_ids)`` of the global row). On leaving the scope
the layers get their own backends back, so the same model evaluates, samples and decodes on one process;
outside a scope the backend serves nothing (it says so in ``ak.explain``).

The scope must still be open when the backward runs any forward again: gradient checkpointing is refused.

:func:`groups` cuts the world into data-parallel x context-parallel ranks (consecutive ranks form one
context-parallel group), which is how ``attnkit train --context-parallel N`` runs under torchrun.

Shape legend: B batch, L global length, L_r a rank's length.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from attnkit._checks import positive_int
from attnkit._validation import AttentionCall
from attnkit.backends.base import Rank
from attnkit.backends.registry import register
from attnkit.distributed.attention import context_parallel_attention
from attnkit.distributed.layout import ShardLayout
from attnkit.errors import AttnkitValueError, BackendUnsupportedError
from attnkit.masks import MaskSpec


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: one scope, one forward
class Scope:
    layout: ShardLayout
    mask: MaskSpec | None  # over the global sequence, and-ed to each layer's own mask
    positions: torch.Tensor | None  # (B|1, L) global positions
    group: object = None
    strategy: str = "auto"


_SCOPES: list[Scope] = []


@contextlib.contextmanager
def sharded(layout: ShardLayout, mask: MaskSpec | None, *, positions: torch.Tensor | None = None, group=None,
            strategy: str = "auto", modules: torch.nn.Module | None = None):
    """Inside, attention layers with ``backend="context_parallel"`` attend over the whole sharded sequence.

    ``mask`` covers the global row (B, L) and is and-ed to each layer's own mask; ``positions`` are the
    global positions ``(B|1, L)`` (default ``arange(L)``). The attention layers of ``modules`` (every
    ``attnkit.nn.MultiHeadAttention`` in it) use ``backend="context_parallel"`` inside the scope."""
    from attnkit.nn import MultiHeadAttention

    layers = [] if modules is None else [m for m in modules.modules() if isinstance(m, MultiHeadAttention)]
    saved = [m.backend for m in layers]
    _SCOPES.append(Scope(layout, mask, positions, group, strategy))
    try:
        for m in layers:
            m.backend = ContextParallelBackend.name
        yield _SCOPES[-1]
    finally:
        for m, backend in zip(layers, saved):
            m.backend = backend
        _SCOPES.pop()


class ContextParallelBackend:
    """``backend="context_parallel"``: the innermost :func:`sharded` scope's attention (nothing outside one)."""

    name = "context_parallel"
    ranks_by_signature = True  # supports/rank read the call's signature and mask kind only; available(): state()

    def state(self) -> bool:
        """What ``available`` reads besides the call: whether a sharded(...) scope is open."""
        return bool(_SCOPES)

    def available(self) -> list[str]:
        if not _SCOPES:
            return ["serves calls only inside attnkit.distributed.sharded(...), where each rank holds a shard of "
                    "the sequence; outside it use any other backend"]
        return []

    def supports(self, call: AttentionCall) -> list[str]:
        why = []
        if call.return_weights:
            why.append("context parallel attention returns no weights (capture them on one process)")
        if call.dropout_p > 0:
            why.append(f"dropout_p={call.dropout_p}: context parallel attention has no attention dropout")
        if isinstance(call.bias, torch.Tensor):
            why.append("a dense bias tensor has no shard to split; use a structured bias (ALiBi)")
        if isinstance(call.mask, torch.Tensor):
            why.append("a dense mask tensor built from one shard cannot cover the whole row; pass mask specs "
                       "(rules on positions) and the row's data masks to sharded(mask=...)")
        return why

    def rank(self, call: AttentionCall) -> Rank:
        return Rank(-100, "context parallel is used by name: sharded(...) sets it on the model's layers")

    def plan(self, call: AttentionCall) -> str:
        return f"context parallel over {_SCOPES[-1].layout.world} ranks ({_SCOPES[-1].layout.kind} layout)"

    def __call__(self, call: AttentionCall):
        scope = _SCOPES[-1]
        parts = [m for m in (call.mask, scope.mask) if m is not None]
        mask = None if not parts else parts[0] if len(parts) == 1 else parts[0] & parts[1]
        # the plan depends on the layer's mask (its prepared mask: one per forward, shared by the layers of a
        # pattern), the batch, and this scope (mask, positions, layout, group): kept in the prepared mask per scope
        memo = None if call.prepared is None else (
            lambda build: call.prepared.memo(("context_parallel", scope, call.q.shape[0]), build))
        return context_parallel_attention(call.q, call.k, call.v, mask, bias=call.bias, scale=call.scale,
                                          softcap=call.softcap, positions=scope.positions, layout=scope.layout,
                                          group=scope.group, strategy=scope.strategy, memo=memo)


register(ContextParallelBackend())


@dataclass(frozen=True)
class Groups:
    """This rank's place in a world of ``dp`` data-parallel replicas of ``cp`` context-parallel ranks."""

    cp: int
    dp: int
    cp_rank: int
    dp_rank: int
    group: object  # the context-parallel process group of this rank (None when cp == 1)


def data_parallel(world: int, cp: int) -> int:
    """The data-parallel replicas of a world of ``world`` ranks with ``cp`` context-parallel ranks each (checked:
    ``cp`` a positive int dividing ``world``); nothing is created, so every rank can check before any collective."""
    positive_int(cp, "context_parallel", "launch world = data_parallel x context_parallel processes with torchrun.")
    if world % cp:
        raise AttnkitValueError(f"context_parallel={cp!r} must be a positive int dividing the number of processes "
                                f"{world}; launch world = data_parallel x context_parallel processes with torchrun.")
    return world // cp


def groups(rank: int, world: int, cp: int, timeout: float | None = None) -> Groups:
    """Consecutive ranks ``[d * cp, (d + 1) * cp)`` form context-parallel group d (every rank must call this, with
    the same ``cp``: agree on it first). ``timeout``: seconds the groups' collectives wait (None: torch's default)."""
    dp = data_parallel(world, cp)
    mine = None
    if cp > 1:
        import datetime

        import torch.distributed as dist

        wait = None if timeout is None else datetime.timedelta(seconds=timeout)
        for d in range(dp):
            g = dist.new_group(list(range(d * cp, (d + 1) * cp)), timeout=wait)
            if d == rank // cp:
                mine = g
    return Groups(cp, dp, rank % cp, rank // cp, mine)


def shard_rows(layout: ShardLayout, rank: int, *tensors: torch.Tensor | None):
    """Rank ``rank``'s columns of each ``(B, L)`` tensor (None stays None)."""
    return tuple(None if t is None else layout.shard(t, rank, dim=1) for t in tensors)


def check_model(model: torch.nn.Module, names=str) -> None:
    """Refuse a model whose attention does not all go through the backend (linear attention layers keep a
    running state over the local tokens only, which would silently ignore the other ranks), that recomputes its
    forward in backward (gradient checkpointing: outside the scope), or that has attention dropout (the context
    parallel backend has none). ``names(field)``: how the message names a setting (the CLI passes its flags)."""
    from attnkit.nn import LinearAttention, MultiHeadAttention

    if getattr(model, "gradient_checkpointing", False):
        raise BackendUnsupportedError(
            "context parallelism with gradient checkpointing: the recomputed forward runs in backward, outside "
            f"the sharded() scope; train with {names('context_parallel')} 1 or without "
            f"{names('grad_checkpointing')}.")
    dropping = sorted({m.dropout for m in model.modules() if isinstance(m, MultiHeadAttention) and m.dropout > 0})
    if dropping:
        raise BackendUnsupportedError(
            f"context parallelism with attention dropout {dropping[-1]:g}: the context parallel backend has no "
            f"attention dropout; train with {names('dropout')} 0 or {names('context_parallel')} 1.")
    found = [name for name, m in model.named_modules() if isinstance(m, LinearAttention)]
    if found:
        raise BackendUnsupportedError(
            f"context parallelism shards attention through backend='context_parallel', but layers {found[:3]} are "
            "linear attention (a running state over local tokens only); train this model with context_parallel=1.")

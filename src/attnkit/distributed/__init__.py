"""Context parallelism: attention over a sequence split across processes, for every mask, on torch.distributed.

>>> import attnkit as ak
>>> layout = ak.distributed.layout_for(ak.masks.causal(), seq_len=8, world=2)   # zigzag
>>> layout.chunks
(((0, 2), (6, 8)), ((2, 4), (4, 6)))

Each rank takes ``layout.shard(x, rank)`` of its inputs and calls :func:`context_parallel_attention`;
:func:`explain` says which strategy (ring or all-gather) runs and why. Models built with
``backend="context_parallel"`` run sharded inside :func:`sharded` (importing this package registers that
backend). See docs/distributed.md.
"""

from attnkit.distributed.attention import CPExplanation, context_parallel_attention, explain
from attnkit.distributed.comm import MessageLog, count_messages
from attnkit.distributed.kernel import merge
from attnkit.distributed.layout import ShardLayout, by_documents, contiguous, layout_for, zigzag
from attnkit.distributed.scope import (
    ContextParallelBackend,
    Groups,
    check_model,
    data_parallel,
    groups,
    shard_rows,
    sharded,
)

__all__ = [
    "context_parallel_attention", "explain", "CPExplanation", "ShardLayout", "contiguous", "zigzag",
    "by_documents", "layout_for", "count_messages", "MessageLog", "merge", "sharded", "groups", "Groups",
    "shard_rows", "ContextParallelBackend", "check_model", "data_parallel",
]

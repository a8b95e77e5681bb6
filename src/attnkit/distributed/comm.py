"""Point-to-point messages between the ranks of a context-parallel group, counted.

Every byte that context parallelism moves goes through :meth:`Comm.start`: one batch of sends and
receives (``torch.distributed.batch_isend_irecv``, so NCCL sees them as one group and cannot deadlock on
their order; gloo runs them asynchronously). Both strategies use it: the all-gather strategy posts one
batch to exactly the ranks whose queries need a shard (gloo has no reduce-scatter, and a full all-gather
would move shards nobody needs), the ring posts one batch per step to its neighbours.

:func:`count_messages` records each send (``what``, peer, bytes) while active: tests assert the traffic a
mask requires, and ``attnkit bench cp`` reports it.

Messages in one batch are posted in ``tag`` order on both sides, one per (peer, tag), so NCCL (which
matches by order) and gloo (which matches by tag) pair them the same way.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

_LOGS: list[MessageLog] = []


@dataclass(frozen=True)
class Message:
    what: str  # "kv", "dkv" (travelling accumulator), "dkv-home" (to the shard's owner)
    phase: str  # "forward" or "backward"
    peer: int  # group rank of the receiver
    nbytes: int


@dataclass
class MessageLog:
    """The messages this rank sent while :func:`count_messages` was active."""

    sent: list[Message] = field(default_factory=list)

    def count(self, what: str | None = None, phase: str | None = None) -> int:
        return len(self.select(what, phase))

    def nbytes(self, what: str | None = None, phase: str | None = None) -> int:
        return sum(m.nbytes for m in self.select(what, phase))

    def select(self, what: str | None = None, phase: str | None = None) -> list[Message]:
        return [m for m in self.sent if (what is None or m.what == what) and (phase is None or m.phase == phase)]


@contextlib.contextmanager
def count_messages():
    """Record every context-parallel message this process sends: ``with count_messages() as log: ...``."""
    log = MessageLog()
    _LOGS.append(log)
    try:
        yield log
    finally:
        _LOGS.remove(log)


class Pending:
    """Messages in flight; :meth:`wait` blocks until they are all done (idempotent)."""

    def __init__(self, works):
        self._works = works

    def wait(self) -> None:
        for w in self._works:
            w.wait()
        self._works = []


@dataclass(frozen=True)
class Send:
    peer: int
    tensor: torch.Tensor
    tag: int
    what: str


@dataclass(frozen=True)
class Recv:
    peer: int
    tensor: torch.Tensor  # filled in place
    tag: int


class Comm:
    """A context-parallel group: this process's ``rank`` in it, its ``world`` size, and batched messages."""

    def __init__(self, group=None):
        self.group = group
        if dist.is_available() and dist.is_initialized():
            self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        else:
            self.rank, self.world = 0, 1

    def start(self, sends: list[Send], recvs: list[Recv], phase: str) -> Pending:
        """Post ``sends`` and ``recvs`` as one batch and return at once; ``.wait()`` before using them."""
        ops = []
        for item in sorted([*sends, *recvs], key=lambda m: (m.tag, isinstance(m, Recv), m.peer)):
            op = dist.isend if isinstance(item, Send) else dist.irecv
            tensor = item.tensor if isinstance(item, Recv) else item.tensor.contiguous()
            ops.append(dist.P2POp(op, tensor, self._global(item.peer), self.group, item.tag))
        for s in sends:
            for log in _LOGS:
                log.sent.append(Message(s.what, phase, s.peer, s.tensor.numel() * s.tensor.element_size()))
        return Pending(dist.batch_isend_irecv(ops) if ops else [])

    def _global(self, peer: int) -> int:
        return peer if self.group is None else dist.get_global_rank(self.group, peer)

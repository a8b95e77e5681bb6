"""torch.distributed for ``attnkit train``: the process group from torchrun's environment, and helpers.

``torchrun --nproc-per-node N -m attnkit.cli.main train ...`` (or ``torchrun $(which attnkit) train``) starts
N ranks; each wraps the model in DistributedDataParallel (gloo on CPU, nccl on GPU) and takes its slice of
every global batch. Rank 0 writes metrics and checkpoints.

The ranks of one run agree or stop: at the start every rank compares its settings with rank 0's
(:func:`check_same`: a typed error naming each setting that differs, on every rank); what a rank would decide for
itself (``precision="auto"``, the step count of a ``time_budget``) is decided by rank 0 and sent to all
(:func:`from_rank0`); every collective has a bounded timeout (``ATTNKIT_DIST_TIMEOUT`` seconds, default
:data:`DEFAULT_TIMEOUT_S`), so a rank that stopped or died ends the job with :class:`RankLost` instead of a hang.
"""

from __future__ import annotations

import datetime
import json
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from attnkit.errors import AttnkitError, AttnkitValueError, EnvironmentUnsupportedError

#: seconds a collective waits for the other ranks before the job ends (override: ATTNKIT_DIST_TIMEOUT)
DEFAULT_TIMEOUT_S = 600.0


class RankLost(EnvironmentUnsupportedError):
    """Another rank stopped, died or hangs: a collective failed or timed out."""


class RanksDisagree(AttnkitValueError):
    """The ranks of one run were started with different settings."""


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world > 1


def pick_device(name: str) -> torch.device:
    """``"auto"`` = CUDA when present, else CPU; any other name as given, checked here (at run time, not import):
    a device this machine lacks is a typed error before anything is written."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as exc:
        raise AttnkitValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N' (or 'mps'), got {name!r}; pass device='cpu' "
                                "or device='auto'.") from exc
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise EnvironmentUnsupportedError(
                f"device={name!r}: CUDA is not available here (torch {torch.__version__}, "
                f"{'built without CUDA' if torch.version.cuda is None else 'no GPU visible'}); use device='cpu' or "
                "device='auto'.")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise EnvironmentUnsupportedError(f"device={name!r}: this machine has {torch.cuda.device_count()} CUDA "
                                              f"device(s) (cuda:0 .. cuda:{torch.cuda.device_count() - 1}).")
    elif device.type == "mps" and not (torch.backends.mps.is_built() and torch.backends.mps.is_available()):
        raise EnvironmentUnsupportedError(f"device={name!r}: Apple's MPS is not available here (torch "
                                          f"{torch.__version__}); use device='cpu' or device='auto'.")
    elif device.type not in ("cpu", "mps", "xpu"):
        raise AttnkitValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N' (or 'mps'), got {name!r}; pass device='cpu' "
                                "or device='auto'.")
    return device


def init(device_name: str = "auto") -> DistContext:
    """Join the process group when launched by torchrun (``WORLD_SIZE > 1``); otherwise a 1-process context."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    device = pick_device(device_name)
    if world <= 1:
        return DistContext(0, 1, device)
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                timeout=datetime.timedelta(seconds=timeout_s()))
    return DistContext(rank, world, device)


def timeout_s() -> float:
    """The collectives' timeout: ``ATTNKIT_DIST_TIMEOUT`` seconds, else :data:`DEFAULT_TIMEOUT_S`."""
    raw = os.environ.get("ATTNKIT_DIST_TIMEOUT")
    if raw is None:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise AttnkitValueError(f"ATTNKIT_DIST_TIMEOUT must be a number of seconds > 0, got {raw!r}; unset it for "
                                f"the default {DEFAULT_TIMEOUT_S:.0f} s.")
    return value


def check_same(settings: dict, ctx: DistContext, names=str) -> None:
    """Every rank must run with rank 0's ``settings`` (JSON-able): a :class:`RanksDisagree` on every rank naming each
    setting that differs (``names(field)``: how to name it) and its value on each rank otherwise."""
    if not ctx.enabled:
        return
    mine = json.loads(json.dumps(settings, sort_keys=True, default=str))
    every: list = [None] * ctx.world
    dist.all_gather_object(every, mine)
    differ = sorted({key for other in every for key in set(other) | set(every[0])
                     if other.get(key) != every[0].get(key)})
    if differ:
        listed = "; ".join(f"{names(key)}: " + ", ".join(f"rank {r} {every[r].get(key)!r}" for r in range(ctx.world))
                           for key in differ)
        raise RanksDisagree(f"the {ctx.world} ranks of this run were started with different settings ({listed}); start "
                            "every rank with the same command and data.")


#: how the settings check names what is not a setting of its own
CHECKED = {"data_sha256": "the training data (its sha256)", "resumed": "the checkpoint resumed (run, step, weights)",
           "started_from": "the checkpoint started from (run, step, weights)"}


def agreed(ctx: DistContext, names=str):
    """``check(settings)``: :func:`check_same` for this run's ranks, naming a setting by ``names(field)`` and the
    checked values that are not settings (:data:`CHECKED`) in words."""
    return lambda settings: check_same(settings, ctx, lambda key: CHECKED.get(key) or names(key))


def from_rank0(value, ctx: DistContext):
    """Rank 0's ``value`` on every rank (a picklable object; itself in one process)."""
    if not ctx.enabled:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def lost(exc: BaseException, ctx: DistContext) -> RankLost | None:
    """The :class:`RankLost` that a failed collective means (None when ``exc`` is something else)."""
    if not ctx.enabled or not isinstance(exc, RuntimeError) or isinstance(exc, AttnkitError):
        return None
    text = str(exc)
    if not isinstance(exc, getattr(dist, "DistError", ())) and not any(
            marker in text for marker in ("gloo", "nccl", "NCCL", "Timed out", "timed out", "Connection")):
        return None
    return RankLost(f"rank {ctx.rank}: another rank of this run stopped, died or hangs (a collective failed: "
                    f"{text.splitlines()[0][:200]}); see that rank's output for why. Collectives wait "
                    f"{timeout_s():.0f} s (ATTNKIT_DIST_TIMEOUT) before the job ends.")


def check_batch(batch_size: int, ctx: DistContext) -> None:
    if batch_size % ctx.world:
        raise AttnkitValueError(f"batch_size={batch_size} must be divisible by the number of processes "
                                f"{ctx.world}; each rank takes batch_size / world rows of every global batch.")


def mean(value: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    """Average a tensor over ranks (identity in one process)."""
    if ctx.enabled:
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        value /= ctx.world
    return value


def any_rank(flag: bool, ctx: DistContext) -> bool:
    """True on every rank when ``flag`` is True on any rank (one all-reduce; the flag itself in one process)."""
    if not ctx.enabled:
        return flag
    value = torch.tensor([int(flag)], device=ctx.device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def gather_rng(ctx: DistContext) -> dict[str, torch.Tensor]:
    """Every rank's torch CPU RNG state, as ``rng.torch.rank<r>`` (empty in one process)."""
    if not ctx.enabled:
        return {}
    state = torch.get_rng_state().to(ctx.device)
    states = [torch.empty_like(state) for _ in range(ctx.world)]
    dist.all_gather(states, state)
    return {f"rng.torch.rank{r}": s.cpu() for r, s in enumerate(states)}


def barrier(ctx: DistContext) -> None:
    if ctx.enabled:
        dist.barrier()


def shutdown(ctx: DistContext) -> None:
    if ctx.enabled and dist.is_initialized():
        dist.destroy_process_group()

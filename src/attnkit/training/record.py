"""What a run records about itself: its identity, ``config.json`` and its checkpoints (written through
:mod:`attnkit.runs.write`, read back by :mod:`attnkit.runs.read`)."""

from __future__ import annotations

import json
import math
import uuid
from dataclasses import asdict
from pathlib import Path

from attnkit.runs import write as ckpt
from attnkit.runs.read import RUN_CONFIG
from attnkit.training import dist

#: a run without ``ckpt_every`` checkpoints about this many times, and at least every MAX_CKPT_EVERY steps
CKPTS_PER_RUN, MAX_CKPT_EVERY = 10, 100


def checkpoint_interval(ckpt_every: int | None, total_steps: int) -> int:
    """Steps between checkpoints: ``ckpt_every`` when set, else a tenth of the run (at most 100 steps), so a short
    run (``make demo``, every ``--minutes`` run) has checkpoints long before its end."""
    if ckpt_every is not None:
        return ckpt_every
    return max(1, min(MAX_CKPT_EVERY, math.ceil(total_steps / CKPTS_PER_RUN)))


def new_run_id() -> str:
    return uuid.uuid4().hex


def identity(trainer) -> dict:
    """What config.json and every checkpoint record about the run beyond its settings."""
    out = {"run_id": trainer.run_id, "precision": trainer.precision, "precision_evidence": trainer.precision_evidence,
           "total_steps": trainer.total_steps, "schedule_steps": trainer.schedule_steps,
           "data_sha256": trainer.data_sha256, "world": trainer.ctx.world}
    if getattr(trainer, "deadline", None) is not None:  # a time budget: the first plan, the re-plans, the steps run
        out["time_budget"] = trainer.deadline.summary(trainer.first_plan, trainer.step)
    if trainer.init_state is not None:
        out["init_from"] = {"run_id": trainer.init_state.get("run_id"), "step": trainer.init_state["step"],
                            "model_sha256": trainer.init_state["sha256"][ckpt.FILES[0]]}
    return out


def write_config(trainer) -> None:
    """RUN/config.json: the settings and the identity of the run (replaced, never written through a link)."""
    record = {"train": asdict(trainer.config), "model": trainer.model_config.to_dict(), **identity(trainer)}
    with ckpt.replacing(trainer.run_dir / RUN_CONFIG) as f:
        f.write(json.dumps(record, indent=1).encode())


def has_config(run_dir: Path) -> bool:
    """RUN/config.json exists (or is a link: :func:`attnkit.runs.read.read_state` judges it)."""
    return (run_dir / RUN_CONFIG).exists() or (run_dir / RUN_CONFIG).is_symlink()


def save(trainer) -> None:
    """Checkpoint the trainer's current step (rank 0 writes; every rank's RNG state is gathered first)."""
    extra = dist.gather_rng(trainer.ctx)
    if trainer.ctx.is_main:
        c = trainer.config
        state = {**identity(trainer),
                 "data_position": {"micro_batches": trainer.step * c.accum, "seed": c.seed},
                 "schedule": {"kind": "warmup+cosine", "step": trainer.step, "cosine_end": trainer.schedule_steps},
                 "train_config": asdict(c), "model_config": trainer.model_config.to_dict(),
                 "metrics": trainer.metrics.fingerprint() if getattr(trainer, "metrics", None) else None}
        ckpt.save_checkpoint(trainer.run_dir, trainer.step, trainer.model, trainer.optimizer, state, keep=c.keep,
                             extra_tensors=extra)
        if trainer.folder is not None:
            trainer.folder.committed()  # the new run has a checkpoint: a run it replaced can go
    dist.barrier(trainer.ctx)

"""What a run records about itself: its identity, ``config.json`` and its checkpoints (written through
:mod:`attnkit.runs.write`, read back by :mod:`attnkit.runs.read`), ``metrics.jsonl`` opened at its start, and the
checkpoint of a run stopped on request (:func:`interrupted`)."""

from __future__ import annotations

import json
import math
import uuid
from dataclasses import asdict
from pathlib import Path

from attnkit.models.config import LMConfig
from attnkit.runs import write as ckpt
from attnkit.runs.read import METRICS, RUN_CONFIG
from attnkit.training import dist
from attnkit.training.interrupt import TrainingInterrupted
from attnkit.training.metrics import MetricsWriter

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


def open_outputs(trainer, baseline: float) -> None:
    """metrics.jsonl (cut back to the resumed step), config.json, and what the run is, said once."""
    c, resumed = trainer.config, trainer.resume_state is not None
    trainer.metrics = (MetricsWriter(trainer.run_dir / METRICS, resume_step=trainer.step if resumed else None,
                                     log=trainer.log) if trainer.ctx.is_main else None)
    if trainer.metrics is not None and resumed:
        problem = trainer.metrics.verify(trainer.resume_state.get("metrics"))
        if problem:
            trainer.log(f"WARNING: metrics.jsonl {problem}; the records after the checkpoint continue from step "
                        f"{trainer.step}")
    if trainer.ctx.is_main and not resumed:
        write_config(trainer)
    elif trainer.ctx.is_main and not has_config(trainer.run_dir):
        write_config(trainer)  # its checkpoints agree on the run (read_state checked): the identity is back
        trainer.log(f"{trainer.run_dir / RUN_CONFIG} was missing: written again from the checkpoint (run {trainer.run_id})")
    origin = f"{c.preset} preset" if not resumed and trainer.init_state is None else "the checkpoint's own"
    trainer.log(f"model: {origin}, {_describe(trainer.model_config)}, {trainer.model.num_parameters() / 1e6:.2f} M "
                f"parameters, {trainer.precision}, {trainer.total_steps} steps of {trainer.tokens_per_step():,} tokens, "
                f"world {trainer.ctx.world}")
    trainer.log(f"unigram baseline loss: {baseline:.3f} nats/token (perplexity {math.exp(baseline):.1f})")


def interrupted(trainer, saved: bool) -> None:
    """A stop was requested (on some rank): checkpoint this step unless it just was, and raise."""
    if not saved:
        trainer.save()
    if trainer.metrics is not None:
        trainer.metrics.close()
    newest = ckpt.list_checkpoints(trainer.run_dir)[-1] if trainer.ctx.is_main else None
    raise TrainingInterrupted(
        f"stopped by {trainer.stop_request.name if trainer.stop_request.signum is not None else 'another rank'} after step "
        f"{trainer.step}/{trainer.total_steps}: checkpoint {newest} written; continue the run with "
        f"{trainer.names('resume')} {trainer.run_dir}", run_dir=trainer.run_dir, step=trainer.step, checkpoint=newest,
        signum=trainer.stop_request.signum or 15)


def _describe(config: LMConfig) -> str:
    """The model in a few words, as built (not as asked)."""
    kv = f", {config.num_kv_heads} KV heads" if config.num_kv_heads not in (None, config.num_heads) else ""
    window = f", window {config.window}" if config.window is not None else ""
    return (f"{config.num_layers} layers, dim {config.embed_dim}, {config.num_heads} heads{kv}, {config.positions} positions"
            f"{window}")

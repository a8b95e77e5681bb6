"""What a run records about itself: its identity, ``config.json`` and its checkpoints (written through
:mod:`attnkit.runs.write`, read back by :mod:`attnkit.runs.read`), ``metrics.jsonl`` opened at its start, and the
checkpoint of a run stopped on request (:func:`interrupted`).

Functions of the run's values (:class:`attnkit.training.state.Setup`, :class:`attnkit.training.state.Progress`,
the process's :class:`attnkit.training.dist.DistContext`); none of them writes to a Trainer."""

from __future__ import annotations

import json
import math
import uuid
from dataclasses import asdict
from pathlib import Path

from attnkit.models.config import LMConfig
from attnkit.runs import read as reader
from attnkit.runs import write as ckpt
from attnkit.runs.read import METRICS, RUN_CONFIG
from attnkit.training import dist
from attnkit.training.interrupt import TrainingInterrupted
from attnkit.training.metrics import MetricsWriter
from attnkit.training.state import Progress, Setup

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


def identity(setup: Setup, progress: Progress, world: int, deadline=None) -> dict:
    """What config.json and every checkpoint record about the run beyond its settings (``deadline``: a time
    budget's :class:`attnkit.training.deadline.Deadline`, whose plans are recorded too)."""
    p = progress
    out = {"run_id": p.run_id, "precision": p.precision, "precision_evidence": p.precision_evidence,
           "total_steps": p.total_steps, "schedule_steps": p.schedule_steps,
           "data_sha256": setup.data.data_sha256, "world": world}
    if deadline is not None:  # a time budget: the first plan, the re-plans, the steps run
        out["time_budget"] = {**deadline.summary(p.first_plan, p.step), **deadline.pace(p.step)}
    if setup.init_state is not None:
        out["init_from"] = {"run_id": setup.init_state.get("run_id"), "step": setup.init_state["step"],
                            "model_sha256": setup.init_state["sha256"][reader.FILES[0]]}
    return out


def write_config(setup: Setup, progress: Progress, world: int, deadline=None) -> None:
    """RUN/config.json: the settings and the identity of the run (replaced, never written through a link)."""
    record = {"train": asdict(progress.settings(setup.config)), "model": setup.model_config.to_dict(),
              **identity(setup, progress, world, deadline)}
    with ckpt.replacing(setup.run_dir / RUN_CONFIG) as f:
        f.write(json.dumps(record, indent=1).encode())


def has_config(run_dir: Path) -> bool:
    """RUN/config.json exists (or is a link: :func:`attnkit.runs.read.read_state` judges it)."""
    return (run_dir / RUN_CONFIG).exists() or (run_dir / RUN_CONFIG).is_symlink()


def save(setup: Setup, progress: Progress, ctx, *, metrics: MetricsWriter | None = None, folder=None,
         deadline=None) -> None:
    """Checkpoint the current step (rank 0 writes; every rank's RNG state is gathered first); ``folder``: the run
    folder rank 0 holds, told that the run has a checkpoint."""
    extra = dist.gather_rng(ctx)
    if ctx.is_main:
        c, step = progress.settings(setup.config), progress.step
        state = {**identity(setup, progress, ctx.world, deadline),
                 "data_position": {"micro_batches": step * c.accum, "seed": c.seed},
                 "schedule": {"kind": "warmup+cosine", "step": step, "cosine_end": progress.schedule_steps},
                 "train_config": asdict(c), "model_config": setup.model_config.to_dict(),
                 "metrics": metrics.fingerprint() if metrics is not None else None}
        ckpt.save_checkpoint(setup.run_dir, step, setup.model, setup.optimizer, state, keep=c.keep,
                             extra_tensors=extra)
        if folder is not None:
            folder.committed()  # the new run has a checkpoint: a run it replaced can go
    dist.barrier(ctx)


def open_outputs(setup: Setup, progress: Progress, ctx, baseline: float, log, deadline=None
                 ) -> MetricsWriter | None:
    """metrics.jsonl (cut back to the resumed step; rank 0's writer is returned, None elsewhere), config.json, and
    what the run is, said once."""
    c, resumed, run_dir = setup.config, setup.resume_state is not None, setup.run_dir
    metrics = (MetricsWriter(run_dir / METRICS, resume_step=progress.step if resumed else None, log=log)
               if ctx.is_main else None)
    if metrics is not None and resumed:
        problem = metrics.verify(setup.resume_state.get("metrics"))
        if problem:
            log(f"WARNING: metrics.jsonl {problem}; the records after the checkpoint continue from step "
                f"{progress.step}")
    if ctx.is_main and not resumed:
        write_config(setup, progress, ctx.world, deadline)
    elif ctx.is_main and not has_config(run_dir):
        write_config(setup, progress, ctx.world, deadline)  # its checkpoints agree on the run: the identity is back
        log(f"{run_dir / RUN_CONFIG} was missing: written again from the checkpoint (run {progress.run_id})")
    origin = f"{c.preset} preset" if not resumed and setup.init_state is None else "the checkpoint's own"
    log(f"model: {origin}, {_describe(setup.model_config)}, {setup.model.num_parameters() / 1e6:.2f} M "
        f"parameters, {progress.precision}, {progress.total_steps} steps of {tokens_per_step(setup):,} tokens, "
        f"world {ctx.world}")
    log(f"unigram baseline loss: {baseline:.3f} nats/token (perplexity {math.exp(baseline):.1f})")
    return metrics


def tokens_per_step(setup: Setup) -> int:
    """Tokens of one optimizer step over every rank."""
    return setup.config.batch_size * setup.config.accum * setup.data.seq_len


def interrupted(setup: Setup, progress: Progress, ctx, stop_request, names) -> TrainingInterrupted:
    """The error that ends a run stopped on request (on some rank), once its step is checkpointed: the same on every
    rank (each names the checkpoint rank 0 wrote for this step, and the resume of all ``world`` processes)."""
    newest = ckpt.checkpoint_dir(setup.run_dir, progress.step)
    every = f" (all {ctx.world} processes, as this run was started)" if ctx.world > 1 else ""
    return TrainingInterrupted(
        f"stopped by {stop_request.name if stop_request.signum is not None else 'another rank'} after step "
        f"{progress.step}/{progress.total_steps}: checkpoint {newest} written; continue the run with "
        f"{names('resume')} {setup.run_dir}{every}", run_dir=setup.run_dir, step=progress.step, checkpoint=newest,
        signum=stop_request.signum or 15, world=ctx.world)


def _describe(config: LMConfig) -> str:
    """The model in a few words, as built (not as asked)."""
    kv = f", {config.num_kv_heads} KV heads" if config.num_kv_heads not in (None, config.num_heads) else ""
    window = f", window {config.window}" if config.window is not None else ""
    return (f"{config.num_layers} layers, dim {config.embed_dim}, {config.num_heads} heads{kv}, {config.positions} positions"
            f"{window}")

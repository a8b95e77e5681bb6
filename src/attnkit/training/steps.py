"""One optimizer step and what it is made of: the loss (whole rows, or a context-parallel shard), weight-decay
groups, validation, the divergence stop, and the plain-words verdict at the end.

Shape legend: B rows per micro-batch (this rank), L seq_len, L_r this rank's share of a row, V vocab_size.
"""

from __future__ import annotations

import contextlib
import math
import time

import torch
import torch.nn.functional as F

from attnkit import _progress, masks
from attnkit import distributed as cp
from attnkit.errors import AttnkitError
from attnkit.models.lm import TransformerLM
from attnkit.runs import read as reader
from attnkit.training import dist
from attnkit.training.precision import autocast
from attnkit.training.schedule import lr_at


class TrainingDiverged(AttnkitError, FloatingPointError):
    """The loss or the gradient norm became NaN or infinite: the run stopped before the optimizer step."""


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay for matrices (linear weights, embeddings), none for norms and biases; tied weights once."""
    decay, no_decay = [], []
    for p in model.parameters():  # parameters() yields each shared tensor once
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def lm_loss(model, batch, precision: str, device: torch.device) -> torch.Tensor:
    """Mean next-token cross-entropy of a batch (logits upcast to fp32 for the loss)."""
    with autocast(precision, device):
        logits = model(batch.inputs, positions=batch.positions, doc_ids=batch.doc_ids)  # (B, L, V)
    return F.cross_entropy(logits.float().flatten(0, 1), batch.targets.flatten())


def cp_lm_loss(model, bare: TransformerLM, batch, precision: str, device: torch.device, groups) -> torch.Tensor:
    """:func:`lm_loss` on a context-parallel rank: its shard of every row, attention over the whole row.

    Scaled by ``cp`` so that DDP's average over all ``dp x cp`` ranks is the gradient of the whole batch's
    mean loss (and so is the averaged loss itself)."""
    B, L = batch.inputs.shape
    positions = batch.positions if batch.positions is not None else torch.arange(L, device=device).expand(B, L)
    layout = cp.layout_for(bare.mask(doc_ids=batch.doc_ids), L, groups.cp)  # balanced for the row's mask
    inputs, targets, local_positions = cp.shard_rows(layout, groups.cp_rank, batch.inputs, batch.targets, positions)
    documents = None if batch.doc_ids is None else masks.document(batch.doc_ids)  # needs the whole row
    with cp.sharded(layout, documents, positions=positions, group=groups.group, modules=bare), \
            autocast(precision, device):
        logits = model(inputs, positions=local_positions)  # (B, L_r, V)
    total = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="sum")
    return total * groups.cp / (B * L)


@torch.no_grad()
def evaluate(model, batches, precision: str, device: torch.device) -> float:
    """Mean validation loss over fixed batches (token-weighted)."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for batch in batches:
        batch = batch.to(device)
        total += float(lm_loss(model, batch, precision, device)) * batch.targets.numel()
        count += batch.targets.numel()
    model.train(was_training)
    return total / max(count, 1)


def step_lr(config, step: int, schedule_steps: int) -> float:
    """The learning rate of ``step``: warmup + cosine to ``schedule_steps``; constant for the overfit check."""
    if config.overfit:
        return config.lr  # no decay: the sanity check needs to reach ~0
    return lr_at(step, lr=config.lr, warmup=config.warmup, total=schedule_steps, min_lr_ratio=config.min_lr_ratio)


def optimizer_step(setup, progress, *, ddp, groups, ctx, names) -> tuple[float, float, float]:
    """Run the next optimizer step (``progress.step + 1``) of a run (:class:`attnkit.training.state.Setup`): its
    accumulated micro-batches, clipping, the update through ``ddp`` (the DistributedDataParallel wrapper, or None);
    return ``(loss, grad_norm, lr)``. A NaN or infinite loss or norm stops the run before the update."""
    c, model, device, step = setup.config, setup.model, ctx.device, progress.step + 1
    lr = step_lr(c, step, progress.schedule_steps)
    for group in setup.optimizer.param_groups:
        group["lr"] = lr
    loss_sum = torch.zeros((), device=device)
    for micro in range(c.accum):
        batch = setup.data.train_data.batch((step - 1) * c.accum + micro, c.batch_size, seed=c.seed,
                                            rank=groups.dp_rank, world=groups.dp).to(device)
        sync_now = ddp is None or micro == c.accum - 1
        with _maybe_no_sync(ddp, sync_now):
            loss = (lm_loss(ddp or model, batch, progress.precision, device) if groups.cp == 1 else
                    cp_lm_loss(ddp or model, model, batch, progress.precision, device, groups)) / c.accum
            loss.backward()
        loss_sum += loss.detach()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), c.clip)
    loss_value = float(dist.mean(loss_sum, ctx))
    if not (math.isfinite(loss_value) and math.isfinite(float(grad_norm))):
        raise diverged(setup, step, loss_value, float(grad_norm), lr, names)
    setup.optimizer.step()
    setup.optimizer.zero_grad(set_to_none=True)
    return loss_value, float(grad_norm), lr


def verdict(val_loss: float, baseline: float) -> str:
    """The summary line: did the model beat the unigram baseline, said plainly."""
    gap = baseline - val_loss
    if gap > 0:
        return (f"validation loss {val_loss:.3f} (perplexity {math.exp(min(val_loss, 50.0)):.2f}) beat the unigram "
                f"baseline {baseline:.3f} by {gap:.3f} nats/token")
    return (f"validation loss {val_loss:.3f} (perplexity {math.exp(min(val_loss, 50.0)):.2f}) did NOT beat the unigram "
            f"baseline {baseline:.3f}: it is {-gap:.3f} nats/token worse; train longer (more steps) or check the data")


def time_once(fn, precision: str) -> float:
    """Seconds of one call ``fn(precision)`` after one warm-up call."""
    fn(precision)
    start = time.perf_counter()
    fn(precision)
    return time.perf_counter() - start


def _maybe_no_sync(ddp, sync_now: bool):
    return contextlib.nullcontext() if sync_now or ddp is None else ddp.no_sync()


def progress_bar(enabled: bool, total: int, initial: int, desc: str = "train"):
    """Progress of optimizer steps (:func:`attnkit._progress.bar`: tqdm on a terminal, plain lines elsewhere), or
    None."""
    return _progress.bar(total, desc=desc, unit="step", initial=initial) if enabled else None


def diverged(setup, step: int, loss: float, grad_norm: float, lr: float, names) -> TrainingDiverged:
    """The error that stops a run whose loss or gradient norm is not finite, saying what was kept and the usual
    causes."""
    n = names
    newest = reader.list_checkpoints(setup.run_dir)
    kept = (f"the newest checkpoint {newest[-1]} is the last finite one (start a new run from its weights with "
            f"{n('init_from')} {newest[-1]} and a lower {n('lr')})" if newest else "no checkpoint was written yet")
    return TrainingDiverged(
        f"training stopped at step {step}: the loss is {loss} and the gradient norm {grad_norm} (lr {lr:.3g}); "
        f"nothing was saved for this step, {kept}. Usual causes: a learning rate too high ({n('lr')} "
        f"{setup.config.lr:g}), no warmup, or bf16 overflow (try {n('precision')} fp32).")

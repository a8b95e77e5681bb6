"""The start of a run, before its first step: the checkpoint it starts from (a resume or a fine-tuning start) and
the settings that follow from it, the data, the model and its optimizer, the state a resume restores.

Functions of values that return values (:class:`Opening`, :class:`attnkit.training.state.Data`, the model and its
optimizer, :class:`attnkit.training.state.Progress`), in the order :meth:`attnkit.training.loop.Trainer._setup`
calls them; none of them writes to a Trainer. Nothing here writes to the run folder.

Shape legend: L seq_len.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import torch

from attnkit import distributed as cp
from attnkit.errors import AttnkitValueError
from attnkit.models.builders import PRESETS, lm_config
from attnkit.models.config import LMConfig
from attnkit.models.lm import TransformerLM
from attnkit.runs import read as reader
from attnkit.runs import write as ckpt
from attnkit.runs.folder import RunFolder
from attnkit.runs.read import run_folder_of, set_aside_note
from attnkit.runs.tokens import ByteTokenizer
from attnkit.training import dist, record
from attnkit.training.config import TrainConfig, init_config, resumed_config
from attnkit.training.data import PackedDataset, data_fingerprint, load_documents, split_by_file
from attnkit.training.precision import choose_precision
from attnkit.training.state import Data, Progress, Setup
from attnkit.training.steps import lm_loss, param_groups, time_once


@dataclass(frozen=True)
class Opening:
    """What a run starts from: the settings that follow from its checkpoint, the model config (None: from the
    preset, once the data's row length is known), the checkpoint resumed (``resume_from``, its ``resume_state``)
    or started from (``init_from``, its ``init_state``), and the run folder's lock a resume took (rank 0)."""

    config: TrainConfig
    model_config: LMConfig | None = None
    resume_from: Path | None = None
    resume_state: dict | None = None
    init_from: Path | None = None
    init_state: dict | None = None
    folder: RunFolder | None = None


def open_start(ctx, config: TrainConfig, resume, init_from, given, log, names) -> Opening:
    """The checkpoint a run starts from, verified, and the settings that follow from it. A resume's run folder
    is locked first (a run training there must not change the files); a refusal after that releases the lock."""
    n = names
    if resume is not None:
        folder = None
        try:
            if ctx.is_main and set_aside_note(resume):  # a stopped --overwrite: the lock puts the old run back
                folder = RunFolder(resume, log=log).acquire()
            dist.barrier(ctx)
            where = reader.resolve(resume)
            run_dir = run_folder_of(where, resume, fix=f"resume the run folder it belongs to, or start a new run from "
                                                       f"its weights with {n('init_from')} {resume} {n('run_dir')} NEW.")
            if ctx.is_main and folder is None:
                folder = RunFolder(run_dir, log=log).acquire()
            state = reader.read_state(where)  # its run identity checked against the folder
            if "train_config" not in state:
                raise reader.CheckpointError(
                    f"{n('resume')} {str(resume)!r}: {where} was not written by the trainer (a converted model has no "
                    f"training state to continue); start a new run from its weights with {n('init_from')} {resume}.")
            config, notes = resumed_config(config, state, given, run_dir, n)
        except BaseException:
            if folder is not None:
                folder.release()
            raise
        for note in notes:
            log(note)
        return Opening(config, LMConfig.from_dict(state["model_config"]), resume_from=where, resume_state=state,
                       folder=folder)  # the model is never rebuilt from the preset
    if init_from is not None:
        where = reader.resolve(init_from)
        state = reader.read_state(where)
        model_config = LMConfig.from_dict(state["model_config"])
        config, notes = init_config(config, state, given, where, model_config, n)
        for note in notes:
            log(note)
        return Opening(config, model_config, init_from=where, init_state=state)
    return Opening(config)


def digest(state: dict | None) -> dict | None:
    """What identifies the checkpoint a run starts from (its run, step and weights), for the ranks to compare:
    node-local copies of a run folder can hold different newest checkpoints under the same path."""
    if state is None:
        return None
    return {"run_id": state.get("run_id"), "step": state.get("step"),
            "model_sha256": (state.get("sha256") or {}).get(reader.FILES[0])}


def build_setup(config: TrainConfig, opening: Opening, data: Data, tokenizer: ByteTokenizer, groups, device, log,
                names) -> Setup:
    """The run's :class:`Setup`: the model from the checkpoint's config, else the preset's, with gradient
    checkpointing and context-parallel accounting; an ``init_from`` checkpoint's weights loaded; the optimizer."""
    model_config, seq_len = opening.model_config, data.seq_len
    where = opening.resume_from or opening.init_from
    if model_config is None:
        model_config = lm_config(config.preset, **{"vocab_size": tokenizer.vocab_size, "max_seq_len": max(
            seq_len, PRESETS[config.preset]["max_seq_len"]), **config.model})
    elif seq_len > model_config.max_seq_len:
        raise AttnkitValueError(f"seq_len={seq_len} exceeds max_seq_len={model_config.max_seq_len} of "
                                f"the checkpoint {where}; pass {names('seq_len')} {model_config.max_seq_len} "
                                "or less.")
    model = TransformerLM(model_config).to(device)
    if opening.init_state is not None:
        reader.load_weights(where, model)
        log(f"initialised from {where} (step {opening.init_state['step']}, run "
            f"{opening.init_state.get('run_id')}): a new run with its weights and a fresh optimizer")
    model.gradient_checkpointing = config.grad_checkpointing
    counting = sent = None
    if groups.cp > 1:
        cp.check_model(model, names)
        counting = contextlib.ExitStack()  # this rank's context-parallel bytes, per step in metrics
        sent = counting.enter_context(cp.count_messages())
    optimizer = torch.optim.AdamW(param_groups(model, config.weight_decay), lr=config.lr, betas=config.betas,
                                  fused=False, foreach=True)
    return Setup(config, model_config, data, tokenizer, model, optimizer, resume_state=opening.resume_state,
                 init_state=opening.init_state, cp_counting=counting, cp_sent=sent)


def check_preset_length(config: TrainConfig, log, names) -> None:
    """A new run's rows fit the preset's positions when they are learned (a table of ``max_seq_len`` rows);
    longer rows with computed positions are said (the model is built for them; each step costs more)."""
    preset_len = PRESETS[config.preset]["max_seq_len"]
    positions = config.model.get("positions", PRESETS[config.preset].get("positions", "rope"))
    seq_len = config.seq_len or 0
    if seq_len > preset_len and positions != "learned":
        log(f"note: {names('seq_len')} {seq_len} is {seq_len / preset_len:.3g}x the {config.preset!r} preset's "
            f"{preset_len} positions: the model is built for rows of {seq_len} ({positions} positions), and "
            "attention's cost per row grows with the square of its length")
    if positions == "learned" and seq_len > preset_len:
        raise AttnkitValueError(
            f"{names('seq_len')} {seq_len} is longer than the {preset_len} learned positions of the "
            f"{config.preset!r} preset; pass {names('seq_len')} {preset_len} or less, or positions "
            f"that are computed ({names('positions')} rope or alibi) for longer rows.")


def restored(setup: Setup, where: Path, given, rank: int, log, names) -> Progress:
    """Continue from checkpoint ``where``: weights, optimizer and RNG loaded into the setup's model and optimizer;
    the run's :class:`Progress` (step, precision, schedule) as the checkpoint recorded it."""
    state, _ = ckpt.load_checkpoint(where, setup.model, setup.optimizer, rank=rank)
    step = state["step"]
    progress = Progress(
        run_id=state.get("run_id") or reader.run_identity(setup.run_dir) or record.new_run_id(), step=step,
        total_steps=max(setup.config.steps, step) if "steps" in given else state["total_steps"],
        schedule_steps=state.get("schedule_steps", state["total_steps"]), precision=state["precision"],
        precision_evidence=state.get("precision_evidence", {}))
    report_resume(setup, progress, where, state, log, names)
    return progress


def report_resume(setup: Setup, progress: Progress, where: Path, state: dict, log, names) -> None:
    """Say what a resume continues: its step, a schedule whose step count changed, data that changed."""
    p, c = progress, setup.config
    log(f"resumed {where} at step {p.step}/{p.total_steps} ({p.precision}, chosen when the run started)")
    if p.total_steps != state["total_steps"]:
        log(f"schedule: {state['total_steps']} -> {p.total_steps} steps; the learning rate keeps its warmup + "
            f"cosine to step {p.schedule_steps}, then holds its minimum {c.lr * c.min_lr_ratio:.3g} to step "
            f"{p.total_steps}" if p.total_steps > p.schedule_steps else
            f"schedule: stopping at step {p.total_steps}, before the cosine's end at step {p.schedule_steps}")
    elif p.step >= p.total_steps:
        log(f"the run already finished at step {p.step}; pass {names('steps')} N (N > {p.step}) to extend it")
    recorded, now = state.get("data_sha256"), setup.data.data_sha256
    if recorded is not None and recorded != now:
        log(f"WARNING: the training data changed since this checkpoint (sha256 {recorded[:12]}... -> {now[:12]}...): "
            "the resumed run continues on different data, so it is no longer the run it was")


def load_data(config: TrainConfig, log) -> Data:
    """The documents loaded and fingerprinted, split by file into train / validation, packed into rows of L."""
    c = config
    seq_len = c.seq_len or PRESETS[c.preset]["max_seq_len"]
    docs = load_documents(c.data)
    sha256 = data_fingerprint(docs)
    train_docs, val_docs = split_by_file(docs, c.val_fraction)
    train = PackedDataset(train_docs, seq_len, doc_mask=c.doc_mask)
    val = PackedDataset(val_docs, seq_len, doc_mask=c.doc_mask)
    if c.overfit:  # the tutorial's sanity check: the same few rows every step
        train.num_rows = min(train.num_rows, c.overfit_samples)
    log(f"data: {c.data or 'Python standard library sources'} - {len(train_docs)} train / {len(val_docs)} val "
        f"documents, {train.num_tokens:,} / {val.num_tokens:,} tokens, rows of {seq_len}, document mask "
        f"{'on' if c.doc_mask else 'off'}")
    return Data(seq_len, sha256, train, val)


def plan(setup: Setup, groups, ctx, deadline, log) -> tuple[str, int, dict, float | None, float | None]:
    """A new run's precision and length, decided on rank 0 for every rank: ``(precision, steps, evidence, eval_s,
    step_s)``; ``precision="auto"`` measures fp32 against bf16 here, a time budget (``deadline``) plans its steps
    from a probe (``eval_s``: its estimate of one validation pass, ``step_s``: of one step with its share of the
    evaluations; else None). The RNG state is left as it was."""
    c, model, device = setup.config, setup.model, ctx.device
    batch = setup.data.train_data.batch(0, c.batch_size, seed=c.seed, rank=groups.dp_rank, world=groups.dp).to(device)
    rng = torch.get_rng_state()

    def fwd_bwd(precision: str):
        lm_loss(model, batch, precision, device).backward()
        model.zero_grad(set_to_none=True)

    evidence: dict = {}
    precision, steps, evals, per_step = c.precision, c.steps, None, None
    if precision == "auto":
        precision, evidence = choose_precision(fwd_bwd, device)
        log(f"precision: {evidence['summary']} -> {precision}")
    if deadline is not None:  # a first plan from one probe; the loop re-plans from measured steps
        step_time = evidence.get("median_s", {}).get(precision) or time_once(fwd_bwd, precision)
        step_time = step_time * c.accum * 1.15  # optimizer step and bookkeeping
        evals = step_time * c.eval_batches / 3  # forward only, every eval_every steps
        per_step = step_time + evals / c.eval_every
        steps = max(1, int(deadline.left() / per_step))
        log(f"time budget {c.time_budget:.0f} s ({deadline.left():.0f} s left) at ~{step_time:.3f} s/step (probe) -> "
            f"{steps} steps planned; re-planned from the measured step times as it runs")
    torch.set_rng_state(rng)
    return dist.from_rank0((precision, steps, evidence, evals, per_step), ctx)  # rank 0 decides for every rank

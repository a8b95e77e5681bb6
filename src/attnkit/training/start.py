"""The start of a run, before its first step: the checkpoint it starts from (a resume or a fine-tuning start) and
the settings that follow from it, the data, the model and its optimizer, the state a resume restores.

Functions of the :class:`attnkit.training.loop.Trainer` being built (they set its attributes), in the order
:meth:`~attnkit.training.loop.Trainer._setup` calls them. Nothing here writes to the run folder.

Shape legend: L seq_len.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from attnkit import distributed as cp
from attnkit.errors import AttnkitValueError
from attnkit.models.builders import PRESETS, lm_config
from attnkit.models.config import LMConfig
from attnkit.models.lm import TransformerLM
from attnkit.runs import write as ckpt
from attnkit.runs.folder import RunFolder
from attnkit.runs.read import run_folder_of, set_aside_note
from attnkit.training import dist, record
from attnkit.training.config import TrainConfig, init_config, resumed_config
from attnkit.training.data import PackedDataset, data_fingerprint, load_documents, split_by_file
from attnkit.training.steps import param_groups


def open_start(trainer, config: TrainConfig, resume, init_from, given):
    """The checkpoint a run starts from, verified, and the settings that follow from it:
    ``(config, model_config or None, resume checkpoint, init checkpoint)``."""
    n = trainer.names
    trainer.resume_state, trainer.init_state = None, None
    if resume is not None:
        if trainer.ctx.is_main and set_aside_note(resume):  # a stopped --overwrite: the lock puts the old run back
            trainer.folder = RunFolder(resume, log=trainer.log).acquire()
        dist.barrier(trainer.ctx)
        where = ckpt.resolve(resume)
        run_dir = run_folder_of(where, resume, fix=f"resume the run folder it belongs to, or start a new run from "
                                                   f"its weights with {n('init_from')} {resume} {n('run_dir')} NEW.")
        if trainer.ctx.is_main and trainer.folder is None:  # lock first: a run training there must not change the files
            trainer.folder = RunFolder(run_dir, log=trainer.log).acquire()
        trainer.resume_state = ckpt.read_state(where)  # its run identity checked against the folder
        if "train_config" not in trainer.resume_state:
            raise ckpt.CheckpointError(
                f"{n('resume')} {str(resume)!r}: {where} was not written by the trainer (a converted model has no "
                f"training state to continue); start a new run from its weights with {n('init_from')} {resume}.")
        config, notes = resumed_config(config, trainer.resume_state, given, run_dir, n)
        for note in notes:
            trainer.log(note)
        return config, LMConfig.from_dict(trainer.resume_state["model_config"]), where, None  # never rebuilt
    if init_from is not None:
        where = ckpt.resolve(init_from)
        trainer.init_state = ckpt.read_state(where)
        model_config = LMConfig.from_dict(trainer.init_state["model_config"])
        config, notes = init_config(config, trainer.init_state, given, where, model_config, n)
        for note in notes:
            trainer.log(note)
        return config, model_config, None, where
    return config, None, None, None  # the model from the preset, once the data's row length is known


def build_model(trainer, model_config: LMConfig | None, where: Path | None) -> None:
    """The model (from the checkpoint's config, else the preset's), the optimizer, gradient checkpointing
    and context-parallel accounting; an ``init_from`` checkpoint's weights loaded."""
    config = trainer.config
    if model_config is None:
        model_config = lm_config(config.preset, **{"vocab_size": trainer.tokenizer.vocab_size,
                                                   "max_seq_len": max(trainer.seq_len, PRESETS[config.preset]
                                                                      ["max_seq_len"]), **config.model})
    elif trainer.seq_len > model_config.max_seq_len:
        raise AttnkitValueError(f"seq_len={trainer.seq_len} exceeds max_seq_len={model_config.max_seq_len} of "
                                f"the checkpoint {where}; pass {trainer.names('seq_len')} {model_config.max_seq_len} "
                                "or less.")
    trainer.model_config = model_config
    trainer.model = TransformerLM(trainer.model_config).to(trainer.device)
    if trainer.init_state is not None:
        ckpt.load_weights(where, trainer.model)
        trainer.log(f"initialised from {where} (step {trainer.init_state['step']}, run "
                 f"{trainer.init_state.get('run_id')}): a new run with its weights and a fresh optimizer")
    trainer.model.gradient_checkpointing = config.grad_checkpointing
    if trainer.groups.cp > 1:
        cp.check_model(trainer.model)
        trainer.cp_counting = contextlib.ExitStack()  # this rank's context-parallel bytes, per step in metrics
        trainer.cp_sent = trainer.cp_counting.enter_context(cp.count_messages())
    trainer.optimizer = torch.optim.AdamW(param_groups(trainer.model, config.weight_decay), lr=config.lr,
                                          betas=config.betas, fused=False, foreach=True)


def check_preset_length(trainer) -> None:
    """A new run's rows fit the preset's positions when they are learned (a table of ``max_seq_len`` rows);
    longer rows with computed positions are said (the model is built for them; each step costs more)."""
    preset_len = PRESETS[trainer.config.preset]["max_seq_len"]
    positions = trainer.config.model.get("positions", PRESETS[trainer.config.preset].get("positions", "rope"))
    if (trainer.config.seq_len or 0) > preset_len and positions != "learned":
        trainer.log(f"note: {trainer.names('seq_len')} {trainer.config.seq_len} is {trainer.config.seq_len / preset_len:.3g}x "
                    f"the {trainer.config.preset!r} preset's {preset_len} positions: the model is built for rows of "
                    f"{trainer.config.seq_len} ({positions} positions), and attention's cost per row grows with the "
                    "square of its length")
    if positions == "learned" and (trainer.config.seq_len or 0) > preset_len:
        raise AttnkitValueError(
            f"{trainer.names('seq_len')} {trainer.config.seq_len} is longer than the {preset_len} learned positions of the "
            f"{trainer.config.preset!r} preset; pass {trainer.names('seq_len')} {preset_len} or less, or positions "
            f"that are computed ({trainer.names('positions')} rope or alibi) for longer rows.")


def restore(trainer, where: Path, given) -> None:
    """Continue from checkpoint ``where``: weights, optimizer, RNG, step, precision and schedule."""
    state, _ = ckpt.load_checkpoint(where, trainer.model, trainer.optimizer, rank=trainer.ctx.rank)
    trainer.step, trainer.precision = state["step"], state["precision"]
    trainer.precision_evidence = state.get("precision_evidence", {})
    trainer.run_id = state.get("run_id") or ckpt.run_identity(trainer.run_dir) or record.new_run_id()
    trainer.schedule_steps = state.get("schedule_steps", state["total_steps"])
    trainer.total_steps = max(trainer.config.steps, trainer.step) if "steps" in given else state["total_steps"]
    report_resume(trainer, where, state)


def report_resume(trainer, where: Path, state: dict) -> None:
    """Say what a resume continues: its step, a schedule whose step count changed, data that changed."""
    trainer.log(f"resumed {where} at step {trainer.step}/{trainer.total_steps} ({trainer.precision}, chosen when the run "
             "started)")
    if trainer.total_steps != state["total_steps"]:
        trainer.log(f"schedule: {state['total_steps']} -> {trainer.total_steps} steps; the learning rate keeps its warmup + "
                    f"cosine to step {trainer.schedule_steps}, then holds its minimum "
                    f"{trainer.config.lr * trainer.config.min_lr_ratio:.3g} to step {trainer.total_steps}"
                    if trainer.total_steps > trainer.schedule_steps else
                    f"schedule: stopping at step {trainer.total_steps}, before the cosine's end at step "
                    f"{trainer.schedule_steps}")
    elif trainer.step >= trainer.total_steps:
        trainer.log(f"the run already finished at step {trainer.step}; pass {trainer.names('steps')} N (N > {trainer.step}) "
                    "to extend it")
    recorded = state.get("data_sha256")
    if recorded is not None and recorded != trainer.data_sha256:
        trainer.log(f"WARNING: the training data changed since this checkpoint (sha256 {recorded[:12]}... -> "
                 f"{trainer.data_sha256[:12]}...): the resumed run continues on different data, so it is no longer "
                 "the run it was")


def build_data(trainer) -> None:
    """The documents loaded and fingerprinted, split by file into train / validation, packed into rows of L."""
    c = trainer.config
    trainer.seq_len = c.seq_len or PRESETS[c.preset]["max_seq_len"]
    docs = load_documents(c.data)
    trainer.data_sha256 = data_fingerprint(docs)
    train_docs, val_docs = split_by_file(docs, c.val_fraction)
    trainer.train_data = PackedDataset(train_docs, trainer.seq_len, doc_mask=c.doc_mask)
    trainer.val_data = PackedDataset(val_docs, trainer.seq_len, doc_mask=c.doc_mask)
    if c.overfit:  # the tutorial's sanity check: the same few rows every step
        trainer.train_data.num_rows = min(trainer.train_data.num_rows, c.overfit_samples)
    trainer.log(f"data: {c.data or 'Python standard library sources'} - {len(train_docs)} train / "
                f"{len(val_docs)} val documents, {trainer.train_data.num_tokens:,} / {trainer.val_data.num_tokens:,} "
                f"tokens, rows of {trainer.seq_len}, document mask {'on' if c.doc_mask else 'off'}")

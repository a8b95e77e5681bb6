"""The trainer's state, declared: what a run is built from (:class:`Setup`) and where it stands (:class:`Progress`).

Both are frozen values. :mod:`attnkit.training.start` returns them (the start of a run, before its first step);
:class:`attnkit.training.loop.Trainer` holds one of each and replaces its :class:`Progress` after every step (the
only writer); :mod:`attnkit.training.record` and :mod:`attnkit.training.steps` read them. Nothing else assigns an
attribute of a Trainer (a test scans the sources for it).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from attnkit.distributed.comm import MessageLog
from attnkit.models.config import LMConfig
from attnkit.models.lm import TransformerLM
from attnkit.runs.tokens import ByteTokenizer
from attnkit.training.config import TrainConfig
from attnkit.training.data import PackedDataset


@dataclass(frozen=True)
class Data:
    """The documents of a run, fingerprinted and packed into rows of ``seq_len`` tokens (train / validation)."""

    seq_len: int
    data_sha256: str
    train_data: PackedDataset
    val_data: PackedDataset


@dataclass(frozen=True)
class Setup:
    """What a run is built from: its settings (``config``, as built: a time budget's step count lives in
    :class:`Progress`), the model's config, the data, the tokenizer, the model and its optimizer, the checkpoint
    state it resumes (``resume_state``) or starts from (``init_state``), and this rank's context-parallel message
    counter (``cp_sent``, kept open by ``cp_counting``; None without context parallelism)."""

    config: TrainConfig
    model_config: LMConfig
    data: Data
    tokenizer: ByteTokenizer
    model: TransformerLM
    optimizer: torch.optim.Optimizer
    resume_state: dict | None = None
    init_state: dict | None = None
    cp_counting: contextlib.ExitStack | None = None
    cp_sent: MessageLog | None = None

    @property
    def run_dir(self) -> Path:
        return Path(self.config.run_dir)


@dataclass(frozen=True)
class Progress:
    """Where a run stands, and what config.json and each checkpoint record about it beyond its settings: the run's
    identity, the optimizer steps done (``step``) of ``total_steps`` planned, the step at which the cosine schedule
    ends (``schedule_steps``), the precision and the evidence it was chosen on, and for a time budget the first plan
    (``budgeted``: the plan follows the clock, so the recorded ``steps`` setting is the plan)."""

    run_id: str
    step: int
    total_steps: int
    schedule_steps: int
    precision: str
    precision_evidence: dict
    first_plan: int | None = None
    budgeted: bool = False

    def advanced(self) -> Progress:
        """After one more optimizer step."""
        return replace(self, step=self.step + 1)

    def replanned(self, total_steps: int) -> Progress:
        """A time budget's new plan: the cosine schedule ends with the run."""
        return replace(self, total_steps=total_steps, schedule_steps=total_steps)

    def settings(self, config: TrainConfig) -> TrainConfig:
        """The settings as recorded: a time-budget run's ``steps`` is its current plan."""
        return replace(config, steps=self.total_steps) if self.budgeted and config.steps != self.total_steps else config

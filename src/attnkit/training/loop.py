"""The training loop behind ``attnkit train``: the tutorial's practice, built in.

AdamW with weight-decay groups (matrices decay; norms, biases and nothing else do not), linear warmup + cosine
decay, gradient clipping, gradient accumulation, bf16 autocast where it is faster on this machine (measured at
the start of a run), optional gradient checkpointing per block, validation loss and perplexity, a tqdm bar
(tokens/s, loss, ETA), ``metrics.jsonl``, ``loss.png``, checkpoints that resume bitwise on CPU after a
SIGKILL at any moment, and DistributedDataParallel under torchrun.

The parts: settings and the decisions of a resume or a fine-tuning start (:mod:`attnkit.training.config`),
the start of a run before its first step: its checkpoint, data, model and optimizer (:mod:`attnkit.training.start`),
one optimizer step (:mod:`attnkit.training.steps`), what a run records and checkpoints, and its stop on request
(:mod:`attnkit.training.record`), the time budget (:mod:`attnkit.training.deadline`); this module puts them
together in :class:`Trainer`: the precision and length of a new run, the step loop, the end of the run.

>>> from attnkit.training import TrainConfig, train
>>> result = train(TrainConfig(run_dir="runs/try", preset="tiny", steps=200))  # doctest: +SKIP

Shape legend: B rows per micro-batch (this rank), L seq_len, V vocab_size.
"""

from __future__ import annotations

import contextlib
import gc
import math
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel

from attnkit import _progress
from attnkit import distributed as cp
from attnkit.errors import AttnkitValueError
from attnkit.runs.folder import RunFolder
from attnkit.runs.read import LOSS_PLOT, METRICS
from attnkit.runs.tokens import ByteTokenizer
from attnkit.runs.write import checkpoint_dir
from attnkit.training import dist, record, start
from attnkit.training.config import TrainConfig, setting
from attnkit.training.data import unigram_loss
from attnkit.training.deadline import Deadline
from attnkit.training.interrupt import StopRequest, stop_requests
from attnkit.training.metrics import MetricsWriter, plot_loss
from attnkit.training.sampling import sample_text
from attnkit.training.schedule import lr_at
from attnkit.training.state import Progress, Setup
from attnkit.training.steps import evaluate, optimizer_step, progress_bar, verdict


@dataclass
class TrainResult:
    run_dir: Path
    step: int
    train_loss: float
    val_loss: float | None
    unigram_loss: float | None
    precision: str
    overfit_passed: bool | None = None
    samples: dict = field(default_factory=dict)


def _from(holder: str, name: str, doc: str = "") -> property:
    """A read-only attribute of the trainer that is a field of its ``setup`` or ``progress`` (the hook API)."""
    return property(lambda self: getattr(getattr(self, holder), name), doc=doc or f"``{holder}.{name}``")


def _quiet(*args, **kwargs) -> None:
    pass


def _text(path: str | Path | None) -> str | None:
    return None if path is None else str(path)


class Trainer:
    """One run: data, model, optimizer, schedule and outputs; :meth:`run` trains to the last step.

    Everything is checked before the run folder is touched (settings, device, data, model, the checkpoint to
    resume or start from); then rank 0 takes the folder's lock (:class:`attnkit.runs.folder.RunFolder`).

    ``resume``: continue a run from its newest checkpoint (or one checkpoint folder). The run keeps its own
    settings; of ``config`` only :data:`attnkit.training.config.RESUME_HONOURS` are used when named in ``given`` (the settings the
    user set explicitly), the rest of ``given`` is reported as ignored. ``steps`` beyond the original end
    extends the run: the schedule keeps its warmup + cosine to the original end, then holds the minimum rate.
    ``init_from``: start a new run from a checkpoint's weights (fine-tuning): its model, fresh optimizer, step 0.
    ``names(field)``: how messages name a setting (the field itself; the CLI passes its flags).

    The state is two declared values (:mod:`attnkit.training.state`): :attr:`setup`, what the run is built from,
    and :attr:`progress`, where it stands (replaced after every step, here only). Hooks read both through the
    properties below (``trainer.model``, ``trainer.step``, ...).
    """

    def __init__(self, config: TrainConfig, *, resume: str | Path | None = None, init_from: str | Path | None = None,
                 given: set[str] | frozenset[str] = frozenset(), log=print, names=setting, clock=time.monotonic,
                 spent_s: float = 0.0):
        self.names, self._log = names, log
        self.ctx: dist.DistContext | None = None
        self.groups: cp.Groups | None = None
        self.setup: Setup | None = None
        self.progress: Progress | None = None
        self.ddp: DistributedDataParallel | None = None
        self.folder: RunFolder | None = None  # rank 0's lock on the run folder
        self.metrics: MetricsWriter | None = None  # rank 0's metrics.jsonl, open while the run trains
        self._failed = False
        # a time budget counts from here (data loading and the probe included) plus the caller's ``spent_s``;
        # only a new run re-plans
        self.deadline = (Deadline(config.time_budget, clock, spent_s=spent_s) if config.time_budget is not None and resume is None
                         else None)
        self.closing_s = {"eval": 0.0, "save": 0.0, "sample": 0.0}  # measured costs of what ends a run
        self.stop_request = StopRequest()  # replaced by the one run() installs for SIGINT/SIGTERM
        self.hooks: list = []  # hook(trainer, record) after each step (main process), see train()
        try:
            self._setup(config, resume, init_from, frozenset(given))
        except BaseException as exc:  # a refusal after the lock was taken must not keep the folder locked
            self._failed = True
            self.close()
            peer = dist.lost(exc, self.ctx) if self.ctx is not None else None
            if peer is not None:  # a failed collective: another rank stopped (its own output says why)
                raise peer from exc
            raise

    # the hook API: the run's values by name
    config = property(lambda self: self.progress.settings(self.setup.config) if self.progress else self.setup.config,
                      doc="The run's settings (a time budget's ``steps``: its current plan).")
    model_config = _from("setup", "model_config")
    model = _from("setup", "model")
    optimizer = _from("setup", "optimizer")
    tokenizer = property(lambda self: self.setup.tokenizer, doc="The byte tokenizer.")
    resume_state = _from("setup", "resume_state")
    init_state = _from("setup", "init_state")
    run_dir = _from("setup", "run_dir")
    seq_len = property(lambda self: self.setup.data.seq_len, doc="Tokens per row.")
    train_data = property(lambda self: self.setup.data.train_data, doc="The packed training rows.")
    val_data = property(lambda self: self.setup.data.val_data, doc="The packed validation rows.")
    data_sha256 = property(lambda self: self.setup.data.data_sha256, doc="The training data's fingerprint.")
    run_id = _from("progress", "run_id")
    step = _from("progress", "step", "Optimizer steps done.")
    total_steps = _from("progress", "total_steps", "Optimizer steps planned.")
    schedule_steps = _from("progress", "schedule_steps", "The step at which the cosine schedule ends.")
    precision = _from("progress", "precision")
    precision_evidence = _from("progress", "precision_evidence")
    first_plan = _from("progress", "first_plan", "A time budget's first plan (steps), else None.")
    device = property(lambda self: self.ctx.device, doc="This rank's device.")
    log = property(lambda self: self._log if self.ctx is None or self.ctx.is_main else _quiet,
                   doc="The run's log (silent on ranks other than 0).")

    # ------------------------------------------------------------------------------------------ set-up
    def _setup(self, config: TrainConfig, resume, init_from, given: frozenset[str]) -> None:
        n = self.names
        if resume is not None and init_from is not None:
            raise AttnkitValueError(f"resume and init_from exclude each other: {n('resume')} continues a run (same "
                                    f"settings, its optimizer), {n('init_from')} starts a new run from a checkpoint's "
                                    "weights.")
        self.ctx = dist.init(config.device)  # a missing device is a typed error before anything is written
        agreed = dist.agreed(self.ctx, n)
        agreed({**asdict(config), "resume": _text(resume), "init_from": _text(init_from)})  # before any collective
        opening = start.open_start(self.ctx, config, resume, init_from, given, self.log, n)
        self.folder = opening.folder
        config = opening.config
        if config.overfit:  # every step sees all the samples
            config = replace(config, batch_size=config.overfit_samples)
        dist.check_batch(config.batch_size, replace(self.ctx, world=cp.data_parallel(self.ctx.world,
                                                                                      config.context_parallel)))
        run_dir = Path(config.run_dir)
        if resume is None:  # `--run-dir nano` would be shadowed by the preset nano in every later command
            from attnkit.runs.source import check_folder_name

            check_folder_name(config.run_dir, n("run_dir"))
        if resume is None and self.ctx.is_main and run_dir.is_dir():  # refuse early, before loading data
            RunFolder(run_dir, log=self.log).check_fresh(config.overwrite)
        if opening.model_config is None:  # a new run's model: from the preset
            start.check_preset_length(config, self.log, n)
        data = start.load_data(config, self.log)
        agreed({**asdict(config), "data_sha256": data.data_sha256, "resumed": start.digest(opening.resume_state),
                "started_from": start.digest(opening.init_state)})  # the same run on every rank, before any write
        self.groups = cp.groups(self.ctx.rank, self.ctx.world, config.context_parallel, timeout=dist.timeout_s())
        torch.manual_seed(config.seed)
        self.setup = start.build_setup(config, opening, data, ByteTokenizer(), self.groups, self.ctx.device,
                                       self.log, n)
        self.progress = (start.restored(self.setup, opening.resume_from, given, self.ctx.rank, self.log, n)
                         if opening.resume_from is not None else self._begin())
        self._note_warmup()
        self.ddp = DistributedDataParallel(self.model) if self.ctx.enabled else None

    def _note_warmup(self) -> None:
        c, end = self.config, self.schedule_steps
        if c.warmup >= end and not c.overfit:
            peak = lr_at(end, lr=c.lr, warmup=c.warmup, total=end)
            self.log(f"note: warmup ({c.warmup} steps) is not shorter than the run ({end} steps): the learning rate "
                     f"rises to {peak:.3g} at the last step and never decays; pass a smaller {self.names('warmup')} "
                     "for a warmup + cosine schedule")

    def _begin(self) -> Progress:
        """A new run: its identity, precision and length decided; only now is the run folder touched."""
        precision, total_steps, evidence, evals_s, step_s = start.plan(self.setup, self.groups, self.ctx,
                                                                       self.deadline, self.log)
        if self.deadline is not None:
            self.closing_s["eval"] = evals_s
            self.deadline.planned(step_s)
            note = self.deadline.busy_note(self.names("time_budget"))
            if note:
                self.log(note)
        progress = Progress(record.new_run_id(), 0, total_steps, total_steps, precision, evidence,
                            first_plan=total_steps, budgeted=self.deadline is not None)
        if self.ctx.is_main:
            self.folder = RunFolder(self.setup.run_dir, log=self.log).acquire()
            self.folder.check_fresh(self.setup.config.overwrite)
            if self.setup.config.overwrite:
                self.folder.set_aside()
        dist.barrier(self.ctx)
        return progress

    # ------------------------------------------------------------------------------------------ run
    def run(self) -> TrainResult:
        """Train to the last step; the process group and the run folder are released on every exit path."""
        try:
            with stop_requests() as self.stop_request:  # SIGINT/SIGTERM: checkpoint after the current step, then stop
                return self._run()
        except BaseException as exc:
            self._failed = True
            peer = dist.lost(exc, self.ctx)
            if peer is not None:  # a failed collective: another rank stopped (its own output says why)
                raise peer from exc
            raise
        finally:
            self.close()

    def close(self) -> None:
        """Drop the DistributedDataParallel wrapper, destroy the process group, release the run folder.

        DDP's reducer holds the gloo/nccl group; DDP objects sit in reference cycles, so without an explicit
        collection the group outlives ``destroy_process_group`` until interpreter shutdown, where tearing down
        gloo's worker threads aborts the process ("terminate called without an active exception", SIGABRT)
        in a timing-dependent share of runs.
        """
        if self.ddp is not None:
            self.ddp = None
            gc.collect()
        if self.ctx is not None:
            dist.shutdown(self.ctx)
        if self.folder is not None:
            if self._failed:
                self.folder.abandon()  # an --overwrite run that failed before its first checkpoint: old run back
            self.folder.release()
            self.folder = None

    def _run(self) -> TrainResult:
        c, data = self.config, self.setup.data
        eval_batches = list(data.val_data.eval_batches(c.batch_size, c.eval_batches))
        if c.overfit:
            eval_batches = [data.train_data.rows(torch.arange(data.train_data.num_rows))]
        baseline = unigram_loss(data.train_data, eval_batches, self.setup.tokenizer.vocab_size)
        self.metrics = record.open_outputs(self.setup, self.progress, self.ctx, baseline, self.log, self.deadline)
        samples = {}
        if c.samples and self.ctx.is_main and self.resume_state is None:
            with self._timed("sample"):  # the closing sample costs as much: a time budget keeps it back
                samples["before"] = sample_text(self.model, c.sample_prompt, max_new_tokens=c.sample_tokens)
            self.log(f"--- sample before training ---\n{samples['before']}\n---")
        loss_value, val_loss = self._train_steps(eval_batches)
        if self.metrics is not None:
            self.metrics.close()
            plot_loss(self.run_dir / METRICS, self.run_dir / LOSS_PLOT, baseline)
        passed = None
        if c.overfit:
            passed = loss_value < 0.05
            self.log(f"overfit check on {data.train_data.num_rows} samples: final loss {loss_value:.4f} -> "
                     f"{'PASS' if passed else 'FAIL'} (needs < 0.05)")
        if val_loss is not None and not c.overfit:
            self.log(verdict(val_loss, baseline))
        if c.samples and self.ctx.is_main:
            samples["after"] = sample_text(self.model, c.sample_prompt, max_new_tokens=c.sample_tokens)
            self.log(f"--- sample after training ---\n{samples['after']}\n---")
        self.log(f"run folder: {self.run_dir} (checkpoints/, metrics.jsonl, loss.png, config.json)")
        return TrainResult(self.run_dir, self.step, loss_value, val_loss, baseline, self.precision, passed, samples)

    def tokens_per_step(self) -> int:
        return record.tokens_per_step(self.setup)

    def _train_steps(self, eval_batches) -> tuple[float, float | None]:
        """The step loop: optimizer steps to ``total_steps``, with metrics, hooks, validation and checkpoints;
        returns the last ``(train loss, validation loss)``."""
        c = self.config
        bar = progress_bar(c.progress and self.ctx.is_main, self.total_steps, self.step,
                           "overfit check" if c.overfit else "train")
        self.model.train()  # (the loop reads self.ddp each time: no local may keep DDP alive, see close())
        loss_value, val_loss, began, tokens_done = float("nan"), None, time.perf_counter(), 0
        every = record.checkpoint_interval(c.ckpt_every, self.total_steps)
        if self.step == 0 and c.ckpt_every is None:
            self.log(f"checkpoints every {every} steps ({self.names('ckpt_every')} changes it) and on Ctrl-C/SIGTERM")
        if self.deadline is not None:
            self.deadline.start_loop(self.step)
        while self.step < self.total_steps:
            loss_value, grad_norm, lr = optimizer_step(self.setup, self.progress, ddp=self.ddp, groups=self.groups,
                                                       ctx=self.ctx, names=self.names)
            self.progress = self.progress.advanced()
            if self.deadline is not None:
                self._replan(bar)
            tokens_done += self.tokens_per_step()
            entry = {"step": self.step, "loss": loss_value, "lr": lr, "grad_norm": grad_norm,
                     "tokens": self.step * self.tokens_per_step(), "tok_per_s": tokens_done / (time.perf_counter() - began)}
            val_loss = self._record_step(entry, eval_batches, val_loss)
            if bar is not None:
                bar.set_postfix(loss=f"{loss_value:.3f}", tok_s=f"{entry['tok_per_s']:,.0f}",
                                **({"val": f"{val_loss:.3f}"} if val_loss is not None else {}))
                bar.update(1)
            saved = self.step % every == 0 or self.step == self.total_steps
            if saved:
                with self._timed("save"):
                    self.save()
                with _progress.clear_of(bar):  # a line of its own, never inside the progress bar
                    self.log(f"checkpoint {checkpoint_dir(self.run_dir, self.step)} written (step "
                             f"{self.step}/{self.total_steps}, loss {loss_value:.3f})")
            if dist.any_rank(self.stop_request.signum is not None, self.ctx):  # every rank stops after the same step
                if bar is not None:
                    bar.close()
                self._interrupted(saved)
        if bar is not None:
            bar.close()
        if self.deadline is not None:
            self._report_budget()
        return loss_value, val_loss

    def _interrupted(self, saved: bool) -> None:
        """A stop was requested (on some rank): checkpoint this step unless it just was, and raise."""
        if not saved:
            self.save()
        if self.metrics is not None:
            self.metrics.close()
        raise record.interrupted(self.setup, self.progress, self.ctx, self.stop_request, self.names)

    def _record_step(self, entry: dict, eval_batches, val_loss: float | None) -> float | None:
        """Complete this step's metrics ``entry`` (context-parallel bytes, validation when due), run the hooks and
        write it; returns the newest validation loss."""
        if self.groups.cp > 1:
            entry["cp_bytes_sent"] = self.setup.cp_sent.nbytes()  # rank 0's context-parallel messages
            self.setup.cp_sent.sent.clear()
        if self.step % self.config.eval_every == 0 or self.step == self.total_steps:
            with self._timed("eval"):
                val_loss = evaluate(self.model, eval_batches, self.precision, self.device)
            entry.update(val_loss=val_loss, val_ppl=math.exp(min(val_loss, 50.0)))
        if self.metrics is not None:
            for hook in self.hooks:
                hook(self, entry)
            self.metrics.write(entry)
        return val_loss

    def _report_budget(self) -> None:
        """A time-budget run's end: the steps planned and run, said and written to config.json."""
        budget = self.deadline.summary(self.first_plan, self.step)
        self.log(f"time budget {budget['seconds']:.0f} s: ran {self.step} steps, {budget['elapsed_s']:.0f} s so far "
                 f"(first plan {budget['first_plan']} steps from the probe, re-planned {budget['replans']} times "
                 "from the measured step times)")
        note = self.deadline.short_note(self.step, self.first_plan)
        if note:
            self.log(note)
        if self.ctx.is_main:
            record.write_config(self.setup, self.progress, self.ctx.world, self.deadline)  # the plan as it ended

    @contextlib.contextmanager
    def _timed(self, what: str):
        """Measure ``what`` (eval, save, sample) on the deadline's clock: a time budget keeps its cost back."""
        if self.deadline is None:
            yield
            return
        begin = self.deadline.clock()
        yield
        self.closing_s[what] = self.deadline.clock() - begin

    def _replan(self, bar) -> None:
        """The time budget's step count after this step, decided on rank 0 and agreed by every rank; the cosine
        schedule's end moves with it."""
        planned = self.deadline.replan(self.step, self.total_steps, sum(self.closing_s.values()))
        planned = dist.from_rank0(planned, self.ctx)
        if planned != self.total_steps:
            self.progress = self.progress.replanned(planned)
            if bar is not None:
                bar.total = planned
                bar.refresh()

    def save(self) -> None:
        """Checkpoint the current step (see :func:`attnkit.training.record.save`)."""
        record.save(self.setup, self.progress, self.ctx, metrics=self.metrics, folder=self.folder,
                    deadline=self.deadline)


def train(config: TrainConfig, *, resume: str | Path | None = None, init_from: str | Path | None = None,
          given: set[str] | frozenset[str] = frozenset(), log=print, hooks=(), names=setting,
          clock=time.monotonic, spent_s: float = 0.0) -> TrainResult:
    """Train, resume or fine-tune a run; see :class:`TrainConfig` and :class:`Trainer`. ``hooks``: callables
    ``hook(trainer, record)`` run on the main process after every step, before ``record`` (a dict with ``step``)
    is written to metrics.jsonl (e.g. ``attnkit.diagnostics.monitor.monitor_hook``, which adds the attention
    verdicts). ``names(field)``: how messages name a setting (the CLI passes its flags). ``clock()``: the seconds a
    ``time_budget`` is measured in (injected by tests); ``spent_s``: seconds of it already spent before this call
    (the CLI passes its process's start-up)."""
    trainer = Trainer(config, resume=resume, init_from=init_from, given=given, log=log, names=names, clock=clock,
                      spent_s=spent_s)
    trainer.hooks = list(hooks)
    return trainer.run()

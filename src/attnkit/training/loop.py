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

from attnkit import distributed as cp
from attnkit.errors import AttnkitValueError
from attnkit.runs.folder import RunFolder
from attnkit.runs.read import LOSS_PLOT, METRICS, load_model  # noqa: F401  (load_model: re-exported)
from attnkit.training import dist, record, start
from attnkit.training.config import RESUME_HONOURS, TrainConfig, setting  # noqa: F401  (RESUME_HONOURS: re-exported)
from attnkit.training.data import ByteTokenizer, unigram_loss
from attnkit.training.deadline import Deadline
from attnkit.training.interrupt import StopRequest, stop_requests
from attnkit.training.metrics import plot_loss
from attnkit.training.precision import choose_precision
from attnkit.training.sampling import sample_text
from attnkit.training.schedule import lr_at
from attnkit.training.steps import (  # noqa: F401  (param_groups, lm_loss, evaluate, verdict: re-exported)
    evaluate,
    lm_loss,
    optimizer_step,
    param_groups,
    progress_bar,
    time_once,
    verdict,
)


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


class Trainer:
    """One run: data, model, optimizer, schedule and outputs; :meth:`run` trains to the last step.

    Everything is checked before the run folder is touched (settings, device, data, model, the checkpoint to
    resume or start from); then rank 0 takes the folder's lock (:class:`attnkit.runs.folder.RunFolder`).

    ``resume``: continue a run from its newest checkpoint (or one checkpoint folder). The run keeps its own
    settings; of ``config`` only :data:`RESUME_HONOURS` are used when named in ``given`` (the settings the
    user set explicitly), the rest of ``given`` is reported as ignored. ``steps`` beyond the original end
    extends the run: the schedule keeps its warmup + cosine to the original end, then holds the minimum rate.
    ``init_from``: start a new run from a checkpoint's weights (fine-tuning): its model, fresh optimizer, step 0.
    ``names(field)``: how messages name a setting (the field itself; the CLI passes its flags).
    """

    def __init__(self, config: TrainConfig, *, resume: str | Path | None = None, init_from: str | Path | None = None,
                 given: set[str] | frozenset[str] = frozenset(), log=print, names=setting, clock=time.monotonic,
                 spent_s: float = 0.0):
        self.ddp, self.folder, self._failed, self.ctx = None, None, False, None
        # a time budget counts from here (data loading and the probe included) plus the caller's ``spent_s``;
        # only a new run re-plans
        self.deadline = (Deadline(config.time_budget, clock, spent_s=spent_s) if config.time_budget is not None and resume is None
                         else None)
        self.closing_s = {"eval": 0.0, "save": 0.0, "sample": 0.0}  # measured costs of what ends a run
        self.stop_request = StopRequest()  # replaced by the one run() installs for SIGINT/SIGTERM
        self.hooks: list = []  # hook(trainer, record) after each step (main process), see train()
        self.names = names
        try:
            self._setup(config, resume, init_from, frozenset(given), log)
        except BaseException as exc:  # a refusal after the lock was taken must not keep the folder locked
            self._failed = True
            self.close()
            peer = dist.lost(exc, self.ctx) if self.ctx is not None else None
            if peer is not None:  # a failed collective: another rank stopped (its own output says why)
                raise peer from exc
            raise

    # ------------------------------------------------------------------------------------------ set-up
    def _setup(self, config: TrainConfig, resume, init_from, given: frozenset[str], log) -> None:
        n = self.names
        if resume is not None and init_from is not None:
            raise AttnkitValueError(f"resume and init_from exclude each other: {n('resume')} continues a run (same "
                                    f"settings, its optimizer), {n('init_from')} starts a new run from a checkpoint's "
                                    "weights.")
        self.ctx = dist.init(config.device)  # a missing device is a typed error before anything is written
        self.log = log if self.ctx.is_main else (lambda *a, **k: None)
        config, model_config, resume_ckpt, init_ckpt = start.open_start(self, config, resume, init_from, given)
        if config.overfit:  # every step sees all the samples
            config = replace(config, batch_size=config.overfit_samples)
        self.config, self.device = config, self.ctx.device
        self.groups = cp.groups(self.ctx.rank, self.ctx.world, config.context_parallel)
        dist.check_batch(config.batch_size, replace(self.ctx, world=self.groups.dp))
        self.run_dir = Path(config.run_dir)
        if resume is None:  # `--run-dir nano` would be shadowed by the preset nano in every later command
            from attnkit.runs.source import check_folder_name

            check_folder_name(config.run_dir, n("run_dir"))
        if resume is None and self.ctx.is_main and self.run_dir.is_dir():  # refuse early, before loading data
            RunFolder(self.run_dir, log=self.log).check_fresh(config.overwrite)
        if model_config is None:  # a new run's model: from the preset
            start.check_preset_length(self)
        self.tokenizer = ByteTokenizer()
        start.build_data(self)
        dist.check_same({**asdict(config), "resume": None if resume is None else str(resume),
                         "init_from": None if init_from is None else str(init_from), "data_sha256": self.data_sha256},
                        self.ctx, n)  # before anything is written: every rank runs the same run
        torch.manual_seed(config.seed)
        start.build_model(self, model_config, resume_ckpt or init_ckpt)
        self.step = 0
        if resume_ckpt is not None:
            start.restore(self, resume_ckpt, given)
        else:
            self._begin()
            self.first_plan = self.total_steps
        if config.warmup >= self.schedule_steps and not config.overfit:
            peak = lr_at(self.schedule_steps, lr=config.lr, warmup=config.warmup, total=self.schedule_steps)
            self.log(f"note: warmup ({config.warmup} steps) is not shorter than the run ({self.schedule_steps} steps): "
                     f"the learning rate rises to {peak:.3g} at the last step and never decays; pass a smaller "
                     f"{n('warmup')} for a warmup + cosine schedule")
        self.ddp = DistributedDataParallel(self.model) if self.ctx.enabled else None

    def _begin(self) -> None:
        """A new run: its identity, precision and length decided; only now is the run folder touched."""
        self.run_id = record.new_run_id()
        self.precision, self.total_steps, self.precision_evidence = self._decide_precision_and_steps()
        self.schedule_steps = self.total_steps
        if self.deadline is not None:  # config.json states the plan, not an unused default step count
            self.config = replace(self.config, steps=self.total_steps)
        if self.ctx.is_main:
            self.folder = RunFolder(self.run_dir, log=self.log).acquire()
            self.folder.check_fresh(self.config.overwrite)
            if self.config.overwrite:
                self.folder.set_aside()
        dist.barrier(self.ctx)

    def _decide_precision_and_steps(self) -> tuple[str, int, dict]:
        c = self.config
        batch = self.train_data.batch(0, c.batch_size, seed=c.seed, rank=self.groups.dp_rank,
                                      world=self.groups.dp).to(self.device)
        rng = torch.get_rng_state()

        def fwd_bwd(precision: str):
            lm_loss(self.model, batch, precision, self.device).backward()
            self.model.zero_grad(set_to_none=True)

        evidence: dict = {}
        precision = c.precision
        if precision == "auto":
            precision, evidence = choose_precision(fwd_bwd, self.device)
            self.log(f"precision: {evidence['summary']} -> {precision}")
        steps = c.steps
        if self.deadline is not None:  # a first plan from one probe; the loop re-plans from measured steps
            step_time = evidence.get("median_s", {}).get(precision) or time_once(fwd_bwd, precision)
            step_time = step_time * c.accum * 1.15  # optimizer step and bookkeeping
            evals = step_time * c.eval_batches / 3  # forward only, every eval_every steps
            steps = max(1, int(self.deadline.left() / (step_time + evals / c.eval_every)))
            self.closing_s["eval"] = evals
            self.log(f"time budget {c.time_budget:.0f} s ({self.deadline.left():.0f} s left) at ~{step_time:.3f} "
                     f"s/step (probe) -> {steps} steps planned; re-planned from the measured step times as it runs")
        torch.set_rng_state(rng)
        return dist.from_rank0((precision, steps, evidence), self.ctx)  # rank 0 decides for every rank

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
        c = self.config
        eval_batches = list(self.val_data.eval_batches(c.batch_size, c.eval_batches))
        if c.overfit:
            eval_batches = [self.train_data.rows(torch.arange(self.train_data.num_rows))]
        baseline = unigram_loss(self.train_data, eval_batches, self.tokenizer.vocab_size)
        record.open_outputs(self, baseline)
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
            self.log(f"overfit check on {self.train_data.num_rows} samples: final loss {loss_value:.4f} -> "
                     f"{'PASS' if passed else 'FAIL'} (needs < 0.05)")
        if val_loss is not None and not c.overfit:
            self.log(verdict(val_loss, baseline))
        if c.samples and self.ctx.is_main:
            samples["after"] = sample_text(self.model, c.sample_prompt, max_new_tokens=c.sample_tokens)
            self.log(f"--- sample after training ---\n{samples['after']}\n---")
        self.log(f"run folder: {self.run_dir} (checkpoints/, metrics.jsonl, loss.png, config.json)")
        return TrainResult(self.run_dir, self.step, loss_value, val_loss, baseline, self.precision, passed, samples)

    def tokens_per_step(self) -> int:
        return self.config.batch_size * self.config.accum * self.seq_len

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
            loss_value, grad_norm, lr = optimizer_step(self, self.step + 1)
            self.step += 1
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
            if dist.any_rank(self.stop_request.signum is not None, self.ctx):  # every rank stops after the same step
                if bar is not None:
                    bar.close()
                record.interrupted(self, saved)
        if bar is not None:
            bar.close()
        if self.deadline is not None:
            self._report_budget()
        return loss_value, val_loss

    def _record_step(self, entry: dict, eval_batches, val_loss: float | None) -> float | None:
        """Complete this step's metrics ``entry`` (context-parallel bytes, validation when due), run the hooks and
        write it; returns the newest validation loss."""
        if self.groups.cp > 1:
            entry["cp_bytes_sent"] = self.cp_sent.nbytes()  # rank 0's context-parallel messages
            self.cp_sent.sent.clear()
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
        if self.ctx.is_main:
            record.write_config(self)  # the steps planned and run, as they ended

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
            self.total_steps = self.schedule_steps = planned
            self.config = replace(self.config, steps=planned)
            if bar is not None:
                bar.total = planned
                bar.refresh()

    def save(self) -> None:
        """Checkpoint the current step (see :func:`attnkit.training.record.save`)."""
        record.save(self)


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

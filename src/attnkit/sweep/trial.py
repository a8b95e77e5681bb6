"""One trial: its configuration, an ordinary training run in the sweep folder, and what the study learns from it.

A trial trains through the trainer's public entry point (:func:`attnkit.training.train`, what ``attnkit train``
calls), into ``SWEEP/trials/NNNN`` (NNNN = the trial's number): a run folder like any other, so ``attnkit report``,
``doctor``, ``generate`` and ``train --resume`` work on it. A hook reports each validation loss to the study; when
the pruner says stop, the trial ends after the next step (the evaluated step is then written and checkpointed, so a
pruned trial's folder is a run stopped at that evaluation). The trainer's log goes to ``SWEEP/logs/NNNN.log``.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import optuna
from optuna.trial import TrialState

from attnkit.errors import AttnkitValueError
from attnkit.runs import list_checkpoints
from attnkit.runs.folder import RunInUseError
from attnkit.sweep import space as spaces
from attnkit.sweep import storage as stores
from attnkit.sweep.study import Context, counts, set_plan
from attnkit.training import TrainConfig, TrainingDiverged, train
from attnkit.training.interrupt import TrainingInterrupted

TRIALS, LOGS = "trials", "logs"
#: infeasible draws in a row after which the space is refused (TPE learns to avoid them; this many means it can't)
MAX_INFEASIBLE = 50
#: draws in a row of configurations already trained after which the search ends (a small space is exhausted)
MAX_DUPLICATES = 20


class TakenOver(Exception):
    """This worker's trial was failed as stale by another worker (its heartbeat was late) and enqueued again: the
    retry continues it; this worker stops training it."""


class Reporter:
    """The trainer hook of one trial: every validation loss reported to the study; the pruner's stop raised at the
    next step. ``parent``: the pid this worker must outlive (a worker whose sweep died stops)."""

    def __init__(self, trial: optuna.trial.Trial, prune: bool, parent: int | None = None):
        self.trial, self.prune, self.parent = trial, prune, parent
        self.stop_at: int | None = None
        self.last_step = 0

    def __call__(self, _trainer, record: dict) -> None:
        if self.stop_at is not None:
            raise optuna.TrialPruned(f"pruned at step {self.stop_at}")
        if self.parent is not None and os.getppid() != self.parent:
            raise SystemExit("the sweep that started this worker is gone")
        self.last_step = record["step"]
        if "val_loss" in record:
            with stores.quiet_optuna():
                try:
                    self.trial.report(float(record["val_loss"]), record["step"])
                except optuna.exceptions.UpdateFinishedTrialError:
                    raise TakenOver(f"trial #{self.trial.number}") from None
                if self.prune and self.trial.should_prune():
                    self.stop_at = record["step"]


def trial_config(ctx: Context, values: dict, run_dir: Path, *, seed: int, steps: int | None = None,
                 eval_every: int | None = None) -> TrainConfig:
    """The trainer's settings of a run of ``values``: the plan's length (its time or its steps, or ``steps``), the
    plan's evaluation cadence (a checkpoint at every evaluation), the sweep's data and precision."""
    plan, c = ctx.plan, ctx.config
    every = eval_every or plan.eval_every
    steps = steps or plan.trial_steps
    return TrainConfig(run_dir=str(run_dir), preset=c.preset, model=spaces.model_overrides(values), data=c.data,
                       seq_len=c.seq_len, batch_size=c.batch_size, eval_batches=c.eval_batches,
                       precision=plan.precision, device=c.device, seed=seed, eval_every=every, ckpt_every=every,
                       keep=1, progress=False, steps=steps, time_budget=None if steps else plan.trial_seconds,
                       **spaces.train_overrides(values))


def log_to(path: Path):
    """A ``log`` for the trainer that appends its lines to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)

    def log(*parts, **_):
        with open(path, "a") as f:
            f.write(" ".join(str(p) for p in parts) + "\n")

    return log


def resumable(ctx: Context, attrs: dict) -> Path | None:
    """The run folder of an interrupted trial this retry continues: on this machine, in this sweep, with a
    checkpoint; else None (the retry trains afresh in its own folder)."""
    run_dir = attrs.get("run_dir")
    if not run_dir or attrs.get("host") != socket.gethostname() or not attrs.get("retry"):
        return None
    path = ctx.folder / run_dir
    return path if list_checkpoints(path) else None


def run_trial(ctx: Context, trial: optuna.trial.Trial) -> dict:
    """Train ``trial`` (claimed by this worker) and tell the study how it went; returns a summary for the progress
    line. An interrupted run (Ctrl-C, SIGTERM) is enqueued again before the interruption is raised on."""
    attrs = dict(trial.user_attrs)
    baseline = attrs.get("role") == "baseline"
    values = dict(ctx.baseline) if baseline else {**ctx.fixed(), **spaces.suggest(trial, ctx.config.space)}
    problem = spaces.build_problem(ctx.config.preset, values, ctx.config.seq_len)
    if problem is not None:
        return _infeasible(ctx, trial, values, problem)
    ctx.infeasible = 0
    same = None if baseline else duplicate_of(ctx, trial.number, values)
    if same is not None:
        return _duplicate(ctx, trial, values, same)
    ctx.duplicates = 0
    attrs["retry"] = "failed_trial" in stores.frozen(ctx.study, ctx.storage, trial.number).system_attrs
    resume = resumable(ctx, attrs)
    run_dir = resume or ctx.folder / TRIALS / f"{trial.number:04d}"
    for key, value in {"config": values, "run_dir": str(run_dir.relative_to(ctx.folder)), "host": socket.gethostname(),
                       "params": spaces.param_count(ctx.config.preset, values, ctx.config.seq_len),
                       "outcome": "running", "resumed": resume is not None}.items():
        trial.set_user_attr(key, value)
    reporter = Reporter(trial, ctx.config.prune and not baseline, parent=ctx.parent)
    start = time.monotonic()
    try:
        state, value, outcome = _train(ctx, trial, values, run_dir, resume, reporter)
        seconds = time.monotonic() - start
        trial.set_user_attr("steps", reporter.stop_at or reporter.last_step)
        trial.set_user_attr("seconds", round(seconds, 2))
        trial.set_user_attr("outcome", outcome)
        with stores.quiet_optuna():
            ctx.study.tell(trial, value if state == TrialState.COMPLETE else None, state=state)
    except (TakenOver, optuna.exceptions.UpdateFinishedTrialError):
        ctx.log(f"sweep: trial #{trial.number} was declared stale while it trained (its heartbeat came late) and "
                "enqueued again; its retry continues it from its checkpoint")
        return {"number": trial.number, "role": attrs.get("role"), "state": "TAKEN_OVER", "value": None,
                "outcome": "taken over by its retry", "seconds": time.monotonic() - start, "config": values}
    return {"number": trial.number, "role": attrs.get("role"), "state": state.name, "value": value,
            "outcome": outcome, "seconds": seconds, "config": values}


def _train(ctx: Context, trial, values: dict, run_dir: Path, resume: Path | None, reporter: Reporter):
    """``(state, value, outcome)`` of training ``values`` into ``run_dir`` (continuing ``resume``)."""
    config = trial_config(ctx, values, run_dir, seed=ctx.config.seed)
    log = log_to(ctx.folder / LOGS / f"{trial.number:04d}.log")
    try:
        try:
            result = train(config, resume=resume, hooks=[reporter], log=log)
        except RunInUseError:  # the interrupted run's folder is held by a process that still runs: train afresh
            run_dir = ctx.folder / TRIALS / f"{trial.number:04d}"
            trial.set_user_attr("run_dir", str(run_dir.relative_to(ctx.folder)))
            result = train(trial_config(ctx, values, run_dir, seed=ctx.config.seed), hooks=[reporter], log=log)
    except optuna.TrialPruned:
        return TrialState.PRUNED, None, f"pruned at step {reporter.stop_at}"
    except TakenOver:
        raise
    except TrainingDiverged as exc:
        log(str(exc))
        return TrialState.FAIL, None, f"diverged: {str(exc).split(';')[0]}"
    except TrainingInterrupted as exc:
        stores.requeue(ctx.study, ctx.storage, trial.number, f"stopped by a signal after step {exc.step}")
        raise
    if result.val_loss is None:
        return TrialState.FAIL, None, "diverged: no validation loss was measured"
    return TrialState.COMPLETE, float(result.val_loss), "complete"


def _skip(ctx: Context, trial, values: dict, outcome: str, kind: str) -> dict:
    """A draw that is not trained: marked with ``outcome``, told as pruned (TPE moves away from it); it does not
    count toward the plan, and the worker draws again."""
    trial.set_user_attr("config", values)
    trial.set_user_attr("outcome", outcome)
    with stores.quiet_optuna():
        ctx.study.tell(trial, state=TrialState.PRUNED)
    return {"number": trial.number, "role": "search", "state": kind, "value": None, "outcome": outcome,
            "seconds": 0.0, "config": values}


def _infeasible(ctx: Context, trial, values: dict, problem: str) -> dict:
    """A drawn combination no model can be built from (skipped); :data:`MAX_INFEASIBLE` in a row refuse the space."""
    ctx.infeasible += 1
    summary = _skip(ctx, trial, values, f"infeasible: {problem}", "INFEASIBLE")
    if ctx.infeasible >= MAX_INFEASIBLE:
        raise AttnkitValueError(f"space='{spaces.describe(ctx.config.space)}': {MAX_INFEASIBLE} draws in a row could "
                                f"not be built (e.g. {problem}); remove the values that do not fit together.")
    return summary


def duplicate_of(ctx: Context, number: int, values: dict) -> int | None:
    """The number of a counted searched trial (not ``number``) that trains exactly ``values``, or None."""
    for t in ctx.study.get_trials(deepcopy=False):
        if t.number != number and counts(t) and t.state != TrialState.WAITING and t.user_attrs.get("role") != \
                "baseline" and t.user_attrs.get("config") == values:
            return t.number
    return None


def _duplicate(ctx: Context, trial, values: dict, same: int) -> dict:
    """A draw of a configuration a trial already trains (skipped); after :data:`MAX_DUPLICATES` in a row the search
    has exhausted the space and ends."""
    ctx.duplicates += 1
    summary = _skip(ctx, trial, values, f"duplicate of #{same} (not trained again)", "DUPLICATE")
    if ctx.duplicates >= MAX_DUPLICATES:
        end_search(ctx, f"{MAX_DUPLICATES} draws in a row proposed configurations already trained")
    return summary


def end_search(ctx: Context, why: str) -> None:
    """Cut the plan to the trials that count now (a re-plan never extends it again)."""
    plan = ctx.plan
    now = sum(counts(t) for t in ctx.study.get_trials(deepcopy=False))
    plan.replans.append([now, plan.trials, now])
    plan.trials, plan.exhausted = now, why
    set_plan(ctx.study, plan)
    ctx.log(f"sweep: the search ends at {now} trials: {why}")

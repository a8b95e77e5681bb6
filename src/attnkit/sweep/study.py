"""The Optuna study of a sweep: what it records, which trials count, and how a worker takes its next trial.

The study's user attribute ``attnkit`` holds the sweep (its settings, the baseline, the plan), so a worker on
another machine needs only the storage URL and the study's name. Each trial's user attributes say what it is and
how it went: ``role`` (``baseline`` or ``search``), ``config`` (every knob's value), ``run_dir`` and ``host`` (its
run folder), ``owner`` (the sweep folder and process that ran it), ``steps``, ``seconds``, ``params`` and
``outcome`` (``complete``, ``pruned at step N``, ``infeasible: ...``, ``diverged: ...``, ``interrupted: ...``).

A trial **counts** toward the plan when it trained or is about to: complete, pruned by the pruner, diverged,
running or waiting. An interrupted trial (its worker killed, a Ctrl-C) is failed and enqueued again with its
parameters (the retry counts in its place; it resumes the interrupted run from its checkpoint where that run folder
is at hand); a combination the model cannot be built from is marked ``infeasible``, one a trial already trains
``duplicate of #N``, and both are drawn again.
"""

from __future__ import annotations

import itertools
import os
import socket
from dataclasses import dataclass
from pathlib import Path

import optuna
from optuna.trial import TrialState

from attnkit.sweep import storage as stores
from attnkit.sweep.config import Plan, SweepConfig

ATTR = "attnkit"
DONE = (TrialState.COMPLETE, TrialState.PRUNED)


def outcome(trial) -> str:
    return str(trial.user_attrs.get("outcome", ""))


#: outcomes of draws that never trained and are drawn again
SKIPPED = ("infeasible", "duplicate")


def counts(trial) -> bool:
    """Whether ``trial`` fills a place of the plan (see the module docstring)."""
    if outcome(trial).startswith(SKIPPED):
        return False
    if trial.state == TrialState.FAIL:
        return outcome(trial).startswith("diverged")
    return True


def finished(trial) -> bool:
    """A counted trial that will not run again."""
    return counts(trial) and (trial.state in DONE or trial.state == TrialState.FAIL)


def is_baseline(trial) -> bool:
    return trial.user_attrs.get("role") == "baseline"


@dataclass
class Context:
    """What a worker needs: the sweep folder on this machine, the settings, the study and its storage."""

    folder: Path
    config: SweepConfig
    study: optuna.Study
    storage: object
    sweep_id: str
    baseline: dict
    log: object = print
    owner: str = ""
    planner: object = None  # the creating process re-plans a time budget after each trial (budget.Planner)
    parent: int | None = None  # a worker process: the sweep that started it (it stops when that one is gone)
    infeasible: int = 0  # draws in a row that could not be built
    duplicates: int = 0  # draws in a row of a configuration already trained

    def __post_init__(self):
        self.owner = self.owner or f"{self.sweep_id}:{socket.gethostname()}:{os.getpid()}"

    @property
    def plan(self) -> Plan:
        return Plan.from_dict(self.study.user_attrs[ATTR]["plan"])

    def fixed(self) -> dict:
        """The knob values of every trial that the space does not search (the baseline's)."""
        return {n: v for n, v in self.baseline.items() if n not in self.config.space}


def sampler(config: SweepConfig, seed: int | None = None) -> optuna.samplers.BaseSampler:
    """TPE (random for the first third of the trials, at most 10), with the constant liar for parallel workers."""
    startup = max(2, min(10, (config.trials - 1) // 3))
    with stores.quiet_optuna():
        return optuna.samplers.TPESampler(n_startup_trials=startup, seed=seed, constant_liar=True)


def pruner(plan: Plan) -> optuna.pruners.BasePruner:
    """The median pruner on the validation curve: a trial whose loss at an evaluation is worse than the median of
    the finished trials' at the same step stops there; never before 2 finished trials, nor at a trial's first two
    evaluations."""
    return optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=2 * plan.eval_every)


def create_study(storage, name: str, config: SweepConfig, plan: Plan, record: dict) -> optuna.Study:
    """A new study ``name`` holding the sweep's ``record`` (its settings, baseline and plan), the grid enqueued."""
    with stores.quiet_optuna():
        study = optuna.create_study(storage=storage, study_name=name, direction="minimize", sampler=sampler(config),
                                    pruner=pruner(plan))
        study.set_user_attr(ATTR, record)
        study.enqueue_trial({}, user_attrs={"role": "baseline"})  # trial #0, the first one claimed
        if config.grid:
            enqueue_grid(study, config)
    return study


def load_study(storage, name: str) -> optuna.Study:
    """The study ``name`` with the sampler and pruner of the sweep it records; a typed error when it is not there
    or is not an attnkit sweep."""
    from attnkit.errors import AttnkitValueError

    with stores.quiet_optuna():
        try:
            study = optuna.load_study(study_name=name, storage=storage)
        except KeyError:
            names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
            raise AttnkitValueError(f"study={name!r} is not in storage={stores.masked(storage.url)!r} (it holds "
                                    f"{names[:5]}); pass the name the sweep printed when it started.") from None
    record = study.user_attrs.get(ATTR)
    if not isinstance(record, dict):
        raise AttnkitValueError(f"study={name!r} was not made by attnkit sweep (it has no {ATTR!r} record); pass "
                                "the study of an attnkit sweep.")
    study.sampler = sampler(SweepConfig.from_dict(record["config"]))
    study.pruner = pruner(Plan.from_dict(record["plan"]))
    return study


def enqueue_grid(study: optuna.Study, config: SweepConfig) -> None:
    """Every combination of the space's choices, enqueued once (``grid=True``)."""
    names = list(config.space)
    for combo in itertools.product(*(config.space[n].values for n in names)):
        study.enqueue_trial(dict(zip(names, combo)), user_attrs={"role": "search"})


def set_plan(study: optuna.Study, plan: Plan) -> None:
    study.set_user_attr(ATTR, {**study.user_attrs[ATTR], "plan": plan.to_dict()})


def next_trial(ctx: Context) -> optuna.trial.Trial | None:
    """Claim this worker's next trial under the study lock: the oldest waiting one (the baseline, enqueued as trial
    #0 with the study, then retries and grid points), else a new trial while fewer than the plan's trials count;
    None when the plan is full."""
    study, storage = ctx.study, ctx.storage
    with stores.study_lock(storage, study.study_name), stores.quiet_optuna():
        stores.fail_stale(study)
        trials = study.get_trials(deepcopy=False)
        if not any(is_baseline(t) and counts(t) for t in trials):
            return _new(study, storage, "baseline", ctx)
        waiting = stores.claim_waiting(study, storage)
        if waiting is not None:
            waiting.set_user_attr("owner", ctx.owner)
            return waiting
        if not ctx.config.grid and sum(counts(t) for t in trials) < ctx.plan.trials:
            return _new(study, storage, "search", ctx)
    return None


def _new(study, storage, role: str, ctx: Context) -> optuna.trial.Trial:
    tid = storage.create_new_trial(storage.get_study_id_from_name(study.study_name))
    storage.record_heartbeat(tid)
    trial = optuna.trial.Trial(study, tid)
    trial.set_user_attr("role", role)
    trial.set_user_attr("owner", ctx.owner)
    return trial


def all_done(ctx: Context) -> bool:
    """Every place of the plan is taken by a trial that will not run again."""
    trials = ctx.study.get_trials(deepcopy=False)
    baseline = any(is_baseline(t) and finished(t) for t in trials)
    return baseline and sum(finished(t) for t in trials) >= ctx.plan.trials and not any(
        t.state in (TrialState.RUNNING, TrialState.WAITING) for t in trials)


def own_running(ctx: Context) -> list:
    """Running trials of this sweep folder (their owner tag starts with its id)."""
    return [t for t in ctx.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            if str(t.user_attrs.get("owner", "")).startswith(ctx.sweep_id + ":")]


def requeue_dead(ctx: Context, trial) -> bool:
    """Enqueue again a running trial of this sweep folder whose process is gone: its run folder's lock is free (a
    worker that still trains holds it); False when it still runs or is no longer running."""
    from attnkit.runs.folder import RunFolder, RunInUseError

    run_dir = trial.user_attrs.get("run_dir")
    if run_dir and (ctx.folder / run_dir).is_dir():
        try:
            RunFolder(ctx.folder / run_dir, log=lambda *a, **k: None).acquire().release()
        except RunInUseError:
            return False
    return stores.requeue(ctx.study, ctx.storage, trial.number, "its process is gone (killed, crashed or stopped)")


def summary_of(trial) -> dict:
    """What the progress line says about a finished ``trial`` of the study."""
    state = outcome(trial).split(" ")[0].rstrip(":").upper() if outcome(trial).startswith(SKIPPED) else trial.state.name
    value = trial.value if trial.state == TrialState.COMPLETE else None
    return {"number": trial.number, "role": trial.user_attrs.get("role"), "state": state, "value": value,
            "outcome": outcome(trial), "seconds": trial.user_attrs.get("seconds", 0.0),
            "config": trial.user_attrs.get("config", {})}

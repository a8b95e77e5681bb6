"""A sweep from start to end: start one, resume one, or join one from another machine.

:func:`run_sweep` checks everything it can before it writes (the space, the baseline, the storage), takes the sweep
folder, plans (calibrating a time budget), creates the study, runs the workers, then the verdict and the summary.
:func:`resume_sweep` continues a sweep folder after a crash, a kill -9 or a Ctrl-C at any moment: the finished
trials are kept, a trial that was running is enqueued again (its retry resumes the run from its checkpoint), and the
plan it recorded is completed. :func:`join_sweep` adds this machine's workers to a study in a shared storage.
"""

from __future__ import annotations

import socket
import time
import uuid
from pathlib import Path

from optuna.trial import TrialState

from attnkit.errors import AttnkitValueError
from attnkit.sweep import space as spaces
from attnkit.sweep import storage as stores
from attnkit.sweep.budget import Planner, first_plan
from attnkit.sweep.config import SweepConfig, baseline_values, check_workers
from attnkit.sweep.folder import SweepFolder, read_manifest, write_manifest
from attnkit.sweep.study import ATTR, Context, create_study, load_study, own_running, requeue_dead
from attnkit.sweep.worker import work
from attnkit.training.deadline import Deadline


class SweepInterrupted(RuntimeError):
    """A sweep stopped by Ctrl-C or SIGTERM; ``run_dir`` is where ``resume_sweep`` continues it."""

    def __init__(self, message: str, run_dir: Path, signum: int):
        super().__init__(message)
        self.run_dir, self.signum = run_dir, signum


def check_settings(config: SweepConfig) -> tuple[str, dict]:
    """The storage URL and the baseline's values (before calibration: its warmup a placeholder), after every check
    that needs no writing: the storage's scheme and driver, the workers, the space can be built around the
    baseline."""
    url = config.storage or stores.default_url(Path(config.run_dir))
    stores.check_url(url)
    check_workers(config.workers)
    values = baseline_values(config, warmup=1)  # every preset builds its baseline (8 heads divide each width)
    spaces.check_buildable(config.space, config.preset, {k: v for k, v in values.items() if k not in config.space},
                           config.seq_len)
    return url, values


def run_sweep(config: SweepConfig, *, log=print, spent_s: float = 0.0, clock=time.monotonic) -> dict:
    """Run a new sweep into ``config.run_dir``; returns the summary (also in ``summary.json``)."""
    deadline = Deadline(60.0 * config.minutes, clock, spent_s=spent_s) if config.minutes is not None else None
    url, values = check_settings(config)
    folder = Path(config.run_dir)
    lock = SweepFolder(folder, log=log)
    lock.check_fresh(config.overwrite)  # before the storage is opened or anything is trained
    lock.acquire()
    try:
        lock.check_fresh(config.overwrite)
        if config.overwrite:
            lock.set_aside()
        storage = stores.open_storage(url, config.heartbeat_s)
        threads = check_workers(config.workers)
        if config.workers == 1:  # the sweep's own process trains: with torch's threads (OMP_NUM_THREADS sets them)
            import torch

            threads = torch.get_num_threads()
        plan = first_plan(folder, config, values, deadline, threads, log)
        values["warmup"] = plan.warmup
        if config.space == spaces.default_space(config.preset):  # the default space searches warmup at this scale
            config.space["warmup"] = spaces.Choices(tuple(sorted({max(1, round(f * plan.expected_steps))
                                                                  for f in (0.02, 0.1, 0.25)})))
        sweep_id = uuid.uuid4().hex
        name = config.study or f"{folder.resolve().name}-{sweep_id[:8]}"
        record = {"sweep_id": sweep_id, "config": config.to_dict(), "baseline": values, "plan": plan.to_dict(),
                  "host": socket.gethostname(), "folder": str(folder.resolve())}
        study = create_study(storage, name, config, plan, record)
        write_manifest(folder, {"role": "creator", "sweep_id": sweep_id, "study": name,
                                "storage": None if config.storage is None else stores.masked(url),
                                "config": config.to_dict(), "finished_trial": False})
        ctx = Context(folder, config, study, storage, sweep_id, values, log=log)
        say_where(ctx, url)
        ctx.planner = Planner(deadline, ctx)
        return run_to_end(ctx, lock, url)
    finally:
        lock.release()


def say_where(ctx: Context, url: str) -> None:
    plan = ctx.plan
    length = f"{plan.trial_seconds:.0f} s" if plan.trial_seconds else f"{plan.trial_steps} steps"
    ctx.log(f"sweep: study {ctx.study.study_name!r} in {stores.masked(url)}: {plan.trials} trials (the baseline "
            f"first) of {length} each (~{plan.expected_steps} steps, evaluated every {plan.eval_every}), "
            f"{ctx.config.workers} worker(s), then {plan.seeds} seeds each of the best and the baseline")
    if ctx.config.storage is not None:
        ctx.log(f"sweep: more machines join with study={ctx.study.study_name!r} and the same storage (join=True)")
    ctx.log(f"sweep: watch it with: optuna-dashboard {stores.masked(url)}   (pip install optuna-dashboard)")


def open_context(folder: Path, url: str | None, log=print, workers: int | None = None) -> Context:
    """The context of the sweep recorded in ``folder`` (its storage: ``url``, else the one it recorded)."""
    manifest = read_manifest(folder)
    if manifest is None:
        raise AttnkitValueError(f"resume={str(folder)!r} holds no sweep (no sweep.json of attnkit sweep); pass the "
                                "folder a sweep was started in (run_dir=).")
    url = url or (manifest["storage"] if manifest["storage"] is not None else stores.default_url(folder))
    if "***" in url:
        raise AttnkitValueError(f"the sweep in {str(folder)!r} uses storage={url!r}, whose password is not kept; "
                                "pass storage= again with the password.")
    storage = stores.open_storage(url, manifest["config"]["heartbeat_s"])
    study = load_study(storage, manifest["study"])
    record = study.user_attrs[ATTR]
    config = SweepConfig.from_dict({**record["config"], **({"workers": workers} if workers else {})})
    return Context(folder, config, study, storage, manifest["sweep_id"], record["baseline"], log=log)


def resume_sweep(run_dir: str | Path, *, storage: str | None = None, workers: int | None = None, log=print) -> dict:
    """Continue the sweep in ``run_dir`` (see the module docstring); returns its summary."""
    folder = Path(run_dir)
    if read_manifest(folder) is None:
        open_context(folder, storage)  # the typed error naming the folder
    lock = SweepFolder(folder, log=log).acquire()
    try:
        manifest = read_manifest(folder)
        url = storage or (manifest["storage"] if manifest["storage"] is not None else stores.default_url(folder))
        ctx = open_context(folder, url, log=log, workers=workers)
        check_workers(ctx.config.workers)
        for trial in own_running(ctx):  # this folder's lock is held: whoever ran them is gone
            if requeue_dead(ctx, trial):
                log(f"sweep: trial #{trial.number} was interrupted (its process is gone): enqueued again, resuming "
                    f"from its checkpoint where it has one")
        ctx.planner = Planner(None, ctx)
        if manifest.get("role") == "joined":
            return run_joined(ctx, lock)
        return run_to_end(ctx, lock, url)
    finally:
        lock.release()


def join_sweep(run_dir: str | Path, *, storage: str, study: str, workers: int = 1, log=print) -> dict:
    """Add ``workers`` processes of this machine to the sweep ``study`` in ``storage`` (a server every machine
    reaches); their trials' run folders go into ``run_dir``. The machine that started the sweep writes the verdict."""
    stores.check_url(storage)
    check_workers(workers)
    folder = Path(run_dir)
    lock = SweepFolder(folder, log=log)
    lock.check_fresh(False)
    lock.acquire()
    try:
        db = stores.open_storage(storage)
        found = load_study(db, study)
        sweep_id = uuid.uuid4().hex
        write_manifest(folder, {"role": "joined", "sweep_id": sweep_id, "study": study, "storage": stores.masked(storage),
                                "config": {**found.user_attrs[ATTR]["config"], "workers": workers},
                                "finished_trial": False})
        ctx = open_context(folder, storage, log=log, workers=workers)
        ctx.planner = Planner(None, ctx)
        return run_joined(ctx, lock)
    finally:
        lock.release()


def run_joined(ctx: Context, lock: SweepFolder) -> dict:
    run_workers(ctx, lock, ctx.storage.url)
    mine = [t.number for t in ctx.study.get_trials(deepcopy=False) if str(t.user_attrs.get("owner", "")).startswith(
        ctx.sweep_id + ":")]
    ctx.log(f"sweep: this machine trained trials {mine}; the machine that started the sweep writes its verdict")
    return {"study": ctx.study.study_name, "trials": mine}


def run_to_end(ctx: Context, lock: SweepFolder, url: str) -> dict:
    """The workers until the plan is done, then the verdict and the summary."""
    from attnkit.sweep.summary import write_summary
    from attnkit.sweep.verdict import run_verdict

    run_workers(ctx, lock, url)
    verdict = run_verdict(ctx)
    return write_summary(ctx, verdict)


def run_workers(ctx: Context, lock: SweepFolder, url: str) -> None:
    """This machine's workers: the sweep's own process (``workers=1``) or worker processes it supervises."""
    from attnkit.sweep.parallel import supervise
    from attnkit.training.interrupt import TrainingInterrupted

    def after(summary: dict) -> None:
        if summary["state"] in ("COMPLETE", "PRUNED"):
            mark_finished(ctx, lock)
        if ctx.planner is not None:
            ctx.planner.update()
        ctx.log(progress_line(ctx, summary))

    try:
        if ctx.config.workers == 1:
            work(ctx, after=after)
        else:
            supervise(ctx, url, after=after)
    except TrainingInterrupted as exc:
        raise SweepInterrupted(f"stopped by a signal during trial {exc.run_dir.name}: it is enqueued again and "
                               f"resumes from {exc.checkpoint}", ctx.folder, exc.signum) from exc


def mark_finished(ctx: Context, lock: SweepFolder) -> None:
    """The first finished trial: what an ``overwrite`` set aside can go (the manifest says so for a later start)."""
    manifest = read_manifest(ctx.folder)
    if manifest is not None and not manifest.get("finished_trial"):
        write_manifest(ctx.folder, {**{k: v for k, v in manifest.items() if k != "format"}, "finished_trial": True})
        lock.committed()


def progress_line(ctx: Context, summary: dict, who: str = "sweep") -> str:
    """One line per finished trial: its number, outcome, value, time and configuration; the best so far; the ETA."""
    from attnkit.sweep.study import counts, finished

    trials = ctx.study.get_trials(deepcopy=False)
    done = sum(finished(t) for t in trials)
    values = [(t.value, t.number) for t in trials if t.state == TrialState.COMPLETE]
    best = f"best {min(values)[0]:.3f} (#{min(values)[1]})" if values else "no value yet"
    left = max(0, ctx.plan.trials - done)
    seconds = [t.user_attrs.get("seconds", 0.0) for t in trials if counts(t) and "seconds" in t.user_attrs]
    mean = sum(seconds) / max(1, len(seconds))
    runs_left = -(-left // max(1, ctx.config.workers)) + 2 * ctx.plan.seeds
    eta = ctx.planner.eta_s(runs_left, mean) if ctx.planner is not None else runs_left * mean
    value = f"val_loss {summary['value']:.3f}" if summary["value"] is not None else summary["outcome"]
    knobs = spaces.knobs_text(summary["config"], ctx.config.space)
    role = " (baseline)" if summary["role"] == "baseline" else ""
    return (f"{who}: trial #{summary['number']}{role} {summary['state'].lower()}: {value} in {summary['seconds']:.0f} s "
            f"[{knobs or 'baseline'}] | {done}/{ctx.plan.trials} done, {best} | ETA {_minutes(eta)}")


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


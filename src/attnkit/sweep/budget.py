"""The sweep's time budget: a calibration run, the first plan, and the re-plan as trials finish.

The budget is the trainer's own machinery (:class:`attnkit.training.deadline.Deadline`) with trials as its steps:
every trial gets the same seconds (so trials compare at equal compute), and the number of trials that fit is
re-planned after each finished trial from the time the trials have really taken (a pruned trial frees time, a
busier machine takes it), keeping back the verdict's re-runs and the summary. A resumed sweep keeps the trial count
its plan last recorded, as a resumed run keeps its step count.

Before the first trial a 3-step calibration run of the baseline (``SWEEP/calibration``, an ordinary run) measures
the pace of a step and picks the precision (``precision="auto"``: the trainer's own measurement) for every trial.
"""

from __future__ import annotations

import time
from pathlib import Path

from attnkit.runs import read_metrics
from attnkit.runs.read import METRICS
from attnkit.sweep import space as spaces
from attnkit.sweep.config import REPORT_S, Plan, SweepConfig, make_plan, trial_seconds
from attnkit.sweep.study import Context, finished, set_plan
from attnkit.training import TrainConfig, train
from attnkit.training.deadline import Deadline

CALIBRATION = "calibration"
CALIBRATION_STEPS = 3


def calibrate(folder: Path, config: SweepConfig, values: dict, log) -> tuple[float, float, str]:
    """``(steps per second, seconds of a run's start, precision)`` from a short run of the baseline ``values``."""
    run_dir = folder / CALIBRATION
    settings = TrainConfig(run_dir=str(run_dir), preset=config.preset, model=spaces.model_overrides(values),
                           data=config.data, seq_len=config.seq_len, batch_size=config.batch_size,
                           eval_batches=1, precision=config.precision, device=config.device, seed=config.seed,
                           steps=CALIBRATION_STEPS, eval_every=CALIBRATION_STEPS, warmup=1, keep=1, progress=False,
                           overwrite=True, **{k: v for k, v in spaces.train_overrides(values).items() if k != "warmup"})
    start = time.monotonic()
    result = train(settings, log=lambda *a, **k: None)
    wall = time.monotonic() - start
    records = [r for r in read_metrics(run_dir / METRICS) if "tok_per_s" in r]
    tokens_per_step = records[-1]["tokens"] / records[-1]["step"]
    pace = records[-1]["tok_per_s"] / tokens_per_step
    overhead = max(0.0, wall - CALIBRATION_STEPS / pace)
    log(f"sweep: calibration ({CALIBRATION_STEPS} steps of the baseline): {1 / pace:.2f} s/step, {overhead:.1f} s to "
        f"start the run (data, model{', precision probe' if config.precision == 'auto' else ''}), precision "
        f"{result.precision}")
    return pace, overhead, result.precision


def first_plan(folder: Path, config: SweepConfig, values: dict, deadline: Deadline | None, threads: int, log) -> Plan:
    """The plan of a new sweep: calibrated when it has a time budget or must choose its precision."""
    pace, precision = None, config.precision
    if deadline is not None:
        trial_seconds(deadline.left(), config)  # a budget too small for the plan is refused before calibrating
    if deadline is not None or config.precision == "auto":
        pace, _, precision = calibrate(folder, config, values, log)
    seconds = trial_seconds(deadline.left(), config) if deadline is not None else None
    # a trial's own start (data, model; the precision is decided here once) takes ~a tenth of a short budget
    plan = make_plan(config, pace, None if seconds is None else 0.9 * seconds, precision, threads)
    plan.trial_seconds = seconds
    return plan


class Planner:
    """Re-plans a time budget's trial count after each finished trial (the creating process only)."""

    def __init__(self, deadline: Deadline | None, ctx: Context):
        self.deadline, self.ctx, self.seen = deadline, ctx, 0
        if deadline is not None:
            deadline.start_loop(0)

    def closing_s(self, plan: Plan) -> float:
        return 2 * plan.seeds * (plan.trial_seconds or 0.0) + REPORT_S

    def update(self) -> None:
        if self.deadline is None or self.ctx.config.grid or self.ctx.plan.exhausted:
            return
        done = sum(finished(t) for t in self.ctx.study.get_trials(deepcopy=False))
        if done == self.seen:
            return
        self.seen = done
        plan = self.ctx.plan
        planned = self.deadline.replan(done, plan.trials, self.closing_s(plan))
        if planned != plan.trials:
            plan.replans.append([done, plan.trials, planned])
            plan.trials = planned
            set_plan(self.ctx.study, plan)

    def eta_s(self, runs_left: int, mean_s: float) -> float:
        """Seconds to the sweep's end: the deadline's, or ``runs_left`` more runs of ``mean_s``."""
        if self.deadline is not None:
            return max(0.0, self.deadline.left())
        return runs_left * mean_s

    def summary(self, plan: Plan) -> dict | None:
        if self.deadline is None:
            return None
        return {**self.deadline.summary(plan.replans[0][1] if plan.replans else plan.trials, self.seen),
                "unit": "trials"}

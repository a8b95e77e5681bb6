"""A sweep's settings, its baseline and its plan.

:class:`SweepConfig` holds what the user asks for (checked here, before anything is written). The **baseline** is
the standard configuration scaled to the budget: the preset's width, depth, positions and learning rate (the size
that trains in a trial's budget) with the Transformer's usual 8 heads, plain multi-head attention, no window and no
dropout, and a warmup of a tenth of the trial (the tutorial's question is exactly whether those 8 heads and that
full attention are needed: the baseline is what it questions). The **plan** is how many trials, of what length:
each trial gets the same time (``minutes`` for the whole sweep, split over the trials and the verdict's re-runs) or
the same number of steps (``trial_steps``).
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field

from attnkit._checks import integer, number, positive_int
from attnkit.errors import AttnkitValueError
from attnkit.models.builders import PRESETS
from attnkit.sweep import space as spaces
from attnkit.training.config import RUN_DEFAULTS

#: the standard configuration's attention: the Transformer's 8 heads (Vaswani et al. 2017), full attention
STANDARD = {"heads": 8, "kv_heads": "heads", "positions": None, "window": "none", "dropout": 0.0}
#: share of a trial's steps that warm the learning rate up (Transformer recipes: a few percent of a long run; a
#: short trial needs a larger share to settle before the cosine decays)
WARMUP_SHARE = 0.1
#: evaluations per trial: the validation curve the pruner reads
EVALS_PER_TRIAL = 5
#: seconds kept back at the end of a time budget for the summary and its figure
REPORT_S = 15.0


@dataclass
class SweepConfig:
    """What a sweep searches and how long it may take (see docs/sweep.md).

    ``space``: knob -> values (``attnkit.sweep.space``), None = the preset's default space. ``minutes``: the whole
    sweep's time budget (trials, the verdict's re-runs and the summary), or ``trial_steps``: every trial runs that
    many steps. ``trials``: how many, the baseline included (a time budget re-plans the count as trials finish).
    ``seeds``: re-runs of the best configuration and of the baseline for the verdict. ``workers``: processes on this
    machine sharing the study; ``storage``: a database URL other machines can join (default: a SQLite file in the
    sweep folder). ``grid``: try every combination of the choices instead of Optuna's TPE sampler. ``prune``:
    Optuna's median pruner on each trial's validation curve. The rest are the trainer's settings for every trial.
    """

    run_dir: str = "runs/sweep"
    preset: str = "tiny"
    space: dict | None = None
    minutes: float | None = None
    trials: int = 12
    trial_steps: int | None = None
    seeds: int = 3
    workers: int = 1
    storage: str | None = None
    study: str | None = None
    grid: bool = False
    prune: bool = True
    data: str | None = None
    seq_len: int | None = None
    batch_size: int = 16
    eval_batches: int = 4
    precision: str = "auto"
    device: str = "auto"
    seed: int = 0
    overwrite: bool = False
    heartbeat_s: int = 10

    def __post_init__(self):
        if self.preset not in PRESETS:
            raise AttnkitValueError(f"preset={self.preset!r} is not a preset; choose one of {sorted(PRESETS)}.")
        self.space = spaces.default_space(self.preset) if self.space is None else spaces.normalised(self.space)
        if not self.space:
            raise AttnkitValueError("an empty space= names no knob: a sweep needs at least one, e.g. space='heads=1,2,4'.")
        for name in ("trials", "workers", "batch_size", "eval_batches", "heartbeat_s"):
            positive_int(getattr(self, name), name)
        integer(self.seeds, "seeds", low=0, fix="re-runs of the best and the baseline for the verdict (0 = no "
                "verdict); e.g. seeds=3.")
        if (self.minutes is None) == (self.trial_steps is None):
            raise AttnkitValueError("give either minutes= (the whole sweep's time budget) or trial_steps= (steps per "
                                    f"trial), not {'both' if self.minutes is not None else 'neither'}; e.g. minutes=10.")
        if self.minutes is not None:
            number(self.minutes, "minutes", low=0, low_open=True, fix="the sweep's time budget in minutes; e.g. "
                   "minutes=10.")
        if self.trial_steps is not None:
            positive_int(self.trial_steps, "trial_steps")
        if self.trials < 2:
            raise AttnkitValueError(f"trials={self.trials} leaves no trial beside the baseline; pass trials=2 or more.")
        if self.grid and any(isinstance(e, spaces.Range) for e in self.space.values()):
            raise AttnkitValueError(f"grid=True needs lists of values, and space='{spaces.describe(self.space)}' has "
                                    "a range; give each knob a list (e.g. lr=1e-3,3e-3).")
        if self.grid:  # every combination once, and the baseline: the budget is planned for exactly these
            self.trials = math.prod(len(e.values) for e in self.space.values()) + 1

    def to_dict(self) -> dict:
        data = asdict(self)
        data["space"] = spaces.to_json(self.space)
        return data

    @classmethod
    def from_dict(cls, data: dict) -> SweepConfig:
        return cls(**{**data, "space": {n: v for n, v in data["space"].items()}})


def check_workers(workers: int) -> int:
    """``workers`` processes fit this machine (each trains with its own threads); the threads each gets."""
    cpus = os.cpu_count() or 1
    if workers > cpus:
        raise AttnkitValueError(f"workers={workers} is more than this machine's {cpus} CPUs: each worker trains with "
                                f"its own threads; pass workers={cpus} or fewer (more machines join through storage=).")
    return max(1, cpus // workers)


def baseline_values(config: SweepConfig, warmup: int) -> dict:
    """The baseline trial's knob values: the preset's size with the standard attention (:data:`STANDARD`)."""
    p = PRESETS[config.preset]
    values = {**STANDARD, "width": p["embed_dim"], "layers": p["num_layers"],
              "positions": p.get("positions", "rope"), "lr": RUN_DEFAULTS["lr"], "warmup": warmup}
    if "head_dim" in config.space:  # the width follows the heads: the preset's width at 8 heads
        values["head_dim"] = p["embed_dim"] // values["heads"]
        del values["width"]
    return values


@dataclass
class Plan:
    """How the sweep spends its budget: ``trials`` (the baseline included) of ``trial_seconds`` each (a time budget)
    or ``trial_steps`` each, evaluated every ``eval_every`` steps, the baseline warming up over ``warmup`` steps,
    each worker training with ``threads`` threads in ``precision``. ``replans`` lists ``[after trials, old, new]``."""

    trials: int
    trial_seconds: float | None
    trial_steps: int | None
    expected_steps: int
    eval_every: int
    warmup: int
    precision: str
    threads: int
    seeds: int
    replans: list = field(default_factory=list)
    exhausted: str = ""  # why the search ended before the plan (a small space exhausted), when it did

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Plan:
        return cls(**data)


def trial_seconds(left_s: float, config: SweepConfig) -> float:
    """Seconds each trial (and each verdict re-run) gets from ``left_s`` seconds: the trials run ``workers`` at a
    time, the verdict's ``2 x seeds`` re-runs one at a time, and :data:`REPORT_S` is kept for the summary."""
    runs = math.ceil(config.trials / config.workers) + 2 * config.seeds
    seconds = (left_s - REPORT_S) / runs
    if seconds < 5.0:
        raise AttnkitValueError(
            f"minutes={config.minutes:g} leaves {max(seconds, 0):.1f} s for each of {config.trials} trials and "
            f"{2 * config.seeds} verdict re-runs ({2 * config.seeds} = 2 x seeds={config.seeds}); a trial needs at "
            "least 5 s to train: pass a larger minutes=, fewer trials= or fewer seeds=.")
    return seconds


def make_plan(config: SweepConfig, steps_per_s: float | None, seconds: float | None, precision: str,
              threads: int) -> Plan:
    """The plan from a measured pace (``steps_per_s`` of the baseline, None with ``trial_steps``)."""
    expected = config.trial_steps or max(1, int(steps_per_s * seconds))
    return Plan(trials=config.trials, trial_seconds=seconds, trial_steps=config.trial_steps, expected_steps=expected,
                eval_every=max(1, round(expected / EVALS_PER_TRIAL)), warmup=max(1, round(WARMUP_SHARE * expected)),
                precision=precision, threads=threads, seeds=config.seeds)

"""A time budget that holds: the step count of a ``time_budget`` run, re-planned from measured step times.

The first plan comes from a probe step before training (one forward + backward: it misses the optimizer,
evaluations, checkpoints and a machine that gets busier). After every optimizer step :meth:`Deadline.replan`
projects, from the time the loop has really taken per step so far (evaluations and checkpoints included), how many
steps fit before the deadline, keeping back the measured cost of what follows the last step (its validation pass,
its checkpoint, the closing sample): the plan is cut as soon as it would overrun and extended when it has clearly
(``slack``) been too cautious. The cosine schedule's end moves with the plan, so the learning rate still decays to
its minimum at the step the run really ends.

The clock is injected (``clock()`` -> seconds), so the rule is tested on a fake clock. In a multi-process run only
rank 0's plan counts: the caller broadcasts it (:func:`attnkit.training.dist.from_rank0`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

#: a measured step this many times the probe's estimate (or less than 1 / this) is "far off", and said
FAR_OFF = 2.0


def load_average() -> tuple[float, int]:
    """``(1-minute load average, CPUs this process may use)``; the load is NaN where the OS has none."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = float("nan")
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return load, cpus


class Deadline:
    """``budget_s`` seconds from construction, of which ``spent_s`` were already spent (the command's start-up
    before the trainer was built). :meth:`start_loop` marks the first step; :meth:`replan` after each
    step returns the step count to run; :attr:`changes` lists ``(at_step, old_plan, new_plan)``.

    >>> deadline = Deadline(180.0)            # --minutes 3
    >>> deadline.start_loop(0)
    >>> total = deadline.replan(step=1, planned=81, closing_s=4.0)   # after each step"""

    def __init__(self, budget_s: float, clock: Callable[[], float] = time.monotonic, slack: float = 0.05,
                 spent_s: float = 0.0):
        self.budget_s, self.clock, self.slack = budget_s, clock, slack
        self.start = clock() - spent_s
        self.loop_start, self.loop_step = None, 0
        self.changes: list[tuple[int, int, int]] = []
        self.probe_s: float | None = None  # the probe's seconds per step (evaluations included), see planned()
        self.load_at_start = load_average()

    def elapsed(self) -> float:
        return self.clock() - self.start

    def left(self) -> float:
        """Seconds left before the deadline (negative once it has passed)."""
        return self.budget_s - self.elapsed()

    def start_loop(self, step: int) -> None:
        """The loop starts at ``step`` (steps done before it, e.g. by a resumed run, are not timed)."""
        self.loop_start, self.loop_step = self.clock(), step

    def replan(self, step: int, planned: int, closing_s: float) -> int:
        """The step count to run, ``step`` steps done of ``planned``, when finishing (the last step's evaluation,
        checkpoint, sample) costs ``closing_s`` seconds: at least ``step`` (stop now), else every step that fits."""
        done = step - self.loop_step
        if self.loop_start is None or done < 1:
            return planned
        per_step = (self.clock() - self.loop_start) / done
        if per_step <= 0:  # no time measured yet (a coarse clock)
            return planned
        fits = step + max(0, int((self.left() - closing_s) / per_step))
        if fits < planned or fits > planned * (1 + self.slack):
            self.changes.append((step, planned, fits))
            return fits
        return planned

    def planned(self, probe_s: float) -> None:
        """The probe's estimate of one step (seconds, evaluations included) that the first plan came from."""
        self.probe_s = probe_s

    def step_s(self, step: int) -> float | None:
        """Seconds per step the loop has really taken (evaluations and checkpoints included), None before one."""
        done = step - self.loop_step
        return None if self.loop_start is None or done < 1 else (self.clock() - self.loop_start) / done

    def busy_note(self, name: str = "time_budget") -> str | None:
        """A line for the start of a run when the machine is busy (a load above its CPUs): its steps are slower
        than on a quiet machine, so the budget trains fewer of them. ``name``: the setting, as the user names it."""
        load, cpus = self.load_at_start
        if not load > cpus:
            return None
        return (f"note: this machine is busy (1-minute load {load:.1f} on {cpus} CPUs): each step takes longer than "
                f"on a quiet machine, so {name} trains fewer steps (and a less trained model) than it would there")

    def short_note(self, step: int, first_plan: int) -> str | None:
        """Why a time-budget run is short, when it is: its measured step time far off the probe's estimate (the
        machine got busier or quieter while it ran), or a busy machine; None when neither."""
        per_step, (load, cpus) = self.step_s(step), load_average()
        if per_step is None or self.probe_s is None or self.probe_s <= 0:
            return None
        ratio = per_step / self.probe_s
        busy = [f"{when} {value:.1f}" for when, value in (("at the start", self.load_at_start[0]), ("at the end", load))
                if value > cpus]
        if 1 / FAR_OFF < ratio < FAR_OFF and not busy:
            return None
        why = (f"the steps took {ratio:.1f}x the probe's estimate ({per_step:.3g} s against {self.probe_s:.3g} s per "
               "step)" if not 1 / FAR_OFF < ratio < FAR_OFF else f"the steps took {per_step:.3g} s each")
        load_words = (f"; the machine was busy (1-minute load {', '.join(busy)} on {cpus} CPUs)" if busy else
                      "; the machine was not busy at the start or the end, so something ran in between" if ratio > 1
                      else "")
        return (f"note: {step} steps ran where the probe planned {first_plan}: {why}{load_words}. The same budget "
                "on a quiet machine trains more steps; compare runs by their steps and validation loss, not their "
                "minutes")

    def summary(self, first_plan: int, ran: int) -> dict:
        """What config.json records about the budget: the first plan, every change, the steps run and the time."""
        return {"seconds": self.budget_s, "first_plan": first_plan, "ran": ran, "elapsed_s": round(self.elapsed(), 1),
                "replans": len(self.changes), "last_replan": list(self.changes[-1]) if self.changes else None}

    def pace(self, step: int) -> dict:
        """What a training run records of its pace: the probe's and the measured seconds per step, the load at the
        start (None where the OS has none) and the CPUs."""
        per_step, (load, cpus) = self.step_s(step), self.load_at_start
        return {"probe_step_s": self.probe_s, "step_s": None if per_step is None else round(per_step, 4),
                "load_at_start": load if load == load else None, "cpus": cpus}

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

import time
from collections.abc import Callable


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

    def summary(self, first_plan: int, ran: int) -> dict:
        """What config.json records about the budget: the first plan, every change, the steps run and the time."""
        return {"seconds": self.budget_s, "first_plan": first_plan, "ran": ran, "elapsed_s": round(self.elapsed(), 1),
                "replans": len(self.changes), "last_replan": list(self.changes[-1]) if self.changes else None}

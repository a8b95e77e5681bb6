"""A time budget that holds: the step count re-planned from measured step times, on an injected clock."""

import json

import pytest
from train_helpers import small_config

from attnkit.training import train
from attnkit.training.deadline import Deadline


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("step_s", [0.5, 2.0, 3.5])  # the probe said 2.16 s per step (issue 23: 3.5 s measured)
def test_replan_ends_within_one_step_of_the_deadline(step_s):
    clock, budget, closing = FakeClock(), 180.0, 4.0
    deadline = Deadline(budget, clock)
    clock.now = 10.0  # data loading and the probe
    planned, step = int((budget - 10.0) / 2.16), 0  # the probe's plan
    deadline.start_loop(0)
    while step < planned:
        clock.now += step_s
        step += 1
        planned = deadline.replan(step, planned, closing)
    clock.now += closing
    assert budget - step_s - closing <= clock.now <= budget, (step, clock.now)  # ended at the deadline, not before
    assert (step != int(170 / 2.16)) == bool(deadline.changes)


def test_replan_stops_at_once_when_the_deadline_has_passed():
    clock = FakeClock()
    deadline = Deadline(60.0, clock)
    deadline.start_loop(0)
    clock.now = 70.0
    assert deadline.replan(1, 100, 0.0) == 1 and deadline.changes == [(1, 100, 1)]


def test_replan_keeps_the_plan_within_its_slack():
    clock = FakeClock()
    deadline = Deadline(100.0, clock, slack=0.05)
    deadline.start_loop(0)
    clock.now = 1.0
    assert deadline.replan(1, 97, 0.0) == 97  # 100 fit: within 5% above the plan, the schedule is left alone
    assert deadline.replan(1, 90, 0.0) == 100 and deadline.replan(1, 110, 0.0) == 100


def test_a_time_budget_run_ends_at_the_deadline_and_config_json_says_what_ran(tmp_path):
    """A run whose steps take 5 s on the injected clock (the probe measured milliseconds, so its first plan is
    far too long) stops within one step of a 60 s budget, with its final evaluation and checkpoint, and
    config.json records the steps planned and run (no unused default step count)."""
    clock = FakeClock()

    def slow_step(trainer, record):  # every optimizer step costs 5 s on the run's clock
        clock.now += 5.0

    result = train(small_config(tmp_path, time_budget=60.0, steps=None, ckpt_every=1000), log=lambda *a: None,
                   hooks=[slow_step], clock=clock)
    assert 60.0 - 2 * 5.0 <= clock.now <= 60.0 + 5.0, (result.step, clock.now)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["train"]["steps"] == saved["total_steps"] == saved["time_budget"]["ran"] == result.step
    assert saved["time_budget"]["first_plan"] > result.step and saved["time_budget"]["replans"] >= 1
    assert result.val_loss is not None and (tmp_path / "checkpoints" / f"step_{result.step:08d}").is_dir()


def test_every_rank_follows_rank_0s_plan(tmp_path, monkeypatch):
    """Under torchrun each rank measures its own step times; the loop runs the plan rank 0 sends (here: 7 steps,
    where this process's own clock would plan about 12), so the ranks end at the same step."""
    from attnkit.training import dist

    asked = []
    monkeypatch.setattr(dist, "from_rank0", lambda value, ctx: (asked.append(value), 7)[1]
                        if isinstance(value, int) else value)
    clock = FakeClock()

    def slow_step(trainer, record):
        clock.now += 5.0

    result = train(small_config(tmp_path, time_budget=60.0, steps=None, ckpt_every=1000), log=lambda *a: None,
                   hooks=[slow_step], clock=clock)
    assert result.step == 7 and len(asked) == 7 and min(asked) > 7  # its own plans asked for, rank 0's followed


def _slow_run(tmp_path, monkeypatch, load, step_s=5.0):
    """A 60 s budget whose steps take ``step_s`` on the injected clock (the probe measured milliseconds), on a
    machine whose 1-minute load is ``load`` on 2 CPUs; returns what the run said."""
    from attnkit.training import deadline as deadline_module

    monkeypatch.setattr(deadline_module, "load_average", lambda: (load, 2))
    clock, said = FakeClock(), []

    def slow_step(trainer, record):
        clock.now += step_s

    train(small_config(tmp_path, time_budget=60.0, steps=None, ckpt_every=1000), log=said.append,
          hooks=[slow_step], clock=clock)
    return said, json.loads((tmp_path / "config.json").read_text())["time_budget"]


def test_a_short_run_says_why_it_is_short(tmp_path, monkeypatch):
    """Issue 31.4: a --minutes run whose steps take far longer than the probe's estimate says so at its end (the
    steps it ran against the first plan, how much slower, whether the machine was busy)."""
    said, budget = _slow_run(tmp_path, monkeypatch, load=0.5)
    notes = [line for line in said if line.startswith("note: ")]
    assert len(notes) == 1, said
    assert f"{budget['ran']} steps ran where the probe planned {budget['first_plan']}: the steps took" in notes[0]
    assert "x the probe's estimate" in notes[0] and "not busy at the start or the end" in notes[0]
    assert budget["step_s"] > 10 * budget["probe_step_s"] and budget["cpus"] == 2


def test_a_busy_machine_is_said_at_the_start_and_the_end(tmp_path, monkeypatch):
    said, _ = _slow_run(tmp_path / "busy", monkeypatch, load=6.5)
    busy = [line for line in said if "this machine is busy (1-minute load 6.5 on 2 CPUs)" in line]
    assert len(busy) == 1 and "time_budget trains fewer steps" in busy[0]
    assert any("the machine was busy (1-minute load at the start 6.5, at the end 6.5 on 2 CPUs)" in line
               for line in said), said


def test_a_run_at_the_probes_pace_says_nothing(tmp_path, monkeypatch):
    from attnkit.training import deadline as deadline_module

    monkeypatch.setattr(deadline_module, "load_average", lambda: (0.5, 2))
    deadline = Deadline(60.0, FakeClock())
    deadline.planned(2.0)
    deadline.start_loop(0)
    deadline.clock.now = 10 * 2.5  # 10 steps at 2.5 s: within 2x of the probe
    assert deadline.short_note(10, 12) is None and deadline.busy_note() is None
    deadline.clock.now = 10 * 4.5
    assert "the steps took 2.2x the probe's estimate" in deadline.short_note(10, 12)

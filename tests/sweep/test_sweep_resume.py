"""Nothing lost: a sweep killed with SIGKILL mid-trial continues with --resume; every finished trial kept, the
interrupted one marked and completed from its checkpoint, the same number of trials as an uninterrupted sweep."""

from __future__ import annotations

from helpers import CLI_SMALL, counted_finished, kill, load, quiet, running_with_checkpoint, sweep_cli, wait_for
from optuna.trial import TrialState

from attnkit.sweep import resume_sweep

PLAN = ["--trial-steps", "160", "--trials", "3", "--seeds", "0"]  # a checkpoint every 32 steps


def stopped_mid_trial(folder, stop):
    """Start a sweep in ``folder``, ``stop(proc)`` it while a searched trial runs past its first checkpoint; returns
    ``(process, the trial, its stderr, {number: value} of the trials complete before)``."""
    proc = sweep_cli("--run-dir", str(folder), *CLI_SMALL, *PLAN)
    try:
        wait_for(lambda: running_with_checkpoint(folder) is not None, proc=proc, what="a searched trial's checkpoint")
        victim = running_with_checkpoint(folder)
        before = {t.number: t.value for t in load(folder).get_trials(states=(TrialState.COMPLETE,))}
        stop(proc)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc, victim, err, before


def test_kill_9_mid_trial_then_resume_keeps_every_trial_and_completes_the_interrupted_one(tmp_path):
    folder = tmp_path / "sweep"
    proc, victim, _, before = stopped_mid_trial(folder, lambda p: kill(p.pid))
    assert proc.returncode == -9
    assert load(folder).trials[victim.number].state == TrialState.RUNNING  # what the kill left

    summary = resume_sweep(folder, log=quiet)

    trials = load(folder).get_trials()
    interrupted = trials[victim.number]
    assert interrupted.state == TrialState.FAIL and interrupted.user_attrs["outcome"].startswith("interrupted")
    retries = [t for t in trials if t.system_attrs.get("failed_trial") == victim.number]
    assert len(retries) == 1, "the interrupted trial is enqueued once"
    retry = retries[0]
    assert retry.state in (TrialState.COMPLETE, TrialState.PRUNED) and retry.user_attrs["resumed"] is True
    assert retry.user_attrs["run_dir"] == victim.user_attrs["run_dir"]  # continued in its own run folder
    assert retry.params == victim.params
    for number, value in before.items():  # every trial finished before the kill kept, as it was
        assert trials[number].state == TrialState.COMPLETE and trials[number].value == value
    assert len(counted_finished(trials)) == 3  # = the plan, as an uninterrupted sweep of the same plan
    assert [r["number"] for r in summary["trials"]] == [t.number for t in trials]


def test_sigterm_mid_trial_checkpoints_it_enqueues_it_again_and_prints_the_resume_command(tmp_path):
    folder = tmp_path / "sweep"
    proc, victim, err, _ = stopped_mid_trial(folder, lambda p: p.terminate())
    assert proc.returncode == 128 + 15, err
    assert f"resume with: attnkit sweep --resume {folder}" in err and "stopped by a signal during trial" in err
    trials = load(folder).get_trials()
    assert trials[victim.number].state == TrialState.FAIL
    assert trials[victim.number].user_attrs["outcome"].startswith("interrupted: stopped by a signal after step")
    assert [t.state for t in trials if t.system_attrs.get("failed_trial") == victim.number] == [TrialState.WAITING]
